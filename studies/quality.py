"""The case-quality study through the serving path: can a user trust the case score and the review flag the bundle
serves, in distribution, under a site shift and on another data set's images?

For every method and seed the run is trained (or reused, :func:`studies.runs.train`) and recalibrated by the
bundle's own ``calibrate`` command (:func:`studies.runs.calibrate`: its recalibration, cross-fitted validated range
and conformal rule, as a user gets them). Every image is then segmented by :class:`~calib_monai.bundle.TrainedBundle`
on the bundle's ``inference.json``, the chain ``monai.bundle run inferring`` and MONAI Label run (preprocessing,
inferer, recalibration, ``CaseQualityd``): the test images as they are, each simulated site shift of
:mod:`calib_monai.data.site_shift` at each strength (applied to the raw image file, written once as NIfTI beside the
runs), and another data set's test images. Each volume gets its true mean DSC from the served segmentation against
its label (structures absent from both left out, as the estimate leaves them out) beside the served case score, the
flag (True, False or None: cannot judge), its reasons and each signal's standardised distance; in distribution also
whether each structure's true volume lies in the served volume interval. :mod:`studies.quality_report` turns the
records into the tables.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch
from monai.transforms import MapLabelValue

from calib_monai.bundle import TrainedBundle, locate_bundle, read_bundle_config
from calib_monai.data.site_shift import SITE_SHIFT_KINDS, SITE_SHIFT_STRENGTHS, apply_site_shift
from calib_monai.metrics import label_map_dice
from calib_monai.review.validated_range import voxel_volume_ml
from studies.quality_report import ID, write_quality_results
from studies.runs import calibrate
from studies.study import StudySetup

__all__ = ["ID", "label_mapping", "quality_study", "read_label", "shifted_items", "served_record"]


def _test_items(
    setup: StudySetup, dataset: str, dataset_dir: str, overrides: Mapping[str, Any]
) -> tuple[list[dict], dict[int, int]]:
    """The test items (``image``, ``label`` paths) of ``dataset``, listed by its own bundle's data component, and
    the map from the label files' values to its classes (its ``MapLabelValued`` step; empty: the same values)."""
    demo = ("demo.json",) if setup.demo and dataset == setup.dataset else ()  # the images the runs were trained on
    parser = read_bundle_config(
        locate_bundle(f"ce_dice_{dataset}"),
        ("train.json", *demo),
        {"dataset_dir": dataset_dir, "output_dir": str(Path(setup.runs_dir) / ".lists" / dataset), **overrides},
    )
    return [dict(item) for item in parser.get_parsed_content("data").datalist()["test"]], label_mapping(parser)


def label_mapping(parser) -> dict[int, int]:
    """The map from the label files' values to the classes of a bundle's ``train.json`` parser (its validation
    chain's ``MapLabelValued`` step; empty: the same values)."""
    mapping = {}
    for step in parser.get("train#deterministic_transforms", []):  # the validation chain's steps
        if isinstance(step, dict) and step.get("_target_") == "MapLabelValued":
            mapping = {int(o): int(t) for o, t in zip(step["orig_labels"], step["target_labels"])}
    return mapping


def read_label(path: str, mapping: Mapping[int, int]) -> np.ndarray:
    """The label file's classes (its values mapped as the bundle maps them)."""
    raw = np.asarray(nib.load(path).dataobj).round().astype(np.int64)
    return MapLabelValue(list(mapping), list(mapping.values()), dtype=np.int64)(raw) if mapping else raw


def shifted_items(items: Sequence[Mapping], kind: str, strength: str, folder: str | os.PathLike) -> list[dict]:
    """``items`` with each image replaced by its copy under the site shift ``kind`` at ``strength`` (seeded by the
    item's index), written once to ``folder`` as NIfTI with the original's affine (labels unchanged)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for index, item in enumerate(items):
        source = item["image"]
        if not isinstance(source, (str, os.PathLike)):
            raise ValueError(f"site shifts need one image file per case, got {source!r} (a multi-file image)")
        target = folder / Path(source).name
        if not target.is_file():
            image = nib.load(os.fspath(source))
            x = torch.as_tensor(np.asarray(image.dataobj, dtype=np.float32))
            shifted = apply_site_shift(x[None] if x.ndim == 3 else x.movedim(-1, 0), kind, strength, seed=index)
            array = shifted[0] if x.ndim == 3 else shifted.movedim(0, -1)
            partial = target.with_name(f".{target.name}.partial.nii.gz")
            nib.save(nib.Nifti1Image(array.numpy(), image.affine, image.header), os.fspath(partial))
            os.replace(partial, target)  # a stopped study never leaves half a file under the final name
        out.append({**item, "image": os.fspath(target)})
    return out


def _true_dice(segmentation: torch.Tensor, label: np.ndarray, num_classes: int) -> float:
    """Mean DSC of the served segmentation against the label (classes absent from the label left out: NaN)."""
    label = torch.as_tensor(label)
    prediction = torch.as_tensor(segmentation).as_subclass(torch.Tensor).reshape(label.shape)
    return float(label_map_dice(prediction, label, num_classes).nanmean())


def _volume_coverage(quality: Mapping, label: np.ndarray, voxel_ml: float) -> float:
    """The share of structures whose true volume lies in the served volume interval."""
    inside = []
    for c, entry in enumerate(quality["classes"].values(), start=1):
        true = float((label == c).sum()) * voxel_ml
        inside.append(entry["volume_low"] <= true <= entry["volume_high"])
    return float(np.mean(inside)) if inside else float("nan")


def served_record(
    bundle: TrainedBundle,
    item: Mapping,
    key: Mapping[str, Any],
    coverage: bool = False,
    mapping: Mapping[int, int] | None = None,
) -> dict:
    """One volume through the serving path: the served case score, flag, reasons and signals beside the truth
    (``mapping``: the label files' values to the classes)."""
    tick = time.perf_counter()
    prediction = bundle.predict(item["image"])
    seconds = time.perf_counter() - tick
    quality = prediction.quality or {}
    review = quality.get("review", {})
    flag = review.get("flag")
    case = Path(str(item["image"])).name.split(".")[0]
    record = {
        **key,
        "case": case,
        "subject": str(item.get("subject", case)),  # the exchangeable unit of the flag's bound (a patient)
        "est_mean_dice": quality.get("case_score", float("nan")),
        # before the level (the validation volumes' or the site's mean error) was subtracted: site labels re-anchor it
        "raw_case_score": (quality.get("level") or {}).get("raw_case_score", quality.get("case_score", float("nan"))),
        "mean_confidence": quality.get("mean_confidence", float("nan")),
        "flag": float("nan") if flag is None else float(bool(flag)),
        "reasons": "; ".join(review.get("reasons", [])),
        **{f"z_{name}": signal.get("beyond") for name, signal in review.get("signals", {}).items()},
        # each signal's own rank among the n + 1 volumes (1: beyond every validation volume): its histogram tests the
        # signal's exchangeability, and the site monitor bets on it
        **{f"rank_{name}": signal.get("rank") for name, signal in review.get("signals", {}).items()},
        # the case's rank among the m + 1 subjects: the flag at any other alpha is rank <= floor(alpha (m + 1))
        "rank": review.get("rank"),
        "validation_subjects": review.get("validation_subjects"),
        "validation_volumes": review.get("validation_volumes"),
        "seconds": round(seconds, 3),
    }
    if item.get("label"):
        label = read_label(item["label"], mapping or {})
        record["mean_dice"] = _true_dice(prediction.segmentation, label, bundle.num_classes)
        if coverage and quality:
            # the segmentation is on the input's grid and carries its affine: no second read of the image
            record["volume_covered"] = _volume_coverage(quality, label, voxel_volume_ml(prediction.segmentation))
    return record


def _serving_bundle(setup: StudySetup, method: str, models: Path) -> TrainedBundle:
    """The run's weights and recalibration on the bundle's ``inference.json``, with the run's preprocessing
    settings (the overrides that ``inference.json`` has; the training-only ones are left out)."""
    bundle_dir = locate_bundle(f"{method}_{setup.dataset}")
    known = read_bundle_config(bundle_dir, ("inference.json",), {}).get()
    overrides = {k: v for k, v in setup.run_overrides().items() if k.split("#")[0] in known}
    overrides["output_dir"] = str(models.parent / "inference")
    return TrainedBundle(bundle_dir, ("inference.json",), overrides, device="cpu", weights=models / "model.pt")


def quality_study(
    setup: StudySetup,
    methods: Sequence[str] = ("ce_dice", "nacl", "sl1ace"),
    seeds: Sequence[int] = (0, 1),
    other_dataset: str = "",
    other_dir: str = "",
    other_overrides: Mapping[str, Any] | None = None,
    shifts: Sequence[str] = SITE_SHIFT_KINDS,
    strengths: Sequence[str] = ("mild", "strong"),
    command: str = "",
    calibrate_settings: Mapping[str, Any] | None = None,
) -> str:
    """Train (or reuse) and ``calibrate`` ``methods`` x ``seeds``, serve the test images, each of ``shifts`` at each
    of ``strengths`` and ``other_dataset``'s test images; write ``<results_dir>/quality`` (tables, per-volume
    records and the README with the command). ``calibrate_settings``: the ``calibrate`` step's own settings."""
    methods = setup.check_methods(methods)
    seeds = [int(s) for s in ([seeds] if isinstance(seeds, int) else seeds)]
    unknown = [s for s in strengths if s not in SITE_SHIFT_STRENGTHS] + [k for k in shifts if k not in SITE_SHIFT_KINDS]
    if unknown:
        raise ValueError(
            f"unknown shifts or strengths {unknown}: choose from {SITE_SHIFT_KINDS} x {SITE_SHIFT_STRENGTHS}"
        )
    out = setup.study_dir("quality")
    overrides = {k: v for k, v in setup.run_overrides().items() if k.startswith("data#")}
    test, mapping = _test_items(setup, setup.dataset, setup.dataset_dir, overrides)
    conditions: list[tuple[str, str, list[dict]]] = [(ID, "", test)]
    inputs = Path(setup.runs_dir) / "inputs"
    conditions += [(k, s, shifted_items(test, k, s, inputs / f"{k}_{s}")) for k in shifts for s in strengths]
    if other_dataset:
        other = _test_items(setup, other_dataset, other_dir, other_overrides or {})[0]
        conditions.append((f"{other_dataset} images", "", [{"image": i["image"]} for i in other]))
    records, specs, ranges = [], [], []
    for method in methods:
        for seed in seeds:
            seeded = setup.seeded(seed)
            spec = seeded.spec(method)
            specs.append(spec)
            seeded.trained(method)
            models = calibrate(spec, calibrate_settings)
            served_test = [item["image"] for item in json.loads((models / "datalist.json").read_text())["test"]]
            if sorted(served_test) != sorted(item["image"] for item in test):
                raise ValueError(
                    f"{models / 'datalist.json'} tests other volumes than the study lists: pass --split_seed so every "
                    "seed trains on one split, or a fresh --runs_dir"
                )
            bundle = _serving_bundle(seeded, method, models)
            ranges.append({"method": method, "seed": seed, **_range_facts(models / "validated_range.json")})
            for condition, strength, items in conditions:
                key = {"seed": seed, "method": method, "condition": condition, "strength": strength}
                records += [served_record(bundle, item, key, condition == ID, mapping) for item in items]
    return write_quality_results(setup, out, records, ranges, specs, seeds, methods, other_dataset, command)


def _range_facts(path: Path) -> dict[str, Any]:
    """What the served rule states: n volumes of m subjects, k, its bound, alpha, the signals, the volume-interval
    factor, warnings."""
    record = json.loads(path.read_text())
    return {
        "n": len(record["scores"]),
        "m": len(set(record.get("subjects") or [])) or len(record["scores"]),
        "k": record["rank"],
        "bound": record["bound"],
        "draw_bound": record.get("draw_bound"),  # below it for 90% of validation draws
        "alpha": record["alpha"],
        "signals": "+".join(record.get("signals", [])),
        "volume_interval_scale": record.get("volume_interval_scale"),
        "split": record.get("info", {}).get("split", {}).get("rule", ""),
        "warnings": "; ".join(record.get("warnings", [])),
    }
