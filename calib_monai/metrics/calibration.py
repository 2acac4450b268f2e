"""Calibration metrics of segmentation networks: ECE, CECE, TACE, ACE, mL1-ACE, NLL and Brier score.

All of them take softmax probabilities ``probs (B, C, *spatial)`` (or ``(C, *spatial)``) and integer labels
``(B, 1, *spatial)``, ``(B, *spatial)`` or ``(*spatial)``, and are computed over the voxels chosen by ``foreground``:

- ``"gt"``: ground-truth foreground (label != 0), as in NACL (Murugesan et al., MedIA 2024, Sec. 4), MbLS
  (Murugesan et al., 2023) and CRaC (MICCAI 2024), following Islam & Glocker (SVLS, IPMI 2021);
- ``"union"``: voxels that are foreground in the prediction (argmax != 0) or in the ground truth;
- ``"all"``: every voxel.

Where: torch tensors are computed with torch on their own device (CPU or CUDA, ``calibration_torch.py``): the
volume is never copied to the host, only per-bin statistics are. NumPy arrays (and lists) are computed with NumPy
(``calibration_numpy.py``). Both paths give the same values (the tests hold them equal to 1e-12): counts are
accumulated in int64 and sums in float64, so the values do not drift however many voxels are pooled (float32
accumulators stop counting at 2**24). One bin rule (``calibration_numpy.equal_width_bin_index``): bin k is
``(e_k, e_{k+1}]`` with ``e_k = k / M`` rounded to the probabilities' dtype, so a float32 value equal to float32(k / M)
goes to the lower bin, as in MONAI's ``calibration_binning`` and the authors' code (0 goes to bin 0).

The functions ``ece``, ``cece``, ``tace``, ``ace``, ``ml1ace``, ``nll``, ``brier`` and ``calibration_errors`` are
pooled over all volumes given: the selected voxels of every volume are binned together, which is not the mean over
volumes of the papers' tables (``segmentation_calibration(..., reduction="mean")``, ``SegmentationCalibrationMetric``).

Reductions over volumes (``segmentation_calibration``): ``"none"`` (one value per volume), ``"mean"`` (unweighted
mean over volumes: the papers' tables, see ``calib_segment_test.py`` of Bala93/CRac) and ``"pooled"`` (all selected
voxels of all volumes binned together). A volume without selected voxels gets NaN (with a ``UserWarning``) and is
left out of ``"mean"``. Probabilities that are not softmax outputs (logits) raise a ``ValueError`` saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._inputs import (
    check_foreground,
    check_num_bins,
    prepare_inputs,
    prepare_tensors,
    select_tensor_voxels,
    select_voxels,
    warn_empty_selection,
)
from .calibration_numpy import (
    _CHUNK,
    CLASSWISE_METRICS,
    _adaptive_error,
    _brier_stats,
    _cece_stats,
    _ece_stats,
    _nll_stats,
    equal_width_bin_index,
    numpy_calibration_errors,
    value_from_statistics,
)
from .calibration_torch import CalibrationAccumulator

__all__ = [
    "CALIBRATION_METRICS",
    "POOLABLE_METRICS",
    "calibration_errors",
    "ece",
    "cece",
    "tace",
    "ace",
    "ml1ace",
    "nll",
    "brier",
    "segmentation_calibration",
    "volume_statistics",
    "value_from_statistics",
    "equal_width_bin_index",
]

CALIBRATION_METRICS = ("ece", "cece", "tace", "ace", "ml1ace", "nll", "brier")
#: Metrics whose per-volume statistics add up to the statistics of the pooled voxels (equal-width bins, sums).
POOLABLE_METRICS = ("ece", "cece", "ml1ace", "nll", "brier")
REDUCTIONS = ("mean", "pooled", "none")


def _check_options(metric_name: Any, threshold: Any) -> str:
    if metric_name not in CALIBRATION_METRICS:
        raise ValueError(f"metric_name must be one of {CALIBRATION_METRICS}, got {metric_name!r}.")
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0.0 <= threshold < 1.0):
        raise ValueError(f"threshold must be a float in [0, 1), got {threshold!r}.")
    return str(metric_name)


# ----------------------------------------------------------------------------------------------------------------
# Per-volume statistics (values: calibration_numpy.value_from_statistics)
# ----------------------------------------------------------------------------------------------------------------


def volume_statistics(
    p: Any,
    y: Any,
    metric_name: str,
    num_bins: int = 15,
    include_background: bool = True,
    threshold: float = 1e-3,
) -> np.ndarray:
    """Flat float64 statistics of the selected voxels of one volume (``p (C, n)``, ``y (n,)``, already checked).

    ECE: ``(M * 3)``, CECE: ``(C * M * 3)``, NLL / Brier: ``[count, sum]``; they add up over volumes. TACE / ACE:
    ``[value]`` (equal-mass bins depend on all the voxels binned together, so they are not additive). Torch tensors
    are reduced on their device and only the statistics come back (as NumPy).
    """
    if isinstance(p, torch.Tensor):
        p = p.float() if p.dtype in (torch.float16, torch.bfloat16) else p
        acc = CalibrationAccumulator((metric_name,), p.shape[0], num_bins, include_background, threshold)
        acc.add(p, torch.as_tensor(y, device=p.device).long())
        return torch_volume_statistics(acc, metric_name, p.device).cpu().numpy()
    if metric_name in POOLABLE_METRICS:
        stats_fn = {"ece": _ece_stats, "nll": _nll_stats, "brier": _brier_stats}.get(metric_name, _cece_stats)
        args = (num_bins,) if metric_name == "ece" or metric_name in CLASSWISE_METRICS else ()
        # Additive statistics: chunks keep the temporaries small (and in the allocator's cache) on big volumes.
        total = None
        for start in range(0, max(p.shape[1], 1), _CHUNK):
            part = stats_fn(p[:, start : start + _CHUNK], y[start : start + _CHUNK], *args).ravel()
            total = part if total is None else total + part
        return total
    classes = range(0 if include_background else 1, p.shape[0])
    thr = threshold if metric_name == "tace" else None
    return np.array([_adaptive_error([(p, y)], num_bins, thr, classes)])


def torch_volume_statistics(acc: CalibrationAccumulator, metric_name: str, device: torch.device) -> torch.Tensor:
    """``volume_statistics`` of an accumulator's voxels as a flat float64 tensor on ``device`` (the voxels'; zeros
    when empty, which ``value_from_statistics`` turns into NaN; ``[value]`` for TACE / ACE)."""
    if metric_name in ("tace", "ace"):
        return torch.tensor([acc.adaptive_errors()[metric_name]], dtype=torch.float64, device=device)
    stats = acc.statistics(metric_name)
    if stats is None:
        classwise = acc.num_classes * acc.num_bins * 3
        size = {"ece": acc.num_bins * 3, "cece": classwise, "ml1ace": classwise}.get(metric_name, 2)
        return torch.zeros(size, dtype=torch.float64, device=device)
    return stats.reshape(-1)


def accumulator_values(acc: CalibrationAccumulator, names: Sequence[str], include_background: bool) -> dict:
    """``{name: value}`` of an accumulator: the statistics come to the host in one transfer (small: bins only)."""
    adaptive = acc.adaptive_errors()
    additive = [n for n in names if n not in adaptive]
    flat = [torch_volume_statistics(acc, n, acc.device) for n in additive]
    host = torch.cat(flat).cpu().numpy() if flat else np.zeros(0)
    out, start = {}, 0
    for name, f in zip(additive, flat):
        out[name] = value_from_statistics(
            host[start : start + f.numel()], name, acc.num_bins, acc.num_classes, include_background
        )
        start += f.numel()
    return {name: adaptive[name] if name in adaptive else out[name] for name in names}


# ----------------------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------------------


def segmentation_calibration(
    probs: Any,
    labels: Any,
    metric_name: str = "ece",
    num_bins: int = 15,
    foreground: str = "gt",
    reduction: str = "mean",
    include_background: bool = True,
    threshold: float = 1e-3,
) -> float | np.ndarray:
    """One calibration metric over a batch of volumes, reduced over volumes.

    Args:
        probs: softmax probabilities ``(B, C, *spatial)`` or ``(C, *spatial)``: a torch tensor (computed on its
            device) or a NumPy array (computed on the CPU).
        labels: integer labels ``(B, 1, *spatial)``, ``(B, *spatial)`` or ``(*spatial)``.
        metric_name: ``"ece"``, ``"cece"``, ``"tace"``, ``"ace"``, ``"ml1ace"``, ``"nll"`` or ``"brier"``.
        num_bins: number of bins M (equal-width for ECE / CECE / mL1-ACE, equal-mass for TACE / ACE). The papers use
            15 (the mL1-ACE paper 20).
        foreground: ``"gt"`` (default, the papers), ``"union"`` or ``"all"``: which voxels are scored.
        reduction: ``"mean"`` (unweighted mean of the per-volume values, NaN volumes left out: the papers),
            ``"pooled"`` (all selected voxels binned together) or ``"none"`` (NumPy array of per-volume values).
        include_background: CECE / TACE / ACE / mL1-ACE average over classes 0..C-1 when True (default, as the
            authors' code does on foreground voxels), over 1..C-1 when False.
        threshold: TACE only: class probabilities ``<= threshold`` are left out (Nixon et al. use 1e-3).
    """
    metric_name = _check_options(metric_name, threshold)
    num_bins = check_num_bins(num_bins)
    foreground = check_foreground(foreground)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    if isinstance(probs, torch.Tensor):
        p, y, class_dim = prepare_tensors(probs, labels)
        parts = [select_tensor_voxels(p[b], y[b], foreground, "probs", class_dim) for b in range(p.shape[0])]
    else:
        p, y = prepare_inputs(probs, labels)
        parts = [select_voxels(p[b], y[b], foreground, "probs", 1) for b in range(p.shape[0])]
    num_classes = p.shape[1]
    empty = [b for b, (_, yb) in enumerate(parts) if yb.shape[0] == 0]

    if reduction == "pooled":
        if len(empty) == len(parts):
            warn_empty_selection(foreground)
        if isinstance(probs, torch.Tensor):
            acc = CalibrationAccumulator((metric_name,), num_classes, num_bins, include_background, threshold)
            for pb, yb in parts:
                acc.add(pb, yb)
            return accumulator_values(acc, (metric_name,), include_background)[metric_name]
        if metric_name in ("tace", "ace"):
            classes = range(0 if include_background else 1, num_classes)
            return _adaptive_error(parts, num_bins, threshold if metric_name == "tace" else None, classes)
        stats = [volume_statistics(pb, yb, metric_name, num_bins, include_background, threshold) for pb, yb in parts]
        return value_from_statistics(np.sum(stats, axis=0), metric_name, num_bins, num_classes, include_background)

    if empty:
        warn_empty_selection(foreground, empty if len(parts) > 1 else None)
    values = []
    for pb, yb in parts:
        stats = volume_statistics(pb, yb, metric_name, num_bins, include_background, threshold)
        values.append(value_from_statistics(stats, metric_name, num_bins, num_classes, include_background))
    values = np.array(values)
    if reduction == "none":
        return values
    return float(np.mean(values[~np.isnan(values)])) if (~np.isnan(values)).any() else float("nan")


def calibration_errors(
    probs: Any,
    labels: Any,
    metrics: Sequence[str] = ("ece", "cece", "tace"),
    num_bins: int = 15,
    foreground: str = "gt",
    include_background: bool = True,
    threshold: float = 1e-3,
) -> dict[str, float]:
    """Several calibration metrics of the same voxels at once, pooled over all volumes given: ``{name: value}``.

    Equal to calling ``ece``, ``cece``, ``tace``, ``ace``, ``ml1ace``, ``nll`` and ``brier`` one by one (same
    definitions, same arguments), but the inputs are checked and the voxels selected once, and ECE, CECE and mL1-ACE
    share one bucketing of the class probabilities; TACE / ACE bin each class's values of all volumes together. Torch
    tensors are computed on their device, NumPy arrays on the CPU (see the module docstring).

    Args:
        probs, labels, num_bins, foreground, include_background, threshold: as in ``segmentation_calibration``
            (``include_background`` for CECE / TACE / ACE / mL1-ACE, ``threshold`` for TACE).
        metrics: names among ``CALIBRATION_METRICS``, in the order of the returned dict.
    """
    if isinstance(metrics, str):
        metrics = (metrics,)
    names = [_check_options(m, threshold) for m in metrics]
    if not names:
        raise ValueError(f"metrics must name at least one of {CALIBRATION_METRICS}, got {metrics!r}.")
    num_bins = check_num_bins(num_bins)
    foreground = check_foreground(foreground)
    if isinstance(probs, torch.Tensor):
        acc = pooled_accumulator(probs, labels, names, num_bins, foreground, include_background, threshold)
        return accumulator_values(acc, names, include_background)
    return numpy_calibration_errors(probs, labels, names, num_bins, foreground, include_background, threshold)


def pooled_accumulator(
    probs: torch.Tensor,
    labels: Any,
    names: Sequence[str],
    num_bins: int = 15,
    foreground: str = "gt",
    include_background: bool = True,
    threshold: float = 1e-3,
) -> CalibrationAccumulator:
    """The selected voxels of all volumes of ``probs`` (a tensor) checked and accumulated on its device (warns when
    nothing is selected); ``accumulator_values`` / ``.statistics`` read it."""
    p, y, class_dim = prepare_tensors(probs, labels)
    acc = CalibrationAccumulator(names, p.shape[1], num_bins, include_background, threshold)
    for b in range(p.shape[0]):
        acc.add(*select_tensor_voxels(p[b], y[b], foreground, "probs", class_dim))
    if acc.count == 0:
        warn_empty_selection(foreground, stacklevel=4)
    return acc


def ece(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt") -> float:
    """Expected calibration error (Naeini et al., AAAI 2015; Guo et al., ICML 2017), pooled over all volumes given.

    ``ECE = sum_b |B_b| / N * |acc(B_b) - conf(B_b)|`` with top-label confidence ``max_k p_k`` in M equal-width bins
    ``(b / M, (b + 1) / M]`` and accuracy ``[argmax_k p_k == y]`` (NACL Eq. 10). Ties of argmax go to the lower class.
    """
    return calibration_errors(probs, labels, ("ece",), num_bins, foreground)["ece"]


def cece(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt", include_background: bool = True) -> float:
    """Classwise ECE (Kull et al., NeurIPS 2019; NACL Eq. 11), pooled over all volumes given.

    ``CECE = 1/K sum_k sum_b |B_kb| / N * |mean_{B_kb} [y == k] - mean_{B_kb} p_k|``, equal-width bins of ``p_k``.
    ``include_background=True`` (default) keeps class 0, as the authors' ``ClasswiseECELoss`` does on foreground
    voxels. Differences from that code: the classes are all C channels (not ``max(label) + 1``), and a voxel with
    ``p_k == 0`` falls in the first bin instead of no bin (it only matters when its label is k).
    """
    return calibration_errors(probs, labels, ("cece",), num_bins, foreground, include_background)["cece"]


def tace(
    probs: Any,
    labels: Any,
    num_bins: int = 15,
    foreground: str = "gt",
    include_background: bool = True,
    threshold: float = 1e-3,
) -> float:
    """Thresholded adaptive calibration error (Nixon et al., CVPR-W 2019), pooled over all volumes given.

    ``TACE = 1/K sum_k sum_r |B_kr| / N_k * |mean_{B_kr} [y == k] - mean_{B_kr} p_k|`` over the N_k voxels with
    ``p_k > threshold``, in R equal-mass bins (bin r holds the sorted positions
    ``[floor(r N_k / R), floor((r+1) N_k / R))``, so ``|B_kr| / N_k = 1 / R`` when R divides N_k: Nixon's
    ``1/(KR) sum_k sum_r |acc - conf|``). Voxels are ordered by (p_k, label), so ties cannot make the result depend
    on voxel order. Classes without any voxel above the threshold are left out of the mean. SVLS's ``tace_eval``
    divides by R once more; we do not. CRaC's code names a thresholded *equal-width* classwise ECE "tcece"; the
    CRaC paper cites Nixon's TACE, which is what this is.
    """
    return calibration_errors(probs, labels, ("tace",), num_bins, foreground, include_background, threshold)["tace"]


def ace(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt", include_background: bool = True) -> float:
    """Adaptive calibration error (Nixon et al., CVPR-W 2019), pooled over all volumes given: TACE without the
    threshold (every p_k is binned).

    Not netcal's ``ACE`` (the "average calibration error", an unweighted mean over equal-width bins).
    """
    return calibration_errors(probs, labels, ("ace",), num_bins, foreground, include_background)["ace"]


def ml1ace(
    probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt", include_background: bool = True
) -> float:
    """Marginal L1 average calibration error, mL1-ACE (Barfoot et al., "Average Calibration Losses for Reliable
    Uncertainty in Medical Image Segmentation", arXiv:2506.03942), pooled over all volumes given.

    ``mL1-ACE = 1/K sum_k 1/|B_k+| sum_{b in B_k+} |mean_{B_kb} [y == k] - mean_{B_kb} p_k|``: the bins of CECE
    (equal-width bins ``(b / M, (b + 1) / M]`` of each class probability p_k, 0 in the first), but every non-empty
    bin ``B_k+`` weighted equally instead of by its share of the voxels (the "average" calibration error of
    Neumann et al. 2018; MONAI's ``CalibrationErrorMetric(calibration_reduction="average")``). It is the quantity
    that :class:`~calib_monai.losses.HardL1ACELoss` optimises: with ``foreground="all"`` and one volume, this equals
    the loss's calibration term on that image (``empty_classes="include"``; or any setting when every class is
    present), which the authors compute per training image over all its voxels with 20 bins.

    Every class 0..C-1 (1..C-1 with ``include_background=False``) is scored, also one absent from the labels (its
    frequency is 0 in every bin), as CECE does. Differences from the authors' evaluation code
    (``CalibrationErrorMetric(calibration_reduction="average")`` of cai4cai/Average-Calibration-Losses at 5ad8418,
    ``src/metrics/calibration.py``): their edges are ``k (1 + eps32) / M`` in float32 (l. 65-70; a value within
    1.2e-7 relative above ``k / M`` falls in the lower bin there), they score every voxel and average per volume and
    class (l. 190-193, then the mean; ``segmentation_calibration(..., foreground="all", reduction="mean")`` here),
    and their default is 20 bins; the voxels here are chosen by ``foreground`` and pooled over the volumes given.
    """
    return calibration_errors(probs, labels, ("ml1ace",), num_bins, foreground, include_background)["ml1ace"]


def nll(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt") -> float:
    """Mean negative log-likelihood ``-1/N sum_i log p_{i, y_i}`` (p clamped at 1e-12), pooled over all volumes given.
    ``num_bins`` is unused."""
    return calibration_errors(probs, labels, ("nll",), num_bins, foreground)["nll"]


def brier(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt") -> float:
    """Multiclass Brier score (Brier, 1950) ``1/N sum_i sum_k (p_ik - [y_i == k])^2``, pooled over all volumes given.
    ``num_bins`` is unused.

    The authors' ``seg_brier_score`` compares with 3x3 neighbourhood label proportions instead of one-hot labels.
    """
    return calibration_errors(probs, labels, ("brier",), num_bins, foreground)["brier"]
