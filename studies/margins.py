"""The contour study (issue 49): do the served inner and outer contours hold their per-case guarantee on the test
cases, and is the outer contour from calibrated probabilities tighter than the morphological margin of the same
guarantee (Mossina and Friedrich: the prediction dilated or eroded by ``d`` voxels, ``d`` chosen conformally)?

It trains nothing. For every finished run ``<runs_dir>/seed<s>/<method>_<dataset>`` it copies the weights and the
data list to a work folder, runs the bundle's own ``calibrate`` there with the run's recorded settings and the asked
``contour_epsilon`` (writing ``contours.json``), then the bundle's ``inferring`` on the run's test split (and on
each asked site shift of it) and on its validation split, as a user serves them. Each test case's served
``<case>_inner/_outer.nii.gz`` is compared with its label; the morphological margin's ``d`` is chosen on the served
segmentations of the same validation subjects (:mod:`calib_monai.review.morphological`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np

from calib_monai.bundle import locate_bundle, read_bundle_config
from calib_monai.review.contours import contour_losses
from calib_monai.review.morphological import choose_margin, morphological_contours, morphological_requirements
from studies.margin_summary import EXCESS_TARGET, report_lines
from studies.quality import label_mapping, read_label, shifted_items
from studies.runs import RECORD, RunSpec
from studies.study import write_csv

__all__ = [
    "case_name",
    "margins_study",
    "run_label_mapping",
    "served_settings",
    "structure_row",
]


def structure_row(
    truth: np.ndarray, inner: np.ndarray, outer: np.ndarray, epsilon: float, voxel_ml: float = 1.0
) -> dict[str, Any]:
    """One structure of one case (boolean masks): whether ``outer`` holds at least ``1 - epsilon`` of the truth and
    ``inner`` lies at least ``1 - epsilon`` inside it (an empty inner set does), the outer set's excess volume
    outside the truth and the inner set's missing part of it, and the true volume (``voxel_ml`` per voxel)."""
    truth, inner, outer = (np.asarray(a, bool) for a in (truth, inner, outer))
    held = contour_losses(truth, inner, outer, epsilon)
    return {
        "outer_holds": held["outer_holds"],
        "inner_inside": held["inner_inside"],
        "excess_ml": float((outer & ~truth).sum()) * voxel_ml,
        "missing_ml": float((truth & ~inner).sum()) * voxel_ml,
        "true_ml": int(truth.sum()) * voxel_ml,
    }


def _load(path: Path) -> np.ndarray:
    return np.asarray(nib.load(os.fspath(path)).dataobj)


def case_name(image: str) -> str:
    return Path(image).name.split(".")[0]


def _inputs(items: Sequence[Mapping], folder: Path) -> Path:
    """A folder of links to ``items``' images (``inferring`` reads every image of a folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in items:
        link = folder / Path(item["image"]).name
        if not link.exists():
            link.symlink_to(item["image"])
    return folder


def _call(command: list[str], log: Path) -> None:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(command)}\n")
        f.flush()
        code = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if code != 0:
        raise RuntimeError(f"{command[4]} failed (exit {code}): see {log}")


def _calibrated(record: Mapping, work: Path, models: Path, epsilon: float, alpha: float) -> Path:
    """``work/models``: the run's weights and data list, recalibrated by the bundle's ``calibrate`` with contours
    at ``epsilon`` and ``alpha`` (reused when its ``contours.json`` was made so)."""
    target = work / "models"
    contours = target / "contours.json"
    if contours.is_file():
        made = json.loads(contours.read_text())
        if made["epsilon"] == epsilon and made["alpha"] == alpha:
            return target
    target.mkdir(parents=True, exist_ok=True)
    for name in ("model.pt", "datalist.json"):
        shutil.copy2(models / name, target / name)
    spec = RunSpec(record["bundle"], work, dict(record["overrides"]), tuple(record.get("extra_configs", ())))
    extra = {"contour_epsilon": epsilon, "contour_alpha": alpha}
    _call(spec.command(run_id="calibrate", configs=("calibrate.json",), extra=extra), work / "calibrate.log")
    return target


def served_settings(record: Mapping) -> dict[str, Any]:
    """The run's recorded settings that its ``inference.json`` knows (its preprocessing), less ``dataset_dir``."""
    known = read_bundle_config(locate_bundle(record["bundle"]), ("inference.json",), {}).get()
    return {k: v for k, v in record["overrides"].items() if k.split("#")[0] in known and k != "dataset_dir"}


def run_label_mapping(record: Mapping, lists_dir: str | os.PathLike) -> dict[int, int]:
    """The map from the run's label files' values to its classes (``lists_dir``: where its data list may be made)."""
    overrides = {**record["overrides"], "output_dir": os.fspath(lists_dir)}
    return label_mapping(read_bundle_config(locate_bundle(record["bundle"]), ("train.json",), overrides))


def _served(record: Mapping, work: Path, items: Sequence[Mapping], name: str) -> Path:
    """``work/out_<name>``: ``items`` served by the bundle's ``inferring`` with the recalibration in ``work/models``
    and the run's preprocessing settings (reused when every case's contours are there)."""
    out = work / f"out_{name}"
    if all((out / f"{case_name(i['image'])}_outer.nii.gz").is_file() for i in items):
        return out
    bundle = record["bundle"]
    settings = served_settings(record)
    command = [sys.executable, "-m", "monai.bundle", "run", "inferring", "--config_file"]
    command += [os.fspath(Path(locate_bundle(bundle)) / "configs" / "inference.json"), "--bundle_root", str(work)]
    command += ["--model_path", str(work / "models" / "model.pt"), "--dataset_dir", str(_inputs(items, work / name))]
    command += ["--output_dir", str(out), "--site_dir", ""]
    for key, value in settings.items():
        command += [f"--{key}", value if isinstance(value, str) else repr(value)]
    _call(command, work / f"infer_{name}.log")
    return out


def _margins(
    served: Path, items: Sequence[Mapping], subjects: Sequence[str], names: Sequence[str], mapping, eps, alpha
) -> dict[str, tuple[Any, Any]]:
    """Each structure's morphological ``(d_out, d_in)`` chosen on the validation subjects' served segmentations
    (a subject requires its volumes' largest; structures absent from both prediction and truth left out)."""
    need: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for item, subject in zip(items, subjects):
        seg, truth = _load(served / f"{case_name(item['image'])}_seg.nii.gz"), read_label(item["label"], mapping)
        for c, name in enumerate(names, start=1):
            if (truth == c).any() or (seg == c).any():
                d = morphological_requirements(seg == c, truth == c, eps)
                old = need[name].get(subject, (0.0, 0.0))
                need[name][subject] = (max(old[0], d[0]), max(old[1], d[1]))
    return {
        n: tuple(choose_margin([r[i] for r in need[n].values()], alpha) for i in (0, 1))  # type: ignore[misc]
        for n in names
    }


def _records(served: Path, items, names, mapping, record, margins, key) -> list[dict[str, Any]]:
    """Per test case and structure: the served contours' and the morphological margin's :func:`structure_row`."""
    rows = []
    eps = record["epsilon"]
    for item in items:
        case = case_name(item["image"])
        label = nib.load(item["label"])
        voxel_ml = float(abs(np.linalg.det(label.affine[:3, :3]))) / 1000.0
        truth = read_label(item["label"], mapping)
        seg = _load(served / f"{case}_seg.nii.gz")
        inner, outer = _load(served / f"{case}_inner.nii.gz"), _load(served / f"{case}_outer.nii.gz")
        review = json.loads((served / f"{case}_quality.json").read_text()).get("review", {})
        for c, name in enumerate(names, start=1):
            entry, (d_out, d_in) = record["classes"][name], margins[name]
            row = {**key, "structure": name, "case": case, "flagged": review.get("flag") is True}
            row.update(m=entry.get("subjects"), lambda_out=entry.get("lambda_out"), lambda_in=entry.get("lambda_in"))
            row.update(d_out=d_out, d_in=d_in)
            row.update(structure_row(truth == c, inner[..., c - 1] > 0, outer[..., c - 1] > 0, eps, voxel_ml))
            if d_out is None or d_in is None:  # too few subjects, or beyond the largest margin: the whole image
                m_in, m_out = np.zeros_like(seg, bool), np.ones_like(seg, bool)
            else:
                m_in, m_out = morphological_contours(seg == c, int(d_out), int(d_in))
            morph = structure_row(truth == c, m_in, m_out, eps, voxel_ml)
            row.update({f"morph_{k}": v for k, v in morph.items() if k != "true_ml"})
            rows.append(row)
    return rows


def margins_study(
    dataset: str,
    runs_dir: str,
    results_dir: str,
    work_dir: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    epsilons: Sequence[float],
    alpha: float,
    shifts: Sequence[tuple[str, str]] = (),
    command: str = "",
) -> str:
    """Calibrate, serve and score every finished run ``<runs_dir>/seed<s>/<method>_<dataset>`` at each of
    ``epsilons`` (the test split as it is and under each ``(kind, strength)`` of ``shifts``); write the per-case
    records, the summary table and the README to ``<results_dir>``; return that folder."""
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    records, runs = [], []
    for method in methods:
        for seed in seeds:
            run = Path(runs_dir) / f"seed{int(seed)}" / f"{method}_{dataset}"
            record = json.loads((run / RECORD).read_text())
            mapping = run_label_mapping(record, Path(work_dir) / ".lists")
            split = json.loads((run / "models" / "datalist.json").read_text())
            validation, test = split["validation"], split["test"]
            first = None
            for eps in epsilons:
                work = Path(work_dir) / f"seed{int(seed)}" / f"{method}_{dataset}" / f"eps{eps}"
                models = _calibrated(record, work, run / "models", float(eps), float(alpha))
                contours = json.loads((models / "contours.json").read_text())
                subjects = json.loads((models / "validated_range.json").read_text()).get("subjects") or [
                    case_name(i["image"]) for i in validation
                ]
                first = first or _served(record, work, validation, "validation")  # one served segmentation per run
                names = list(contours["classes"])
                margins = _margins(first, validation, subjects, names, mapping, float(eps), float(alpha))
                conditions = [("test", test)]
                conditions += [(f"{k}_{s}", shifted_items(test, k, s, Path(work_dir) / f"{k}_{s}")) for k, s in shifts]
                for condition, items in conditions:
                    served = _served(record, work, items, condition)
                    key = {"method": method, "seed": int(seed), "epsilon": float(eps), "condition": condition}
                    records += _records(served, items, names, mapping, contours, margins, key)
                runs.append(f"{run} (budget {json.dumps(record['overrides'])}; epsilon {eps}: {work})")
    write_csv(out / "per_case.csv.gz", records)
    readme = [
        "# Contours with a per-case guarantee against the morphological margin (issue 49)",
        "",
        f"Command: `{command}`",
        "",
        f"alpha {alpha}; epsilon {', '.join(str(e) for e in epsilons)}. Nothing trained: each run's weights and data",
        "list were copied and recalibrated by the bundle's `calibrate` (its recorded settings), then served by its",
        "`inferring`. Runs (and their work folders):",
        "",
        *[f"- {r}" for r in runs],
        "",
        "Conditions: the test split"
        + (
            f" and under the site shifts {', '.join(f'{k} {s}' for k, s in shifts)}."
            if shifts
            else " only (no site shift asked: `--shifts`)."
        ),
        "",
        "Coverage: the share of test cases whose outer contour holds at least 1 - epsilon of the true structure",
        "(inner: lies at least 1 - epsilon inside it), with the 95% Clopper-Pearson interval; the target holds when",
        "1 - alpha is not above the interval. Excess: the outer set's mean volume outside the truth (mL per case);",
        f"the target is the contours' at least {EXCESS_TARGET:.0%} below the morphological margin's. d_out/d_in: the",
        "margin in voxels (6-connected steps) chosen on the same validation subjects' served segmentations; m: the",
        "validation subjects (each lambda and d is the floor(alpha (m + 1))-th most extreme of m: at m = 10 the most",
        "extreme subject's, so one badly segmented subject sets it). Missing: the inner set's mean volume short of the",
        "truth (mL per case); true_ml: the mean true volume; flagged: test cases the review flag served as outside",
        'what validation measured (their contours "not vouched for"; counted in the coverage all the same).',
        "",
        *report_lines(out, records, alpha),
    ]
    (out / "README.md").write_text("\n".join(readme) + "\n")
    return str(out)
