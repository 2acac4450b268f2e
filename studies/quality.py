"""The case-quality study: can a user trust the label-free estimate, and does the review flag catch what the model
was not validated on?

For every method and seed (one training each, reused from the run folders) and every recalibration fitted on the
validation volumes (none; temperature on ground-truth foreground voxels, the bundles' default; temperature on all
voxels; local temperature scaling), the test volumes are scored as they are, under the corruptions of
:mod:`studies.corruptions` at graded strengths, and the images of another data set are run through
the same model. Each volume gets its true mean DSC (where it has a label) and its label-free case quality
(:func:`calib_monai.metrics.case_quality`): the estimated mean DSC and the mean confidence of the predicted
foreground. The validated range of each configuration is measured on its validation volumes as the ``calibrate``
step measures it, and every volume is flagged by each review rule.

Per configuration: calibration (ECE on ground-truth foreground, over all voxels, in a band around the structures),
how well each case score ranks and predicts the true DSC on the in-distribution test volumes and on those plus the
corrupted ones (Spearman, MAE, AURC, the share of the random-to-oracle AURC gap closed), and the flag's false
positives (in-distribution) and true positives (per shift). The ensemble of the seeds (mean probabilities; its case
score also the mean DSC between the members' predictions) is the anchor's recommendation, measured with its cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from calib_monai.bundle import TrainedBundle, locate_bundle
from calib_monai.calibration import ValidatedRange
from calib_monai.calibration.validated_range import voxel_volume_ml
from calib_monai.metrics import SegmentationReportTable, case_quality, segmentation_metrics_per_volume
from calib_monai.metrics.case_quality import image_statistics
from calib_monai.metrics.report_table import voxel_spacing
from studies.corruptions import CORRUPTIONS, corruption
from studies.evaluation import EvaluatedVolume
from studies.posthoc import VolumeLocalTemperature, VolumeTemperature
from studies.quality_report import write_quality_results
from studies.study import StudySetup

__all__ = ["CALIBRATIONS", "REVIEW_RULES", "quality_study"]

CALIBRATIONS = ("none", "temperature", "temperature_all", "local_temperature")
#: review rules: name -> volume factor of ValidatedRange (0: the case score alone)
REVIEW_RULES = {"score": {}, "score_or_volume": {"volume_factor": 1.5}, "score_or_input": {"input_check": True}}
SCORES = ("est_mean_dice", "mean_confidence")


def _other_images(dataset: str, dataset_dir: str, overrides: Mapping[str, Any], runs_dir) -> list[str]:
    """The test images of another data set, listed by its own bundle's data component."""
    bundle = TrainedBundle(
        locate_bundle(f"ce_dice_{dataset}"),
        ("train.json",),
        {"dataset_dir": dataset_dir, "output_dir": str(runs_dir), **overrides},
        device="cpu",
    )
    items = bundle.get("data").datalist()["test"]
    return [item["image"] for item in items]


def _calibrators(validation: Sequence[EvaluatedVolume], seed: int, lts_steps: int) -> dict[str, Callable | None]:
    out: dict[str, Callable | None] = {
        "none": None,
        "temperature": VolumeTemperature(seed=seed).fit(validation),
        "temperature_all": VolumeTemperature(seed=seed, voxels="all").fit(validation),
    }
    if lts_steps > 0:
        out["local_temperature"] = VolumeLocalTemperature(steps=lts_steps, seed=seed).fit(validation)
    return out


def _probabilities(volume: EvaluatedVolume, calibrate: Callable | None) -> torch.Tensor:
    return torch.softmax(volume.logits, dim=0) if calibrate is None else calibrate(volume)


def _quality(volume: EvaluatedVolume, prob: torch.Tensor, names: Sequence[str]) -> dict[str, Any]:
    return case_quality(prob, voxel_volume=voxel_volume_ml(volume.image), class_names=names)


def _flags(quality: Mapping, image: torch.Tensor, ranges: Mapping[str, ValidatedRange]) -> dict[str, bool]:
    stats = image_statistics(image)
    return {f"flag_{rule}": bool(validated.check(quality, stats)["flag"]) for rule, validated in ranges.items()}


def _records(
    volumes: Sequence[EvaluatedVolume],
    calibrate: Callable | None,
    names: Sequence[str],
    label_names: dict[str, str],
    ranges: Mapping[str, ValidatedRange],
    key: dict,
    calibration_metrics: bool,
) -> list[dict]:
    """One record per volume: the truth (with a label) beside the label-free quality and the flags; the report's
    calibration and volume columns with ``calibration_metrics`` (the in-distribution volumes), else the DSC only."""
    table = SegmentationReportTable(label_names, surface_distances=False)
    out = []
    for volume in volumes:
        prob = _probabilities(volume, calibrate)
        quality = _quality(volume, prob, names)
        record = {
            **key,
            "case": volume.case,
            "est_mean_dice": quality["case_score"],
            "mean_confidence": quality["mean_confidence"],
            **_flags(quality, volume.image, ranges),
        }
        if volume.label is not None and calibration_metrics:
            row = table.add(prob, volume.label, spacing=voxel_spacing({"image": volume.image}), case=volume.case)
            record.update({c: row[c] for c in ("mean_dice", "ece", "ece_all", "ece_band")})
            record.update(_volume_errors(row, names[1:]))
        elif volume.label is not None:
            dice = segmentation_metrics_per_volume(
                prob.argmax(0)[None, None], volume.label[None], len(names), surface_distances=False
            )["dice"][0]
            record["mean_dice"] = float(np.nanmean(dice)) if np.isfinite(dice).any() else float("nan")
        out.append(record)
    return out


def _volume_errors(row: Mapping[str, float], classes: Sequence[str]) -> dict[str, float]:
    """Mean over the classes present of |expected volume - true| / true, for the summed probabilities and the
    prediction."""
    out = {}
    for kind in ("prob", "pred"):
        errors = [
            abs(row[f"volume_{kind}_{c}"] - row[f"volume_{c}"]) / row[f"volume_{c}"]
            for c in classes
            if row[f"volume_{c}"] > 0
        ]
        out[f"volume_error_{kind}"] = float(np.mean(errors)) if errors else float("nan")
    return out


def _ensemble_records(
    members: Sequence[list[torch.Tensor]], volumes: Sequence[EvaluatedVolume], names, label_names, key: dict
) -> list[dict]:
    """The seeds' mean probabilities per test volume: its truth and estimate, and the mean pairwise DSC between the
    members' predictions (Zenk et al.'s strongest case score)."""
    from calib_monai.metrics.case_quality import estimated_dice  # the members' agreement: est_dice of a one-hot

    table = SegmentationReportTable(label_names, surface_distances=False)
    out = []
    for i, volume in enumerate(volumes):
        probs = [m[i] for m in members]
        mean = torch.stack(probs).mean(0)
        quality = _quality(volume, mean, names)
        row = table.add(mean, volume.label, spacing=voxel_spacing({"image": volume.image}), case=volume.case)
        pairwise = []
        for a in range(len(probs)):
            for b in range(a + 1, len(probs)):
                onehot = torch.nn.functional.one_hot(probs[b].argmax(0), mean.shape[0]).movedim(-1, 0).double()
                pairwise.append(float(torch.nanmean(estimated_dice(onehot, probs[a].argmax(0)))))
        out.append(
            {
                **key,
                "case": volume.case,
                "est_mean_dice": quality["case_score"],
                "mean_confidence": quality["mean_confidence"],
                "pairwise_dice": float(np.mean(pairwise)),
                **{c: row[c] for c in ("mean_dice", "ece", "ece_all", "ece_band")},
            }
        )
    return out


def quality_study(
    setup: StudySetup,
    methods: Sequence[str] = ("ce_dice", "ls", "svls", "nacl", "crac"),
    seeds: Sequence[int] = (0, 1),
    other_dataset: str = "",
    other_dir: str = "",
    other_overrides: Mapping[str, Any] | None = None,
    lts_steps: int = 300,
    alpha: float = 0.05,
    corruptions: Mapping[str, Sequence[float]] = CORRUPTIONS,
    command: str = "",
) -> str:
    """Train (or reuse) ``methods`` x ``seeds``, score the test volumes, their corruptions and ``other_dataset``'s
    test images under every recalibration; write ``<results_dir>/quality`` (tables, figures, per-volume values and
    the README with the command). ``alpha``: the review rule's level (flag below the k-th lowest validation score);
    ``corruptions``: kind -> strengths (default :data:`~studies.corruptions.CORRUPTIONS`)."""
    methods = setup.check_methods(methods)
    seeds = [int(s) for s in ([seeds] if isinstance(seeds, int) else seeds)]
    out = setup.study_dir("quality")
    other = _other_images(other_dataset, other_dir, other_overrides or {}, out / ".other") if other_dataset else []
    records, ensemble, specs, timings = [], [], [], []
    for method in methods:
        kept: dict[str, list[list[torch.Tensor]]] = {}
        test_volumes: list[EvaluatedVolume] = []
        for seed in seeds:
            seeded = setup.seeded(seed)
            specs.append(seeded.spec(method))
            run = seeded.trained(method)
            names = [run.label_names[k] for k in sorted(run.label_names, key=int)]
            start = time.perf_counter()
            validation = list(run.volumes("validation"))
            calibrators = _calibrators(validation, seed, lts_steps)
            inputs = [image_statistics(v.image) for v in validation]
            ranges = {
                c: {
                    rule: ValidatedRange.from_qualities(
                        [_quality(v, _probabilities(v, f), names) for v in validation],
                        alpha=alpha,
                        inputs=inputs,
                        **options,
                    )
                    for rule, options in REVIEW_RULES.items()
                }
                for c, f in calibrators.items()
            }
            del validation
            conditions: list[tuple[str, float, Callable]] = [
                ("in-distribution", 0.0, lambda run=run: run.volumes("test"))
            ]
            conditions += [
                (kind, s, lambda k=kind, s=s, run=run: run.volumes("test", corrupt=corruption(k, s)))
                for kind, strengths in corruptions.items()
                for s in strengths
            ]
            if other:
                conditions.append((f"{other_dataset} images", 0.0, lambda run=run: run.foreign_volumes(other)))
            for condition, strength, volumes_of in conditions:
                tick = time.perf_counter()
                volumes = list(volumes_of())
                inference = time.perf_counter() - tick
                for calibration, calibrate in calibrators.items():
                    key = {
                        "seed": seed,
                        "method": method,
                        "calibration": calibration,
                        "condition": condition,
                        "strength": strength,
                    }
                    records += _records(
                        volumes,
                        calibrate,
                        names,
                        run.label_names,
                        ranges[calibration],
                        key,
                        condition == "in-distribution",
                    )
                    if condition == "in-distribution":
                        kept.setdefault(calibration, []).append([_probabilities(v, calibrate) for v in volumes])
                if condition == "in-distribution":
                    test_volumes = volumes
                    timings.append({"method": method, "seed": seed, "inference_s": inference, "volumes": len(volumes)})
            timings[-1]["total_s"] = time.perf_counter() - start
        if len(seeds) > 1:
            for calibration, members in kept.items():
                key = {
                    "seed": "ensemble",
                    "method": method,
                    "calibration": calibration,
                    "condition": "in-distribution",
                    "strength": 0.0,
                }
                ensemble += _ensemble_records(members, test_volumes, names, run.label_names, key)
    return write_quality_results(
        setup, out, records, ensemble, timings, specs, seeds, methods, alpha, other_dataset, command, list(REVIEW_RULES)
    )
