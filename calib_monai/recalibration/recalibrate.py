"""Recalibrate from validation volumes, as a plain function: split them, fit the recalibration (cross-fitted), score
the validated range with the fits that did not see each volume, and publish the calibration and its range next to
the weights as one set. The bundle's ``calibrate`` step (``calib_monai.handlers.RecalibrationFitter``) collects the
volumes from its evaluator and calls :func:`recalibrate`; a script with its own volumes calls it directly."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from calib_monai.defaults import CALIBRATION_SPLIT, VOLUME_COVERAGE
from calib_monai.recalibration.fitting import ValidationVolume, cross_fit, measure_validated_range, split_volumes
from calib_monai.recalibration.settings import RecalibrationSettings
from calib_monai.recalibration.splits import subject_names
from calib_monai.recalibration.stored import publish_calibration
from calib_monai.review.contours import ContourMargins, volume_requirements
from calib_monai.review.reasons import describe_bar
from calib_monai.review.signals import signal_bar
from calib_monai.review.validated_range import ValidatedRange

__all__ = ["describe_fit", "exact_scheme_hint", "recalibrate"]

logger = logging.getLogger("calib_monai")


def recalibrate(
    volumes: Sequence[ValidationVolume],
    output_path: str | os.PathLike,
    weights: str | os.PathLike,
    settings: RecalibrationSettings | None = None,
    spatial_dim: int = 2,
    validated_range_path: str | os.PathLike | None = None,
    class_names: Sequence[str] | None = None,
    features: Sequence[Any] | None = None,
    references: tuple | Callable[[], tuple] = (None, None),
    features_left_out: str = "",
) -> tuple[nn.Module, dict[str, Any], ValidatedRange | None]:
    """Fit the recalibration of ``weights`` on ``volumes`` and publish it at ``output_path`` (with the validated range
    at ``validated_range_path``); returns ``(module, fit statistics, range or None)``.

    Args:
        settings: what to fit, which volumes fit and which measure (cross-fitting and its folds, or the split), the
            fit's budget and seed, and the review rule (None: the defaults); the manifest records them.
        spatial_dim: the slice axis of the 2D network.
        features: each volume's pooled network features (None: the feature signal has none).
        references: the training images' ``(image statistics, pooled features)``, the fixed references of the
            input and feature signals (None each: the validation volumes measure each other), or a function that
            measures them, called once the fit is done and only when a range is stored.
        features_left_out: why the feature signal has no features, when asked for and not given.
    """
    settings = RecalibrationSettings() if settings is None else settings
    review, record = settings.review, {**settings.record(), "spatial_dim": spatial_dim}
    subjects = [v.subject for v in volumes]
    split_of = split_volumes(len(volumes), settings.split, settings.seed, settings.crossfit, subjects, settings.folds)
    if split_of.in_sample:
        logger.warning(
            f"calibrate: {split_of.rule}; the validated range is measured on the volumes that fitted the "
            "recalibration (in-sample: its flags are too lenient); use more validation volumes"
        )
    module, stats, scorers = cross_fit(volumes, split_of, settings, spatial_dim)
    Path(output_path).parent.mkdir(parents=True, exist_ok=True)
    if validated_range_path is None:
        publish_calibration(module, output_path, weights, settings=record, **stats)
        logger.info(f"calibrate: {describe_fit(module, stats)}; wrote {output_path}")
        return module, stats, None
    logger.info(f"calibrate: {describe_fit(module, stats)}; wrote {output_path}")
    references = references() if callable(references) else references
    calibration = {"method": settings.method}
    if settings.method == "temperature":
        calibration["temperature"] = float(module.temperature)
    required: dict[int, dict] = {}  # each scored volume's contour requirements, as it is scored

    def on_scored(i: int, prob, label) -> None:
        required[i] = volume_requirements(prob, label, settings.contours["epsilon"], class_names)

    validated = measure_validated_range(
        scorers,
        volumes,
        split_of,
        review,
        class_names,
        spatial_dim,
        features,
        *references,
        on_scored=on_scored,
        calibration=calibration,
        fitted_on=stats["fitted_on"],
    )
    if review["feature_check"] and features is None:
        validated.info["features_left_out"] = features_left_out or "no network features were collected"
    validated.info["flag_bar"] = signal_bar(validated)
    folds = [scorer for scorer, _ in scorers] if split_of.crossfit else []  # they score a served case too
    margins = _contour_margins(volumes, required, settings.contours, validated)
    publish_calibration(  # calibration, its range, contours and models/manifest.json: one set (bundle.manifest)
        module, output_path, weights, validated, validated_range_path, settings=record, fold_modules=folds,
        contours=margins, **stats,
    )  # fmt: skip
    _log_contours(margins)
    _log_range(validated, split_of.crossfit, validated_range_path)
    if split_of.crossfit and validated.rank >= 1:
        logger.info(f"calibrate: {exact_scheme_hint(validated, settings.split)}")
    return module, stats, validated


def _contour_margins(
    volumes: Sequence[ValidationVolume], required: dict[int, dict], contours: dict[str, Any], validated: ValidatedRange
) -> ContourMargins:
    chosen = sorted(required)
    subjects = [volumes[i].subject for i in chosen]
    subjects = subject_names(subjects) if any(subjects) else [f"volume {i}" for i in chosen]
    return ContourMargins.from_validation(
        [required[i] for i in chosen], subjects, **contours, scored_on=validated.scored_on, scored_volumes=len(chosen),
        crossfit=bool(validated.info["split"].get("crossfit")),
    )  # fmt: skip


def _log_contours(margins: ContourMargins) -> None:
    for name, entry in margins.classes.items():
        if entry.get("lambda_out") is None:
            logger.warning(f"calibrate: contours: {entry['reason']}")
        else:
            logger.info(
                f"calibrate: contours of {name}: lambda_out {entry['lambda_out']:.4g}, lambda_in "
                f"{entry['lambda_in']:.4g} over {entry['subjects']} validation subjects ({margins.risk}, alpha "
                f"{margins.alpha:g}, epsilon {margins.epsilon:g})"
            )


def _log_range(validated: ValidatedRange, crossfit: bool, path: str | os.PathLike) -> None:
    finite = [s for s in validated.scores if s == s] or [float("nan")]
    scheme = "cross-fitted" if crossfit else "held out from the fit"
    logger.info(
        f"calibrate: validated range of {validated.n} validation volumes ({scheme}; scored on the "
        f"{validated.scored_on}; case score {min(finite):.3f}-{max(finite):.3f}; signals {validated.signals}); "
        f"inference will {validated.describe()}; wrote {path}"
    )
    for warning in validated.warnings:
        logger.warning(f"calibrate: validated range: {warning}")
    bar = validated.info.get("flag_bar")
    if bar:
        logger.info(f"calibrate: {describe_bar(bar, validated.signals)}")
    error = validated.info.get("case_score_error", {})
    if error.get("volumes"):
        logger.info(
            f"calibrate: case score minus the true mean DSC of the segmentation on the {validated.scored_on}, over the "
            f"{error['volumes']} scored validation volumes: {error['mean']:+.3f} on average, {error['lowest']:+.3f} to "
            f"{error['highest']:+.3f}, {error['mean_absolute']:.3f} mean absolute (info.case_score_error; the served "
            "case score subtracts their mean until the site has labels, and its lower bound, case_score_low, comes "
            "from them)"
        )
    interval = validated.info.get("volume_interval", {})
    if validated.volume_interval_scale is not None:
        logger.info(
            f"calibrate: volume interval widened {validated.volume_interval_scale:.3g}x to hold the true volume "
            f"with probability {interval.get('coverage', VOLUME_COVERAGE):.0%} (conformal over {interval.get('pairs')} "
            "validation (volume, class) pairs)"
        )
    else:
        logger.warning(f"calibrate: volume interval: {interval.get('note', 'not fitted')} (independent voxels)")


def exact_scheme_hint(validated: ValidatedRange, split: float = CALIBRATION_SPLIT) -> str:
    """What a cross-fitted range's bound is and how to make it exact: a held-out split, with the fewest validation
    subjects whose range still reaches ``k >= 1`` at the rule's alpha."""
    needed, total = validated.volumes_needed, 2
    while len(split_volumes(total, split).range) < needed:  # the range split_volumes leaves
        total += 1
    unit = "subjects" if validated.m < validated.n else "volumes"
    return (
        f"the bound {validated.bound:.1%} is approximate: the range is scored by the cross-fitted folds (a case's "
        "score is compared as each fold scores it) and a case is served by the recalibration fitted on all "
        f"{validated.m} {unit} (the gap is measured in docs/results/acdc_val20); "
        f"--calibration_crossfit false scores both with one fit, which makes it exact and needs at least {total} "
        f"validation {unit} at alpha {validated.alpha:g} (calibration_split {split:g})"
    )


def describe_fit(module: nn.Module, stats: dict) -> str:
    """The log line of a fit: what, on how many volumes, and the held-out numbers (the in-sample ones without)."""
    what = f"temperature {float(module.temperature):.4f}" if hasattr(module, "temperature") else "local temperature"
    line = (
        f"{what} fitted on {stats['volumes']} validation volumes ({stats['voxels']} voxels; {stats['split']['rule']})"
    )
    for prefix, name in (
        ("heldout_slices", "held-out slices"),
        ("range_volumes", "range volumes (each by a fit that did not see it)"),
    ):
        if f"{prefix}_nll_before" in stats:
            line += (
                f"; {name}: NLL {stats[prefix + '_nll_before']:.4f} -> {stats[prefix + '_nll_after']:.4f}, ECE "
                f"(ground-truth foreground) {stats[prefix + '_ece_before']:.4f} -> {stats[prefix + '_ece_after']:.4f}"
            )
    if "best_step" in stats:
        line += f" (early stopping: step {stats['best_step']} of {stats['steps']})"
    if stats["split"]["in_sample"]:
        line += (
            f"; in-sample only: NLL {stats['in_sample_nll_before']:.4f} -> {stats['in_sample_nll_after']:.4f}, ECE "
            f"{stats['in_sample_ece_before']:.4f} -> {stats['in_sample_ece_after']:.4f}"
        )
    return line
