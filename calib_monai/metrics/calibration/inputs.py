"""The inputs of the calibration metrics: options, metric definitions, the checks and the voxel selection.

NumPy arrays become CPU tensors without a copy (``as_tensors``); ``prepare_tensors`` / ``select_voxels`` work on the
tensors' device and check only the selected voxels (what is scored; a volume with nothing selected is checked whole).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from calib_monai.checks import PROBABILITY_ROUNDING, check_number, check_option, check_positive_int
from calib_monai.defaults import L1ACE_NUM_BINS, NUM_BINS
from calib_monai.tensors import detached_plain_tensor

__all__ = [
    "CALIBRATION_METRICS",
    "FOREGROUND_MODES",
    "METRIC_DEFINITIONS",
    "POOLABLE_METRICS",
    "REDUCTIONS",
    "as_tensors",
    "check_foreground",
    "check_metric",
    "metric_definition",
    "prepare_tensors",
    "probability_problem",
    "select_voxels",
    "selected_voxels",
]

CALIBRATION_METRICS = ("ece", "cece", "tace", "ace", "ml1ace", "nll", "brier")
#: Metrics whose per-volume statistics add up to the statistics of the pooled voxels (equal-width bins, sums).
POOLABLE_METRICS = ("ece", "cece", "ml1ace", "nll", "brier")
#: Reductions over volumes: the mean of per-volume values, all voxels binned together, or the per-volume values.
REDUCTIONS = ("mean", "pooled", "none")
#: Voxel selections: "gt" (label != 0, the papers' default), "union" (label != 0 or argmax != 0), "all".
FOREGROUND_MODES = ("gt", "union", "all")

# Tolerance of the check that the class probabilities of a voxel sum to one (float16 / float32 softmax outputs).
_SUM_TOLERANCE = 1e-2
_SELECTION_TEXT = {"gt": "label != 0", "union": "label != 0 or argmax != 0", "all": "every voxel"}


def check_foreground(foreground: Any) -> str:
    """``foreground`` if it is one of ``FOREGROUND_MODES``, else ``"foreground must be one of ..."``."""
    return str(check_option("foreground", foreground, FOREGROUND_MODES))


def check_metric(metric_name: Any, threshold: Any, named: bool = False) -> str:
    """``metric_name`` if it is a calibration metric (``named``: or a name of ``METRIC_DEFINITIONS``), and a
    ``threshold`` in [0, 1) (or None)."""
    known = CALIBRATION_METRICS + tuple(n for n in METRIC_DEFINITIONS if n not in CALIBRATION_METRICS) * named
    check_option("metric_name", metric_name, known)
    if threshold is not None:
        check_number("threshold", threshold, 0, 1, high_open=True, wanted="a float in [0, 1)")
    return str(metric_name)


#: Metrics defined with their voxels, classes and bins: ``name: (formula, foreground, include_background, num_bins)``:
#: mL1-ACE as Barfoot et al. (arXiv:2506.03942), on the ground-truth foreground, and the classwise ECE over every voxel
#: (MONAI's ``CalibrationErrorMetric``).
METRIC_DEFINITIONS = {
    "ml1ace": ("ml1ace", "all", False, L1ACE_NUM_BINS),
    "ml1ace_gt": ("ml1ace", "gt", True, NUM_BINS),
    "cece_all": ("cece", "all", False, L1ACE_NUM_BINS),
}
#: Names that say their voxels: another ``foreground`` contradicts them.
_FIXED_VOXELS = ("ml1ace_gt", "cece_all")


def metric_definition(
    metric_name: str, num_bins: Any = None, foreground: Any = None, include_background: Any = None
) -> tuple[str, int, str, bool]:
    """``(formula, num_bins, foreground, include_background)`` of ``metric_name``: arguments left None take the
    metric's definition (``METRIC_DEFINITIONS``; other metrics: ground-truth foreground, background included,
    ``NUM_BINS`` bins, as NACL / MbLS / CRaC); a ``foreground`` contradicting a name that says its voxels raises."""
    formula, own_foreground, own_background, own_bins = METRIC_DEFINITIONS.get(
        metric_name, (metric_name, "gt", True, NUM_BINS)
    )
    if metric_name in _FIXED_VOXELS and foreground not in (None, own_foreground):
        raise ValueError(
            f"foreground of metric {metric_name!r} must be {own_foreground!r} (its definition), got {foreground!r}."
        )
    num_bins = check_positive_int("num_bins", own_bins if num_bins is None else num_bins)
    foreground = check_foreground(own_foreground if foreground is None else foreground)
    return formula, num_bins, foreground, own_background if include_background is None else bool(include_background)


def probability_problem(
    name: str,
    lo: float,
    hi: float,
    sum_lo: float,
    sum_hi: float,
    class_dim: int = 1,
    tolerance: float = _SUM_TOLERANCE,
) -> str | None:
    """The error message for probabilities with extremes ``[lo, hi]`` and class sums in ``[sum_lo, sum_hi]``, or None
    (sums within ``tolerance`` of 1 pass); logits, the usual mistake, are named with the fix."""
    fix = (
        f"it looks like logits: apply torch.softmax(x, dim={class_dim}) (NumPy: scipy.special.softmax(x, "
        f"axis={class_dim})) to the network output first"
    )
    if not all(np.isfinite(v) for v in (lo, hi, sum_lo, sum_hi)):
        return f"{name} must hold finite softmax probabilities, got NaN or infinite values (range [{lo}, {hi}])."
    if lo < 0.0 or hi > 1.0:
        bad = lo if lo < 0.0 else hi
        if -PROBABILITY_ROUNDING <= lo and hi <= 1.0 + PROBABILITY_ROUNDING:  # float rounding, not logits
            fix = "clip them into [0, 1] where they are made (calib_monai.checks.clip_probability_rounding)"
        return (
            f"{name} must lie in [0, 1] (softmax probabilities over the class dimension {class_dim}), but it "
            f"holds the value {bad:.9g} (values seen in [{lo:.9g}, {hi:.9g}]); {fix}."
        )
    bad = sum_hi if sum_hi - 1.0 >= 1.0 - sum_lo else sum_lo
    if abs(bad - 1.0) > tolerance:
        return (
            f"{name} must sum to 1 (within {tolerance:.3g}) over the class dimension {class_dim}, but the class "
            f"probabilities of a voxel sum to {bad:.6g}; {fix} (a sigmoid output p of one class: stack [1 - p, p])."
        )
    return None


def warn_empty_selection(foreground: str, volumes: list[int] | None = None, stacklevel: int = 3) -> None:
    """``UserWarning`` that nothing was selected: the value is NaN (kept) and left out of means over volumes."""
    where = "the volume has" if volumes is None else f"volume(s) {volumes} have"
    hint = "; use foreground='all' to score every voxel" if foreground != "all" else ""
    warnings.warn(
        f"{where} no foreground voxels to score (foreground={foreground!r}: {_SELECTION_TEXT[foreground]}), so the "
        f"calibration value is NaN and is left out of the mean over volumes{hint}, or check the labels (all 0?).",
        UserWarning,
        stacklevel=stacklevel,
    )


def _layout(p_shape: tuple[int, ...], y_shape: tuple[int, ...]) -> bool:
    """True for batched ``probs (B, C, *spatial)``, False for ``(C, *spatial)``; raises on shapes that do not fit."""
    if len(p_shape) < 2:
        raise ValueError(f"probs must have shape (B, C, *spatial) or (C, *spatial), got shape {tuple(p_shape)}.")
    if y_shape in ((p_shape[0], 1) + p_shape[2:], (p_shape[0],) + p_shape[2:]):
        batched = True
    elif y_shape == p_shape[1:]:
        batched = False
    else:
        raise ValueError(
            f"labels shape {tuple(y_shape)} does not fit probs shape {tuple(p_shape)}: expected labels of shape "
            f"(B, 1, *spatial) or (B, *spatial) for probs (B, C, *spatial), or (*spatial) for probs (C, *spatial)."
        )
    num_classes = p_shape[1] if batched else p_shape[0]
    if 0 in p_shape:
        raise ValueError(
            f"probs are empty (shape {tuple(p_shape)}): a batch without volumes or a volume without voxels; the "
            "calibration metrics need at least one voxel (check the data loader or the crop)."
        )
    if num_classes < 2:
        raise ValueError(
            f"probs must have at least 2 classes along the channel dimension, got {num_classes}; "
            "stack a sigmoid output p as [1 - p, p]."
        )
    return batched


def _check_label_range(ylo: int, yhi: int, num_classes: int) -> None:
    if ylo < 0 or yhi >= num_classes:
        raise ValueError(f"labels must lie in [0, {num_classes - 1}] for {num_classes} classes, got [{ylo}, {yhi}].")


def _numpy_tensor(x: Any, name: str) -> torch.Tensor:
    """A CPU tensor sharing a NumPy array's memory (a copy when not contiguous, wide unsigned or byte-swapped)."""
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a numeric array (probabilities or integer labels), got dtype {a.dtype}.")
    if (a.dtype.kind == "u" and a.dtype.itemsize > 1) or not a.dtype.isnative:
        a = a.astype(np.int64 if a.dtype.kind in "iu" else a.dtype.newbyteorder("="))
    return torch.from_numpy(np.ascontiguousarray(a))


def as_tensors(probs: Any, labels: Any) -> tuple[torch.Tensor, Any]:
    """``(probs, labels)`` for ``prepare_tensors``: tensors as they are, NumPy arrays and lists as CPU tensors."""
    if isinstance(probs, torch.Tensor):
        return probs, labels
    labels = labels if isinstance(labels, torch.Tensor) else _numpy_tensor(labels, "labels")
    return _numpy_tensor(probs, "probs"), labels


def prepare_tensors(probs: torch.Tensor, labels: Any, name: str = "probs") -> tuple[torch.Tensor, torch.Tensor, int]:
    """Views ``probs (B, C, N)`` and ``labels (B, N)`` (their own dtype) on ``probs``' device, and the class dimension
    of the caller's layout (for messages). ``labels (B, *spatial)`` is read batched where ``(*spatial)`` also fits."""
    p = detached_plain_tensor(probs)
    y = detached_plain_tensor(labels) if isinstance(labels, torch.Tensor) else torch.as_tensor(labels)
    y = y.to(p.device)  # no-op when already there
    if not p.is_floating_point():
        raise ValueError(f"{name} must be floating-point probabilities, got dtype {p.dtype}.")
    if y.is_complex():
        raise ValueError(f"labels must be an integer (or integral float) tensor, got dtype {y.dtype}.")
    batched = _layout(tuple(p.shape), tuple(y.shape))
    if not batched:
        p, y = p[None], y[None]
    return p.reshape(p.shape[0], p.shape[1], -1), y.reshape(p.shape[0], -1), 1 if batched else 0


def select_voxels(
    p: torch.Tensor, y: torch.Tensor, foreground: str, name: str = "probs", class_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Voxels of one volume the calibration metrics score, on ``p``'s device: ``(C, N)``, ``(N,)`` -> ``(C, n)``
    float, ``(n,)`` integer labels (their own dtype; bool as uint8, integral floats as int64), checked with one
    read-back of 6 numbers."""
    if foreground == "all":
        p_sel, y_sel = p, y
    else:
        mask = y
        if foreground == "union":
            mask = (y != 0) | (p[1:].amax(dim=0) > p[0])  # argmax != 0: a class beats class 0 (ties go to 0)
        index = mask.reshape(-1).nonzero().squeeze(1)
        p_sel, y_sel = p.index_select(1, index), y.index_select(0, index)
    if p_sel.dtype in (torch.float16, torch.bfloat16):
        p_sel = p_sel.float()  # selected voxels only
    checked = p_sel if y_sel.numel() else p
    if checked.numel():
        lo, hi = torch.aminmax(checked)
        sum_lo, sum_hi = torch.aminmax(checked.sum(dim=0, dtype=torch.float32))
        parts = [lo, hi, sum_lo, sum_hi]
        if y_sel.numel():
            ylo, yhi = torch.aminmax(y_sel) if y_sel.dtype != torch.bool else (y_sel.min(), y_sel.max())
            parts += [ylo, yhi]
        values = torch.stack([v.double() for v in parts]).tolist()
        problem = probability_problem(name, *values[:4], class_dim)
        if problem:
            raise ValueError(problem)
        if y_sel.numel():
            if y_sel.is_floating_point():
                as_int = y_sel.long()
                if not torch.equal(as_int.to(y_sel.dtype), y_sel):
                    raise ValueError(f"labels must hold integer class indices, got non-integral {y_sel.dtype} values.")
            _check_label_range(int(values[4]), int(values[5]), p.shape[0])
    if y_sel.is_floating_point():
        y_sel = y_sel.long()
    elif y_sel.dtype == torch.bool:
        y_sel = y_sel.view(torch.uint8)
    return p_sel, y_sel


def selected_voxels(
    probs: Any, labels: Any, foreground: str, name: str = "probs", pooled: bool = True
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each volume's checked, selected voxels ``(p (C, n), y (n,))`` on ``probs``' device (see ``prepare_tensors``);
    warns when nothing is selected (``pooled``: in all volumes; else naming each volume without a voxel)."""
    p, y, class_dim = prepare_tensors(*as_tensors(probs, labels), name)
    parts = [select_voxels(p[b], y[b], foreground, name, class_dim) for b in range(p.shape[0])]
    empty = [b for b, (_, yb) in enumerate(parts) if yb.shape[0] == 0]
    if empty and (not pooled or len(empty) == len(parts)):
        warn_empty_selection(foreground, None if pooled or len(parts) == 1 else empty, stacklevel=4)
    return parts
