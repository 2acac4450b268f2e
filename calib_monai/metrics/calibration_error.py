"""Calibration metrics of segmentation networks: ECE, CECE, TACE, ACE, mL1-ACE, NLL and Brier score.

All of them take softmax probabilities ``probs (B, C, *spatial)`` (or ``(C, *spatial)``) and integer labels
``(B, 1, *spatial)``, ``(B, *spatial)`` or ``(*spatial)``, and are computed over the voxels chosen by ``foreground``:

- ``"gt"``: ground-truth foreground (label != 0), as in NACL (Murugesan et al., MedIA 2024, Sec. 4), MbLS
  (Murugesan et al., 2023) and CRaC (MICCAI 2024), following Islam & Glocker (SVLS, IPMI 2021);
- ``"union"``: voxels that are foreground in the prediction (argmax != 0) or in the ground truth;
- ``"all"``: every voxel.

Where: on the inputs' device, by one definition: the bucket grid on the CPU (``calibration_torch.py``), whole-tensor
operations on CUDA (``calibration_sorted.py``; ``calibration_triton.py``'s kernels where Triton is installed). The
volume is never copied to the host, only per-bin statistics are. NumPy arrays (and lists) are viewed as CPU tensors
(``torch.from_numpy``, no copy of a contiguous array) and take the same path. Counts are accumulated in int64 and sums
in float64, so the values do not drift however many voxels are pooled (float32 accumulators stop counting at 2**24); the
tests hold them equal to a float64 brute force. One bin rule (``calibration_numpy.equal_width_bin_index``): bin k is
``(e_k, e_{k+1}]`` with ``e_k = k / M`` rounded to the probabilities' dtype, so a float32 value equal to float32(k / M)
goes to the lower bin, as in MONAI's ``calibration_binning`` (0 goes to bin 0).

The functions ``ece``, ``cece``, ``tace``, ``ace``, ``ml1ace_gt``, ``nll``, ``brier`` and ``calibration_errors`` are
pooled over all volumes given: the selected voxels of every volume are binned together, which is not the mean over
volumes of the papers' tables (``segmentation_calibration(..., reduction="mean")``, ``SegmentationCalibrationMetric``).

Metrics whose paper fixes the voxels, classes and bins are *named* (``METRIC_DEFINITIONS``) and default to that
definition, per volume: ``ml1ace`` (Barfoot et al.: every voxel, background excluded, 20 bins, mean over volumes),
``cece_all`` (classwise ECE over every voxel, background excluded, 20 bins: MONAI's ``CalibrationErrorMetric``) and
``ml1ace_gt`` (mL1-ACE on the ground-truth foreground, background included, 15 bins, comparable with NACL / CRaC's
foreground metrics). In ``calibration_errors`` (several metrics of one voxel selection) the names are the formulas:
``"ml1ace"`` there is mL1-ACE on the voxels its ``foreground`` selects.

Reductions over volumes (``segmentation_calibration``): ``"none"`` (one value per volume), ``"mean"`` (unweighted mean
over volumes: the papers' tables) and ``"pooled"`` (all selected voxels of all volumes binned together). A volume
without selected voxels gets NaN (with a ``UserWarning``) and is left out of ``"mean"``. Probabilities that are not
softmax outputs (logits) raise a ``ValueError`` saying so. Sources, the authors' code and the differences from it:
``docs/notes/metrics.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from calib_monai.checks import check_number, check_option, check_positive_int

from ._inputs import (
    METRIC_DEFINITIONS,
    as_tensors,
    check_foreground,
    metric_definition,
    prepare_tensors,
    warn_empty_selection,
)
from .calibration_kernel import add_volume, select_voxels  # compiled "gt" passes; select_tensor_voxels otherwise
from .calibration_numpy import equal_width_bin_index, value_from_statistics
from .calibration_sorted import sorted_errors, sorted_path, statistics_values
from .calibration_torch import CalibrationAccumulator
from .calibration_triton import triton_errors
from .calibration_volume import per_volume_statistics, torch_volume_statistics, volume_statistics

__all__ = [
    "CALIBRATION_METRICS",
    "POOLABLE_METRICS",
    "METRIC_DEFINITIONS",
    "calibration_errors",
    "ece",
    "cece",
    "tace",
    "ace",
    "metric_definition",
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


def _check_options(metric_name: Any, threshold: Any, named: bool = False) -> str:
    known = CALIBRATION_METRICS + tuple(n for n in METRIC_DEFINITIONS if n not in CALIBRATION_METRICS) * named
    check_option("metric_name", metric_name, known)
    if threshold is not None:
        check_number("threshold", threshold, 0, 1, high_open=True, wanted="a float in [0, 1)")
    return str(metric_name)


def accumulator_values(acc: CalibrationAccumulator, names: Sequence[str], include_background: bool) -> dict:
    """``{name: value}`` of an accumulator: the statistics come to the host in one transfer (small: bins only)."""
    adaptive = acc.adaptive_errors()  # TACE / ACE once: their refinement serves both
    stats = {
        name: torch.tensor([adaptive[name]], dtype=torch.float64, device=acc.device)
        if name in adaptive
        else torch_volume_statistics(acc, name, acc.device)
        for name in names
    }
    return statistics_values(stats, acc.num_bins, acc.num_classes, include_background)


# ----------------------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------------------


def segmentation_calibration(
    probs: Any,
    labels: Any,
    metric_name: str = "ece",
    num_bins: int | None = None,
    foreground: str | None = None,
    reduction: str = "mean",
    include_background: bool | None = None,
    threshold: float = 1e-3,
) -> float | np.ndarray:
    """One calibration metric over a batch of volumes, reduced over volumes.

    ``num_bins``, ``foreground`` and ``include_background`` left None take the metric's definition
    (``metric_definition``): ``"ml1ace"`` / ``"cece_all"`` every voxel, background excluded, 20 bins; ``"ml1ace_gt"``
    and the others the ground-truth foreground, background included, 15 bins.

    Args:
        probs: softmax probabilities ``(B, C, *spatial)`` or ``(C, *spatial)``: a torch tensor (computed on its
            device) or a NumPy array (a CPU tensor).
        labels: integer labels ``(B, 1, *spatial)``, ``(B, *spatial)`` or ``(*spatial)``.
        metric_name: ``"ece"``, ``"cece"``, ``"tace"``, ``"ace"``, ``"ml1ace"``, ``"nll"``, ``"brier"``,
            ``"cece_all"`` or ``"ml1ace_gt"``.
        num_bins: number of bins M (equal-width for ECE / CECE / mL1-ACE, equal-mass for TACE / ACE). The papers use
            15 (the mL1-ACE paper 20).
        foreground: ``"gt"`` (the foreground papers), ``"union"`` or ``"all"``: which voxels are scored.
        reduction: ``"mean"`` (unweighted mean of the per-volume values, NaN volumes left out: the papers),
            ``"pooled"`` (all selected voxels binned together) or ``"none"`` (NumPy array of per-volume values).
        include_background: CECE / TACE / ACE / mL1-ACE average over classes 0..C-1 when True (as the authors' code
            does on foreground voxels), over 1..C-1 when False.
        threshold: TACE only: class probabilities ``<= threshold`` are left out (Nixon et al. use 1e-3).

    >>> import numpy as np
    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])  # (C, *spatial): 2 classes, 4 voxels
    >>> labels = np.array([1, 0, 0, 0])
    >>> batch_p, batch_y = np.stack([probs, probs]), np.stack([labels, labels])  # two equal volumes
    >>> segmentation_calibration(batch_p, batch_y, "ece", num_bins=10, foreground="all", reduction="none").tolist()
    [0.25, 0.25]
    """
    metric_name = _check_options(metric_name, threshold, named=True)
    metric_name, num_bins, foreground, include_background = metric_definition(
        metric_name, num_bins, foreground, include_background
    )
    check_option("reduction", reduction, REDUCTIONS)
    p, y, class_dim = prepare_tensors(*as_tensors(probs, labels))
    num_classes, settings = p.shape[1], (num_bins, include_background, threshold)

    if reduction == "pooled":
        parts = [select_voxels(p[b], y[b], foreground, "probs", class_dim) for b in range(p.shape[0])]
        if all(yb.shape[0] == 0 for _, yb in parts):
            warn_empty_selection(foreground)
        acc = CalibrationAccumulator((metric_name,), num_classes, num_bins, include_background, threshold)
        for pb, yb in parts:
            acc.add(pb, yb)
        return accumulator_values(acc, (metric_name,), include_background)[metric_name]

    stats, empty = per_volume_statistics(p, y, metric_name, foreground, *settings, class_dim)
    if empty:
        warn_empty_selection(foreground, empty if p.shape[0] > 1 else None)
    stats = torch.stack(stats).cpu().numpy()  # one transfer
    values = np.array([value_from_statistics(s, metric_name, num_bins, num_classes, include_background) for s in stats])
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
    tensors are computed on their device, NumPy arrays as CPU tensors (see the module docstring).

    Args:
        probs, labels, num_bins, foreground, include_background, threshold: as in ``segmentation_calibration``
            (``include_background`` for CECE / TACE / ACE / mL1-ACE, ``threshold`` for TACE).
        metrics: names among ``CALIBRATION_METRICS``, in the order of the returned dict.

    >>> import numpy as np
    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])  # (C, *spatial): 2 classes, 4 voxels
    >>> labels = np.array([1, 0, 0, 0])
    >>> values = calibration_errors(probs, labels, ("ece", "nll", "brier"), num_bins=10, foreground="all")
    >>> {k: round(v, 4) for k, v in values.items()}
    {'ece': 0.25, 'nll': 0.5737, 'brier': 0.39}
    """
    metrics = (metrics,) if isinstance(metrics, str) else metrics
    names = [_check_options(m, threshold) for m in metrics]
    if not names:
        raise ValueError(f"metrics must name at least one of {CALIBRATION_METRICS}, got {metrics!r}.")
    num_bins = check_positive_int("num_bins", num_bins)
    foreground = check_foreground(foreground)
    if isinstance(probs, torch.Tensor) and sorted_path(probs):  # whole-tensor ops: the grid's steps bind a GPU
        args = (*prepare_tensors(probs, labels), names, num_bins, foreground, include_background, threshold)
        return triton_errors(*args) or sorted_errors(*args)  # Triton kernels where installed: one read of the data
    acc = pooled_accumulator(probs, labels, names, num_bins, foreground, include_background, threshold)
    return accumulator_values(acc, names, include_background)


def pooled_accumulator(
    probs: Any,
    labels: Any,
    names: Sequence[str],
    num_bins: int = 15,
    foreground: str = "gt",
    include_background: bool = True,
    threshold: float = 1e-3,
) -> CalibrationAccumulator:
    """The selected voxels of all volumes of ``probs`` (a tensor, or a NumPy array as a CPU tensor) checked and
    accumulated on its device (warns when nothing is selected); ``accumulator_values`` / ``.statistics`` read it."""
    p, y, class_dim = prepare_tensors(*as_tensors(probs, labels))
    acc = CalibrationAccumulator(names, p.shape[1], num_bins, include_background, threshold)
    for b in range(p.shape[0]):  # "gt" on float32 CPU volumes: selected and accumulated in one compiled pass
        if foreground != "gt" or not add_volume(acc, p[b], y[b], "probs", class_dim):
            acc.add(*select_voxels(p[b], y[b], foreground, "probs", class_dim))
    if acc.count == 0:
        warn_empty_selection(foreground, stacklevel=4)
    return acc


def ece(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt") -> float:
    """Expected calibration error (Naeini et al., AAAI 2015; Guo et al., ICML 2017), pooled over all volumes given.

    ``ECE = sum_b |B_b| / N * |acc(B_b) - conf(B_b)|`` with top-label confidence ``max_k p_k`` in M equal-width bins
    ``(b / M, (b + 1) / M]`` and accuracy ``[argmax_k p_k == y]`` (NACL Eq. 10). Ties of argmax go to the lower class.

    >>> import numpy as np
    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])  # (C, *spatial): 2 classes, 4 voxels
    >>> labels = np.array([1, 0, 0, 0])
    >>> # confidences 0.8 (right), 0.8 (wrong), 0.7, 0.9 (right): 2/4 * |0.5 - 0.8| + 1/4 * 0.3 + 1/4 * 0.1
    >>> ece(probs, labels, num_bins=10, foreground="all")
    0.25
    >>> round(ece(probs, labels, num_bins=10), 4)  # foreground="gt": voxel 0 only, |1 - 0.8|
    0.2
    """
    return calibration_errors(probs, labels, ("ece",), num_bins, foreground)["ece"]


def cece(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt", include_background: bool = True) -> float:
    """Classwise ECE (Kull et al., NeurIPS 2019; NACL Eq. 11), pooled over all volumes given.

    ``CECE = 1/K sum_k sum_b |B_kb| / N * |mean_{B_kb} [y == k] - mean_{B_kb} p_k|``, equal-width bins of ``p_k``.
    ``include_background=True`` (default) keeps class 0. The classes are all C channels, and a voxel with
    ``p_k == 0`` falls in the first bin.

    >>> import numpy as np
    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])  # (C, *spatial): 2 classes, 4 voxels
    >>> labels = np.array([1, 0, 0, 0])
    >>> # class 1: 2/4 * |0.5 - 0.8| + 1/4 * |0 - 0.3| + 1/4 * |0 - 0.1| = 0.25; class 0 likewise
    >>> cece(probs, labels, num_bins=10, foreground="all")
    0.25
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
    on voxel order. Classes without any voxel above the threshold are left out of the mean.

    >>> import numpy as np
    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])  # (C, *spatial): 2 classes, 4 voxels
    >>> labels = np.array([1, 0, 0, 0])
    >>> # class 1 sorted: (0.1, 0.3 | 0.8, 0.8), 2 bins: 1/2 * |0 - 0.2| + 1/2 * |0.5 - 0.8| = 0.25; class 0 likewise
    >>> round(tace(probs, labels, num_bins=2, foreground="all"), 4)
    0.25
    """
    return calibration_errors(probs, labels, ("tace",), num_bins, foreground, include_background, threshold)["tace"]


def ace(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt", include_background: bool = True) -> float:
    """Adaptive calibration error (Nixon et al., CVPR-W 2019), pooled over all volumes given: TACE without the
    threshold (every p_k is binned).

    Not netcal's ``ACE`` (the "average calibration error", an unweighted mean over equal-width bins).

    >>> import numpy as np
    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])  # (C, *spatial): 2 classes, 4 voxels
    >>> labels = np.array([1, 0, 0, 0])
    >>> round(ace(probs, labels, num_bins=2, foreground="all"), 4)  # no probability below 1e-3: TACE's value
    0.25
    """
    return calibration_errors(probs, labels, ("ace",), num_bins, foreground, include_background)["ace"]


def nll(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt") -> float:
    """Mean negative log-likelihood ``-1/N sum_i log p_{i, y_i}`` (p clamped at 1e-12), pooled over all volumes given.
    ``num_bins`` is unused.

    >>> import numpy as np
    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])  # (C, *spatial): 2 classes, 4 voxels
    >>> labels = np.array([1, 0, 0, 0])
    >>> round(nll(probs, labels, foreground="all"), 4)  # -(log 0.8 + log 0.2 + log 0.7 + log 0.9) / 4
    0.5737
    """
    return calibration_errors(probs, labels, ("nll",), num_bins, foreground)["nll"]


def brier(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt") -> float:
    """Multiclass Brier score (Brier, 1950) ``1/N sum_i sum_k (p_ik - [y_i == k])^2``, pooled over all volumes given.
    ``num_bins`` is unused.

    >>> import numpy as np
    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])  # (C, *spatial): 2 classes, 4 voxels
    >>> labels = np.array([1, 0, 0, 0])
    >>> round(brier(probs, labels, foreground="all"), 4)  # (0.08 + 1.28 + 0.18 + 0.02) / 4
    0.39
    """
    return calibration_errors(probs, labels, ("brier",), num_bins, foreground)["brier"]
