"""Fitting a recalibration and measuring the validated range (the bundles' ``calibrate`` step,
:class:`calib_monai.handlers.RecalibrationFitter`, calls them on the validation volumes).

The range's volumes are scored by a recalibration they did not fit (:func:`split_volumes`): with cross-fitting each
fold by the fit on the others, all volumes in the range, the served recalibration fitted on all and a served case
also scored by each fold (cross-conformal: Vovk, Ann. Math. Artif. Intell. 2015; Barber et al., Ann. Statist. 2021,
jackknife+; approximate); with a plain split the held-out volumes, exactly exchangeable with a served case. Numbers
are named for what they were measured on: ``range_volumes_*``, ``heldout_slices_*`` (local temperature scaling's
early stopping) and ``in_sample_*``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from calib_monai.defaults import NUM_BINS, VOLUME_COVERAGE
from calib_monai.metrics.calibration import ece
from calib_monai.metrics.case_quality import case_quality, fit_volume_interval_scale
from calib_monai.metrics.feature_distance import MahalanobisDistance
from calib_monai.metrics.image_statistics import input_statistic_names, input_statistics
from calib_monai.metrics.segmentation import label_map_dice
from calib_monai.recalibration.local_temperature import LocalTemperatureScaling
from calib_monai.recalibration.references import fixed_references
from calib_monai.recalibration.settings import RecalibrationSettings
from calib_monai.recalibration.splits import Split, split_volumes, subject_names
from calib_monai.recalibration.stored import calibrate_volume
from calib_monai.recalibration.temperature import TemperatureScaling, calibration_voxels, check_voxels
from calib_monai.review.validated_range import ValidatedRange

__all__ = [
    "Split",
    "ValidationVolume",
    "cross_fit",
    "fit_recalibration",
    "measure_validated_range",
    "range_features",
    "split_volumes",
]

logger = logging.getLogger("calib_monai")
HELD_OUT_SHARE = 0.2  # of local temperature scaling's fitting slices, for early stopping


@dataclass
class ValidationVolume:
    """One validation volume on the network's grid (the recalibration's and the served case score's): raw logits
    ``(C, *spatial)``, label ``(*spatial)``, image ``(C_in, *spatial)``; ``geometry``: the image's field of view and
    acquired spacing (``image_geometry``)."""

    logits: torch.Tensor
    label: torch.Tensor
    image: torch.Tensor
    voxel_ml: float = 1.0
    case: str = ""
    geometry: list[float] | None = None  # image_geometry of the image while it had its metadata (None: unknown)
    subject: str = ""  # the subject (patient) it belongs to; "": its own (the datalist item's "subject")
    site: bool = False  # a label of the served site (the datalist item's "site"): re-anchors, is not a source subject


def _slice_groups(
    volumes: Sequence[ValidationVolume], spatial_dim: int, max_slices: int, seed: int
) -> list[list[torch.Tensor]]:
    """The volumes' 2D slices along ``spatial_dim``, grouped by in-plane size: ``[[logits, images, labels], ...]``,
    at most ``max_slices`` in all (seeded)."""
    axis = spatial_dim + 1
    slices = []
    for v in volumes:
        z, x, y = v.logits.movedim(axis, 0), v.image.movedim(axis, 0), v.label.movedim(spatial_dim, 0)
        slices += [(z[i], x[i], y[i]) for i in range(z.shape[0])]
    if len(slices) > max_slices:
        keep = torch.randperm(len(slices), generator=torch.Generator().manual_seed(seed))[:max_slices]
        slices = [slices[i] for i in sorted(keep.tolist())]
    by_shape: dict[tuple, list] = {}
    for s in slices:
        by_shape.setdefault(tuple(s[0].shape[1:]), []).append(s)
    return [[torch.stack(parts) for parts in zip(*group)] for group in by_shape.values()]


def _hold_out(groups: list[list[torch.Tensor]], share: float, seed: int) -> tuple[list, list]:
    """(fit, held-out) groups: a seeded ``share`` of the slices (at least 1 when there are 2) held out."""
    total = sum(g[0].shape[0] for g in groups)
    count = min(total - 1, max(1, round(share * total))) if total >= 2 else 0
    held = set(torch.randperm(total, generator=torch.Generator().manual_seed(seed + 1))[:count].tolist())
    fit, out, start = [], [], 0
    for g in groups:
        n = g[0].shape[0]
        mask = torch.tensor([start + i in held for i in range(n)])
        start += n
        for target, keep in ((fit, ~mask), (out, mask)):
            if bool(keep.any()):
                target.append([t[keep] for t in g])
    return fit, out


def _flat(groups: Sequence[Sequence[torch.Tensor]], module: nn.Module | None = None) -> tuple[torch.Tensor, ...]:
    """Logits (calibrated by ``module``) and labels of every voxel of slice groups, as ``(N, C)`` and ``(N,)``."""
    logits, labels = [], []
    with torch.no_grad():
        for z, x, y in groups:
            if module is not None:
                z = torch.cat([module(z[i : i + 64], x[i : i + 64]) for i in range(0, z.shape[0], 64)])
            logits.append(z.movedim(1, -1).reshape(-1, z.shape[1]))
            labels.append(y.reshape(-1).long())
    return torch.cat(logits), torch.cat(labels)


def _nll_ece(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """NLL over all the voxels and ECE over their ground-truth foreground (15 bins)."""
    prob = torch.softmax(logits.double(), dim=1)
    return float(F.nll_loss(prob.clamp_min(1e-12).log(), labels)), ece(prob.T[None], labels[None], NUM_BINS, "gt")


def _before_after(stats: dict, prefix: str, before: torch.Tensor, after: torch.Tensor, labels: torch.Tensor) -> None:
    for when, z in (("before", before), ("after", after)):
        stats[f"{prefix}_nll_{when}"], stats[f"{prefix}_ece_{when}"] = _nll_ece(z, labels)


def fit_recalibration(
    volumes: Sequence[ValidationVolume], indices: Sequence[int], settings: RecalibrationSettings, spatial_dim: int = 2
) -> tuple[nn.Module, dict[str, Any]]:
    """Fit ``settings.method`` on the ``indices`` volumes; returns the module and its statistics (where it was
    fitted, the in-sample NLL / ECE before and after, local temperature scaling's held-out slices before and after)."""
    fit = [volumes[i] for i in indices]
    stats: dict[str, Any] = {"volumes": len(fit)}
    method, voxels, seed, steps = settings.method, settings.voxels, settings.seed, settings.steps
    if method == "temperature":
        logits, labels = calibration_voxels(((v.logits, v.label) for v in fit), voxels, settings.max_voxels, seed)
        module: nn.Module = TemperatureScaling().fit(logits, labels)  # checks the voxels (fit_temperature)
        with torch.no_grad():
            calibrated = module(logits)
        where = "ground-truth foreground" if voxels == "foreground" else "all voxels"
        stats["fitted_on"] = f"{where} of the validation volumes"
    else:
        groups = _slice_groups(fit, spatial_dim, settings.max_slices, seed)
        check_voxels(*_flat(groups))
        train, held = _hold_out(groups, HELD_OUT_SHARE, seed)
        module = LocalTemperatureScaling(fit[0].logits.shape[0], fit[0].image.shape[0])
        module.fit(*zip(*train), steps=steps, seed=seed, held_out=tuple(zip(*held)) if held else None)
        if held:
            stats.update(heldout_slices=sum(g[0].shape[0] for g in held), best_step=module.history["best_step"])
            _before_after(stats, "heldout_slices", _flat(held)[0], _flat(held, module)[0], _flat(held)[1])
        else:
            logger.warning(
                "calibrate: a single validation slice: local temperature scaling fitted without early stopping"
            )
        stats.update(steps=int(steps), fitted_on="all voxels of the validation slices")
        (logits, labels), calibrated = _flat(train), _flat(train, module)[0]
    stats["voxels"] = int(labels.numel())
    _before_after(stats, "in_sample", logits, calibrated, labels)
    return module, stats


def cross_fit(
    volumes: Sequence[ValidationVolume], split: Split, settings: RecalibrationSettings, spatial_dim: int = 2
) -> tuple[nn.Module, dict[str, Any], list[tuple[nn.Module, list[int]]]]:
    """The served recalibration (fitted on ``split.fit``), its statistics (with the range volumes' NLL / ECE, each by
    the fit that did not see it), and the range's scorers: ``(module, scored volumes)`` per fold (a plain split: the
    served module on the range)."""
    module, stats = fit_recalibration(volumes, split.fit, settings, spatial_dim)
    stats = {"split": split.record(volumes), **stats}
    if split.crossfit:
        scorers, folds = [], []
        for fit_indices, scored in split.folds:
            fold_module, fold_stats = fit_recalibration(volumes, fit_indices, settings, spatial_dim)
            scorers.append((fold_module, list(scored)))
            folds.append({k: v for k, v in fold_stats.items() if k in ("volumes", "best_step", "heldout_nll_after")})
        stats["folds"] = folds
    else:
        scorers = [(module, list(split.range))]
    if not split.in_sample:
        before, after, labels = [], [], []
        with torch.no_grad():
            for scorer, scored in scorers:
                for i in scored:
                    v = volumes[i]
                    before.append(v.logits.reshape(v.logits.shape[0], -1).T)
                    calibrated = calibrate_volume(scorer, v.logits, v.image, spatial_dim)
                    after.append(calibrated.reshape(v.logits.shape[0], -1).T)
                    labels.append(v.label.reshape(-1).long())
        _before_after(stats, "range_volumes", torch.cat(before), torch.cat(after), torch.cat(labels))
    return module, stats, scorers


def range_features(features: Sequence[np.ndarray | None]) -> tuple[dict[str, Any] | None, str]:
    """``(to_dict(), "")`` of the :class:`~calib_monai.metrics.feature_distance.MahalanobisDistance` of the range
    volumes' pooled features (no projection), or ``(None, why not)``."""
    if not features or any(f is None for f in features):
        missing = sum(f is None for f in features)
        return None, f"{missing} of {len(features)} validation volumes have no network features"
    try:
        x = np.stack([np.asarray(f, dtype=np.float64).reshape(-1) for f in features])
        return MahalanobisDistance(max_dim=x.shape[1]).fit(x).to_dict(), ""
    except ValueError as err:
        return None, f"the validation features cannot be fitted ({err})"


def volume_interval_fit(
    qualities: Sequence[Mapping[str, Any]],
    truths: Sequence[tuple[torch.Tensor, float]],
    coverage: float = VOLUME_COVERAGE,
) -> tuple[float | None, dict[str, Any]]:
    """The factor that makes :func:`case_quality`'s volume interval hold each structure's true volume with probability
    ``coverage`` (:func:`fit_volume_interval_scale`; None when the pairs are too few), and its record. ``truths``:
    each scored volume's ``(label, voxel volume in mL)``."""
    expected, high, true = [], [], []
    for quality, (label, voxel_ml) in zip(qualities, truths):
        for c, name in enumerate(quality["classes"], start=1):  # the foreground classes, in class order
            entry = quality["classes"][name]
            expected.append(entry["volume"])
            high.append(entry["volume_high"])
            true.append(float((label == c).sum()) * voxel_ml)
    scale = fit_volume_interval_scale(expected, high, true, coverage) if expected else math.inf
    record = {"coverage": coverage, "pairs": len(expected), "scale": scale if math.isfinite(scale) else None}
    if not math.isfinite(scale):
        record["note"] = f"{len(expected)} (volume, class) pairs are too few for {coverage:.0%}: not widened"
    return (scale if math.isfinite(scale) else None), record


def score_minus_truth(quality: Mapping[str, Any], prob: torch.Tensor, label: torch.Tensor) -> float:
    """A scored volume's case score minus the true mean DSC of its segmentation (the argmax of ``prob``
    ``(C, *spatial)``, as ``DeliveredDiced``); NaN when either is undefined."""
    truth = float(label_map_dice(prob.argmax(0), label, prob.shape[0]).nanmean())
    score = quality.get("case_score")
    return float(score) - truth if score is not None and math.isfinite(score) else math.nan


def case_score_error(values: Sequence[float]) -> dict[str, Any]:
    """The scored volumes' :func:`score_minus_truth` summed up (NaN left out); the served score subtracts their mean
    (:class:`~calib_monai.review.anchor.CaseScoreAnchor`)."""
    finite = np.array([float(v) for v in values if math.isfinite(v)])
    per_volume = [round(float(v), 6) if math.isfinite(v) else None for v in values]  # the served lower bound's
    if not finite.size:
        return {"volumes": 0, "per_volume": per_volume}
    return {
        "volumes": int(finite.size),
        "mean": float(finite.mean()),
        "median": float(np.median(finite)),
        "mean_absolute": float(np.abs(finite).mean()),
        "lowest": float(finite.min()),
        "highest": float(finite.max()),
        "values": [round(float(v), 6) for v in finite],
        "per_volume": per_volume,
    }


def measure_validated_range(
    scorers: Sequence[tuple[nn.Module, Sequence[int]]],
    volumes: Sequence[ValidationVolume],
    split: Split,
    review: Mapping[str, Any],
    class_names: Sequence[str] | None = None,
    spatial_dim: int = 2,
    features: Sequence[np.ndarray | None] | None = None,
    reference_inputs: Sequence[Sequence[float]] | None = None,
    reference_features: Sequence[np.ndarray] | None = None,
    on_scored: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
    **info: Any,
) -> ValidatedRange:
    """The validated range of the scored volumes, each scored with its fold's recalibration (:func:`cross_fit`'s
    scorers); ``review``: the rule's settings; ``features``: each volume's pooled network features (None: none);
    ``reference_inputs`` / ``reference_features``: the training images' statistics and features, the fixed
    references (None: the validation volumes measure each other); ``on_scored(i, prob, label)``: called with each
    scored volume's probabilities and label (the contours are chosen on them)."""
    scorer_of = {i: module for module, scored in scorers for i in scored}
    fold_of = {i: j for j, (_, scored) in enumerate(scorers) for i in scored}
    chosen = sorted(scorer_of)
    qualities, truths, errors = [], [], []
    with torch.no_grad():
        for i in chosen:
            v = volumes[i]
            prob = torch.softmax(calibrate_volume(scorer_of[i], v.logits, v.image, spatial_dim), dim=0)
            qualities.append(case_quality(prob, voxel_volume=v.voxel_ml, class_names=class_names))
            truths.append((v.label, v.voxel_ml))
            if on_scored is not None:
                on_scored(i, prob, v.label)
            errors.append(score_minus_truth(qualities[-1], prob, v.label))
    inputs = [input_statistics(volumes[i].image, volumes[i].geometry) for i in chosen]
    image = volumes[chosen[0]].image if chosen else None
    names = input_statistic_names(image.shape[0], image.ndim - 1) if image is not None else []
    info = {"split": split.record(volumes), "volumes_scored": len(chosen), **info}
    stored = None
    if review.get("feature_check"):
        given = [None] * len(chosen) if features is None else [features[i] for i in chosen]
        stored, why = range_features(given)
        if why:
            info["features_left_out"] = why
    if split.in_sample:
        info["warning"] = "the range was measured on the volumes that fitted the recalibration (in-sample)"
    scale, info["volume_interval"] = volume_interval_fit(qualities, truths)
    info["case_score_error"] = case_score_error(errors)
    site = [n for n, i in enumerate(chosen) if volumes[i].site]
    if site:
        info["site_volumes"] = site  # their errors re-anchor the served score (review.anchor)
    references = fixed_references(
        reference_inputs, reference_features, [features[i] for i in chosen] if stored else None, input_names=names
    )
    if references.get("why"):
        info["feature_reference_left_out"] = references.pop("why")
    subjects = [volumes[i].subject for i in chosen]
    subjects = subject_names(subjects) if any(subjects) else []  # none named: each volume its own, stored as []
    return ValidatedRange.from_qualities(
        qualities,
        **review,
        subjects=subjects,
        inputs=inputs,
        features=stored,
        input_names=names,
        volume_interval_scale=scale,
        score_folds=[fold_of[i] for i in chosen] if split.crossfit else [],
        **references,
        **info,
    )
