"""The contour study's pictures: one served case's contours over its image, and the test cases' coverage against
alpha.

Coverage against alpha needs each test case's own requirement (the largest ``lambda_out`` at which its outer contour
still holds ``1 - epsilon`` of the truth, the smallest ``lambda_in`` at which its inner contour lies ``1 - epsilon``
inside it). It is measured here on the calibrated probabilities the served chain makes (the bundle's network and
inferer, then ``CalibrateLogitsd`` with the run's recalibration), on the network's grid, against the label
reoriented as the image is. The lambdas at each alpha come from the validation subjects' requirements that
``calibrate`` stored in ``contours.json``, by the rank ``ContourMargins`` uses, so no alpha needs a new calibrate.
Where the two grids are one (Hippocampus keeps its 1 mm voxels), at the served alpha the outer counts equal those of
the served contours (``per_case.csv.gz``). An inner contour counts only if it lies inside at every lambda from
``lambda_in`` on (the monotone loss the guarantee is stated for), so the inner counts can fall a case or two short of
the served ones (2 of 50 in one run).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch
from monai.transforms import LoadImage, MapLabelValue, Orientation

from calib_monai.bundle import TrainedBundle, locate_bundle
from calib_monai.defaults import CONTOUR_ALPHA
from calib_monai.recalibration import CalibrateLogitsd
from calib_monai.review.conformal import flag_rank
from calib_monai.review.contours import volume_requirements
from studies.figures import contour_slices, coverage_curves
from studies.margin_summary import binomial_interval
from studies.margins import case_name, run_label_mapping, served_settings
from studies.quality import read_label
from studies.runs import RECORD
from studies.study import write_csv

__all__ = ["coverage_at", "margin_figures", "test_requirements"]


def coverage_at(contours: Mapping[str, Any], tests: Sequence[Mapping[str, Any]], alpha: float) -> dict[str, Any]:
    """Per structure of ``contours`` (the stored record), the lambdas at ``alpha`` from its subjects' stored
    requirements, and how many of ``tests`` (``{structure: {"outer", "inner"} or None}``, one per test case) hold:
    ``{name: {"lambda_out", "lambda_in", "outer", "inner", "cases"}}``; None where ``alpha`` needs more subjects."""
    out = {}
    for name, entry in contours["classes"].items():
        required_out, required_in = entry["required_out"], entry["required_in"]
        m = len(required_out)
        j = flag_rank(alpha, m)
        if j < 1:
            out[name] = None
            continue
        lam_out, lam_in = sorted(required_out)[j - 1], sorted(required_in)[m - j]
        needs = [t[name] for t in tests if t.get(name) is not None]
        out[name] = {
            "lambda_out": lam_out,
            "lambda_in": lam_in,
            "outer": sum(n["outer"] >= lam_out for n in needs),  # holds while lambda_out is at most its own
            "inner": sum(n["inner"] <= lam_in for n in needs),  # lies inside from its own lambda_in on
            "cases": len(needs),
        }
    return out


def test_requirements(
    bundle: str,
    models: Path,
    items: Sequence[Mapping[str, Any]],
    overrides: Mapping[str, Any],
    epsilon: float,
    mapping: Mapping[int, int],
) -> list[dict[str, Any]]:
    """Each test item's :func:`volume_requirements` at ``epsilon`` on the served calibrated probabilities (labels'
    values mapped to classes by ``mapping``, as the bundle maps them)."""
    trained = TrainedBundle(locate_bundle(bundle), overrides=dict(overrides), weights=models / "model.pt")
    calibrate = CalibrateLogitsd("pred", calibration=models, weights=models / "model.pt")
    names = ["background", *json.loads((models / "contours.json").read_text())["classes"]]
    loader, orient = (
        LoadImage(image_only=True, ensure_channel_first=True),
        Orientation(axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
    )
    out = []
    for item in items:
        data = trained.preprocess(item["image"])
        with torch.no_grad():
            logits = trained.inferer(data["image"][None].to(trained.device), trained.network)[0].float().cpu()
        prob = torch.softmax(calibrate({"pred": logits, "image": data["image"]})["pred"], dim=0)
        label = orient(loader(item["label"])).round().long()
        if mapping:
            label = MapLabelValue(list(mapping), list(mapping.values()), dtype=torch.int64)(label)
        if tuple(label.shape[1:]) != tuple(prob.shape[1:]):
            raise ValueError(
                f"{item['label']}: shape {tuple(label.shape[1:])} is not the network grid's {tuple(prob.shape[1:])}; "
                "coverage against alpha is measured only where the preprocessing does not resample"
            )
        needs = volume_requirements(prob, torch.as_tensor(label), epsilon, names)
        out.append({"case": case_name(item["image"]), **needs})
    return out


def _load(path: str | os.PathLike) -> np.ndarray:
    return np.asarray(nib.load(os.fspath(path)).dataobj)


def _median_excess_case(test: Sequence[Mapping], served: Path, mapping, classes: int) -> Mapping:
    """The test item whose served outer contours reach furthest outside its truth, at the median."""
    excess = []
    for item in test:
        truth = read_label(item["label"], mapping)
        outer = _load(served / f"{case_name(item['image'])}_outer.nii.gz") > 0
        excess.append(sum(int((outer[..., c - 1] & (truth != c)).sum()) for c in range(1, classes + 1)))
    return test[int(np.argsort(excess, kind="stable")[len(excess) // 2])]


def margin_figures(
    dataset: str,
    runs_dir: str,
    work_dir: str,
    results_dir: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    epsilon: float,
    alphas: Sequence[float],
) -> str:
    """For each run the contour study served (``<work_dir>/seed<s>/<method>_<dataset>/eps<epsilon>``): its test
    cases' coverage at each of ``alphas`` (``coverage_vs_alpha.png`` and ``.csv``); and the first run's test case of
    median outer excess over its image (``contours_case_eps<epsilon>.png``); in ``results_dir``. Serves nothing new."""
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, curves, first, served_alpha = [], {}, None, CONTOUR_ALPHA
    for method in methods:
        for seed in seeds:
            run = Path(runs_dir) / f"seed{int(seed)}" / f"{method}_{dataset}"
            record = json.loads((run / RECORD).read_text())
            work = Path(work_dir) / f"seed{int(seed)}" / f"{method}_{dataset}" / f"eps{epsilon}"
            contours = json.loads((work / "models" / "contours.json").read_text())
            served_alpha = contours["alpha"]
            test = json.loads((run / "models" / "datalist.json").read_text())["test"]
            first = first or (record, run, work, test, list(contours["classes"]))
            if not alphas:  # the picture only (a resampling bundle: see test_requirements)
                continue
            mapping = run_label_mapping(record, Path(work_dir) / ".lists")
            tests = test_requirements(
                record["bundle"], work / "models", test, served_settings(record), epsilon, mapping
            )
            points = []
            for alpha in alphas:
                got = coverage_at(contours, tests, float(alpha))
                key = {"method": method, "seed": int(seed), "epsilon": epsilon, "alpha": float(alpha)}
                rows += [{**key, "structure": name, **g} for name, g in got.items() if g is not None]
                for kind in ("outer", "inner"):
                    held = [g for g in got.values() if g is not None]
                    covered, cases = sum(g[kind] for g in held), sum(g["cases"] for g in held)
                    low, high = binomial_interval(covered, cases) if cases else (float("nan"), float("nan"))
                    point = {"alpha": float(alpha), "kind": kind, "covered": covered, "cases": cases}
                    points.append({**point, "low": low, "high": high})
            curves[f"{method} seed {seed}"] = points
    if rows:
        write_csv(out / "coverage_vs_alpha.csv", rows)
        coverage_curves(curves, served_alpha, out / "coverage_vs_alpha.png")
    if first is not None:
        record, run, work, test, names = first
        mapping = run_label_mapping(record, Path(work_dir) / ".lists")
        item = _median_excess_case(test, work / "out_test", mapping, len(names))
        case = case_name(item["image"])
        title = f"{run.parent.name}/{run.name}, test case {case}: alpha {served_alpha:g}, epsilon {epsilon:g}"
        image = _load(item["image"]).astype(np.float32)
        served = work / "out_test"
        masks = [_load(served / f"{case}_{kind}.nii.gz") for kind in ("seg", "inner", "outer")]
        label = read_label(item["label"], mapping)
        contour_slices(image, label, *masks, names, title, out / f"contours_case_eps{epsilon:g}.png")
    return str(out)
