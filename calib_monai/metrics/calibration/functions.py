"""Calibration metrics of segmentation networks: ECE, CECE, TACE, ACE, mL1-ACE, NLL, Brier, reliability diagrams.

Inputs: softmax probabilities ``probs (B, C, *spatial)`` or ``(C, *spatial)`` and integer labels ``(B, 1, *spatial)``,
``(B, *spatial)`` or ``(*spatial)``, torch (computed on their device) or NumPy. ``foreground`` selects the voxels:
``"gt"`` (label != 0: NACL, MbLS, CRaC after SVLS), ``"union"`` (label or argmax != 0) or ``"all"``. Bin k is
``(e_k, e_{k+1}]``, ``e_k = k / M`` in the probabilities' dtype, as MONAI's ``calibration_binning``.

``ece``, ``cece``, ``tace``, ``ace``, ``ml1ace_gt``, ``nll``, ``brier`` and ``calibration_errors`` pool the voxels of
all volumes; ``segmentation_calibration(..., reduction="mean")`` is the papers' mean over volumes. ``ml1ace`` and
``cece_all`` follow ``METRIC_DEFINITIONS``. A volume without selected voxels is NaN (``UserWarning``); logits raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from calib_monai.checks import check_option, check_positive_int
from calib_monai.defaults import L1ACE_NUM_BINS, NUM_BINS, TACE_THRESHOLD

from .inputs import CALIBRATION_METRICS, REDUCTIONS, check_foreground, check_metric, metric_definition, selected_voxels
from .statistics import selected_statistics, statistics_values, value_from_statistics

__all__ = [
    "ace",
    "brier",
    "calibration_errors",
    "calibration_statistics",
    "cece",
    "cece_all",
    "ece",
    "ml1ace",
    "ml1ace_gt",
    "nll",
    "reliability_diagram_data",
    "segmentation_calibration",
    "tace",
]


def calibration_statistics(
    probs: Any,
    labels: Any,
    metrics: Sequence[str] = ("ece", "cece", "tace"),
    num_bins: int = NUM_BINS,
    foreground: str = "gt",
    include_background: bool = True,
    threshold: float = TACE_THRESHOLD,
) -> dict[str, torch.Tensor]:
    """``{name: float64 statistics}`` of the selected voxels of all volumes binned together, on ``probs``' device
    (``statistics.selected_statistics``); ``value_from_statistics`` reads them.

    >>> stats = calibration_statistics([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]], [1, 0, 0, 0], ["ece"], 5, "all")
    >>> stats["ece"][3:].tolist()  # bins (0.6, 0.8] and (0.8, 1]: count, sum of confidences, number correct
    [[3.0, 2.3, 2.0], [1.0, 0.9, 1.0]]
    """
    metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    names = [check_metric(m, threshold) for m in metrics]
    if not names:
        raise ValueError(f"metrics must name at least one of {CALIBRATION_METRICS}, got {metrics!r}.")
    num_bins = check_positive_int("num_bins", num_bins)
    parts = selected_voxels(probs, labels, check_foreground(foreground))
    return selected_statistics(parts, names, num_bins, include_background, threshold)


def calibration_errors(
    probs: Any,
    labels: Any,
    metrics: Sequence[str] = ("ece", "cece", "tace"),
    num_bins: int = NUM_BINS,
    foreground: str = "gt",
    include_background: bool = True,
    threshold: float = TACE_THRESHOLD,
) -> dict[str, float]:
    """``{name: value}`` of several metrics (``CALIBRATION_METRICS``) of the same voxels, pooled over all volumes:
    the functions' values, with the voxels selected once and one histogram shared (arguments as
    ``segmentation_calibration``).

    >>> values = calibration_errors([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]], [1, 0, 0, 0], ("ece", "brier"),
    ...                             num_bins=10, foreground="all")
    >>> {k: round(v, 4) for k, v in values.items()}  # Brier: (0.08 + 1.28 + 0.18 + 0.02) / 4
    {'ece': 0.25, 'brier': 0.39}
    """
    stats = calibration_statistics(probs, labels, metrics, num_bins, foreground, include_background, threshold)
    return statistics_values(stats, num_bins, include_background)


def segmentation_calibration(
    probs: Any,
    labels: Any,
    metric_name: str = "ece",
    num_bins: int | None = None,
    foreground: str | None = None,
    reduction: str = "mean",
    include_background: bool | None = None,
    threshold: float = TACE_THRESHOLD,
) -> float | np.ndarray:
    """One calibration metric over a batch of volumes, reduced over volumes.

    Args:
        metric_name: one of ``CALIBRATION_METRICS`` or ``METRIC_DEFINITIONS``.
        num_bins, foreground, include_background: None takes the metric's definition (``metric_definition``). Bins
            are equal-width for ECE / CECE / mL1-ACE, equal-mass for TACE / ACE; ``include_background`` False
            averages CECE / TACE / ACE / mL1-ACE over classes 1..C-1.
        reduction: ``"mean"`` (of the per-volume values, NaN volumes left out: the papers), ``"pooled"`` (all
            selected voxels binned together) or ``"none"`` (NumPy array of per-volume values).
        threshold: TACE only: class probabilities ``<= threshold`` are left out (Nixon et al.).

    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])
    >>> batch_p, batch_y = np.stack([probs, probs]), np.array([[1, 0, 0, 0]] * 2)  # two equal volumes
    >>> segmentation_calibration(batch_p, batch_y, "ece", num_bins=10, foreground="all", reduction="none").tolist()
    [0.25, 0.25]
    """
    metric_name = check_metric(metric_name, threshold, named=True)
    formula, num_bins, foreground, include_background = metric_definition(
        metric_name, num_bins, foreground, include_background
    )
    check_option("reduction", reduction, REDUCTIONS)
    parts = selected_voxels(probs, labels, foreground, pooled=reduction == "pooled")
    settings = (num_bins, include_background, threshold)
    if reduction == "pooled":
        return statistics_values(selected_statistics(parts, (formula,), *settings), *settings[:2])[formula]
    stats = torch.stack([selected_statistics([part], (formula,), *settings)[formula] for part in parts]).cpu()
    values = np.array([value_from_statistics(s, formula, *settings[:2]) for s in stats])
    if reduction == "none":
        return values
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if kept.size else float("nan")


def ece(probs: Any, labels: Any, num_bins: int = NUM_BINS, foreground: str = "gt") -> float:
    """Expected calibration error (Naeini et al., AAAI 2015; Guo et al., ICML 2017), pooled over all volumes given.

    ``ECE = sum_b |B_b| / N * |acc(B_b) - conf(B_b)|`` with top-label confidence ``max_k p_k`` in M equal-width bins
    ``(b / M, (b + 1) / M]`` and accuracy ``[argmax_k p_k == y]`` (NACL Eq. 10). Ties of argmax go to the lower class.

    >>> probs, labels = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]), np.array([1, 0, 0, 0])
    >>> ece(probs, labels, num_bins=10, foreground="all")  # 2/4 * |0.5 - 0.8| + 1/4 * 0.3 + 1/4 * 0.1
    0.25
    >>> round(ece(probs, labels, num_bins=10), 4)  # foreground="gt": voxel 0 only, |1 - 0.8|
    0.2
    """
    return calibration_errors(probs, labels, ("ece",), num_bins, foreground)["ece"]


def cece(
    probs: Any, labels: Any, num_bins: int = NUM_BINS, foreground: str = "gt", include_background: bool = True
) -> float:
    """Classwise ECE (Kull et al., NeurIPS 2019; NACL Eq. 11), pooled over all volumes given.

    ``CECE = 1/K sum_k sum_b |B_kb| / N * |mean_{B_kb} [y == k] - mean_{B_kb} p_k|``, equal-width bins of ``p_k``.
    A voxel with ``p_k == 0`` falls in the first bin.

    >>> probs, labels = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]), np.array([1, 0, 0, 0])
    >>> # class 1: 2/4 * |0.5 - 0.8| + 1/4 * |0 - 0.3| + 1/4 * |0 - 0.1| = 0.25; class 0 likewise
    >>> cece(probs, labels, num_bins=10, foreground="all")
    0.25
    """
    return calibration_errors(probs, labels, ("cece",), num_bins, foreground, include_background)["cece"]


def tace(
    probs: Any,
    labels: Any,
    num_bins: int = NUM_BINS,
    foreground: str = "gt",
    include_background: bool = True,
    threshold: float = TACE_THRESHOLD,
) -> float:
    """Thresholded adaptive calibration error (Nixon et al., CVPR-W 2019), pooled over all volumes given.

    ``TACE = 1/K sum_k sum_r |B_kr| / N_k * |mean_{B_kr} [y == k] - mean_{B_kr} p_k|`` over the N_k voxels with
    ``p_k > threshold``, in R equal-mass bins (sorted positions ``[floor(r N_k / R), floor((r+1) N_k / R))``),
    voxels ordered by (p_k, label). Classes without a voxel above the threshold are left out of the mean.

    >>> probs, labels = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]), np.array([1, 0, 0, 0])
    >>> # class 1 sorted: (0.1, 0.3 | 0.8, 0.8), 2 bins: 1/2 * |0 - 0.2| + 1/2 * |0.5 - 0.8| = 0.25; class 0 likewise
    >>> round(tace(probs, labels, num_bins=2, foreground="all"), 4)
    0.25
    """
    return calibration_errors(probs, labels, ("tace",), num_bins, foreground, include_background, threshold)["tace"]


def ace(
    probs: Any, labels: Any, num_bins: int = NUM_BINS, foreground: str = "gt", include_background: bool = True
) -> float:
    """Adaptive calibration error (Nixon et al., CVPR-W 2019), pooled over all volumes given: TACE without the
    threshold. Not netcal's ``ACE`` (an unweighted mean over equal-width bins).

    >>> probs, labels = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]), np.array([1, 0, 0, 0])
    >>> round(ace(probs, labels, num_bins=2, foreground="all"), 4)  # no probability below 1e-3: TACE's value
    0.25
    """
    return calibration_errors(probs, labels, ("ace",), num_bins, foreground, include_background)["ace"]


def nll(probs: Any, labels: Any, foreground: str = "gt") -> float:
    """Mean negative log-likelihood ``-1/N sum_i log p_{i, y_i}`` (p clamped at 1e-12), pooled over all volumes given.

    >>> probs, labels = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]), np.array([1, 0, 0, 0])
    >>> round(nll(probs, labels, foreground="all"), 4)  # -(log 0.8 + log 0.2 + log 0.7 + log 0.9) / 4
    0.5737
    """
    return calibration_errors(probs, labels, ("nll",), foreground=foreground)["nll"]


def brier(probs: Any, labels: Any, foreground: str = "gt") -> float:
    """Multiclass Brier score (Brier, 1950) ``1/N sum_i sum_k (p_ik - [y_i == k])^2``, pooled over all volumes given.

    >>> probs, labels = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]), np.array([1, 0, 0, 0])
    >>> round(brier(probs, labels, foreground="all"), 4)  # (0.08 + 1.28 + 0.18 + 0.02) / 4
    0.39
    """
    return calibration_errors(probs, labels, ("brier",), foreground=foreground)["brier"]


def ml1ace(
    probs: Any,
    labels: Any,
    num_bins: int = L1ACE_NUM_BINS,
    foreground: str = "all",
    include_background: bool = False,
    reduction: str = "mean",
) -> float | np.ndarray:
    """Marginal L1 average calibration error, mL1-ACE (Barfoot et al., arXiv:2506.03942): by default per volume over
    every voxel, background excluded, 20 bins, then the mean over volumes.

    ``mL1-ACE = 1/K sum_k 1/|B_k+| sum_{b in B_k+} |mean_{B_kb} [y == k] - mean_{B_kb} p_k|``: CECE's bins, every
    non-empty bin weighted equally (MONAI's ``CalibrationErrorMetric(calibration_reduction="average")``).

    >>> probs, labels = np.array([[[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]]), np.array([[1, 0, 0, 0]])
    >>> # class 1 (background excluded), bins of 0.8 (2 voxels, frequency 1/2), 0.3 and 0.1 (frequency 0):
    >>> round(ml1ace(probs, labels, num_bins=10), 4)  # (|0.5 - 0.8| + |0 - 0.3| + |0 - 0.1|) / 3
    0.2333
    """
    num_bins, foreground = check_positive_int("num_bins", num_bins), check_foreground(foreground)
    return segmentation_calibration(probs, labels, "ml1ace", num_bins, foreground, reduction, include_background)


def ml1ace_gt(probs: Any, labels: Any, num_bins: int = NUM_BINS, include_background: bool = True) -> float:
    """mL1-ACE of the ground-truth foreground voxels, background included, pooled over all volumes (comparable with
    NACL / CRaC). Not the paper's metric: far from 0 for a calibrated model (background bins without labels).

    >>> probs, labels = np.array([[[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]]), np.array([[1, 0, 0, 0]])
    >>> round(ml1ace_gt(probs, labels, num_bins=10), 4)  # voxel 0 only: class 0 |0 - 0.2|, class 1 |1 - 0.8|
    0.2
    """
    return calibration_errors(probs, labels, ("ml1ace",), num_bins, "gt", include_background)["ml1ace"]


def cece_all(
    probs: Any, labels: Any, num_bins: int = L1ACE_NUM_BINS, include_background: bool = False, reduction: str = "mean"
) -> float | np.ndarray:
    """Classwise ECE over every voxel, per volume, background excluded, 20 bins, then the mean over volumes (MONAI's
    ``CalibrationErrorMetric``, as the mL1-ACE authors report it).

    >>> probs, labels = np.array([[[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]]), np.array([[1, 0, 0, 0]])
    >>> round(cece_all(probs, labels, num_bins=10), 4)  # class 1: 2/4 * 0.3 + 1/4 * 0.3 + 1/4 * 0.1
    0.25
    """
    num_bins = check_positive_int("num_bins", num_bins)
    return segmentation_calibration(probs, labels, "cece", num_bins, "all", reduction, include_background)


def reliability_diagram_data(
    probs: Any, labels: Any, num_bins: int = NUM_BINS, foreground: str = "gt", classwise: bool = False
) -> dict[str, np.ndarray]:
    """Per-bin statistics of a reliability diagram (Niculescu-Mizil & Caruana, ICML 2005), pooled over volumes.

    Top-label: bins of ``max_k p_k``, accuracy = fraction with ``argmax == y`` (ECE's bins). ``classwise``: one row
    per class k, bins of ``p_k``, accuracy = fraction labelled k (CECE's bins).

    Returns:
        dict with ``"edges"`` ``(M + 1,)``, ``"confidence"`` and ``"accuracy"`` (NaN for empty bins) and ``"count"``
        (int64), each ``(M,)`` or ``(C, M)`` for ``classwise=True``.

    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])
    >>> data = reliability_diagram_data(probs, np.array([1, 0, 0, 0]), num_bins=5, foreground="all")
    >>> data["count"].tolist(), data["accuracy"][3:].round(4).tolist()  # confidences 0.8, 0.8, 0.7 | 0.9
    ([0, 0, 0, 3, 1], [0.6667, 1.0])
    """
    name = "cece" if classwise else "ece"
    stats = calibration_statistics(probs, labels, (name,), num_bins, foreground)[name].cpu().numpy()
    count = stats[..., 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.where(count > 0, stats[..., 1] / count, np.nan)
        accuracy = np.where(count > 0, stats[..., 2] / count, np.nan)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    return {"edges": edges, "confidence": confidence, "accuracy": accuracy, "count": count.astype(np.int64)}
