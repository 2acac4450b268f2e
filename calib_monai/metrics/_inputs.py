"""Input checking shared by the calibration metrics: shapes, dtypes, value ranges, voxel selection and messages.

Two paths with the same checks and messages: NumPy arrays (``prepare_inputs`` / ``select_voxels``, on the CPU) and
torch tensors (``prepare_tensors`` / ``select_tensor_voxels``, on the tensors' device, nothing copied to the host but
a handful of reduced numbers). Both bring the inputs to ``probs (B, C, N)`` and ``labels (B, N)``, ``N`` the voxels
of one volume, and check the probabilities and labels of the selected voxels only: that is what is scored, and it
keeps the cost proportional to the foreground (a volume with nothing selected is checked whole).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

__all__ = [
    "FOREGROUND_MODES",
    "as_numpy",
    "as_plain_tensor",
    "check_foreground",
    "check_num_bins",
    "check_probabilities",
    "flat_nonzero",
    "prepare_inputs",
    "prepare_tensors",
    "probability_problem",
    "select_tensor_voxels",
    "select_voxels",
    "warn_empty_selection",
]

#: Voxel selections: "gt" (label != 0, the papers' default), "union" (label != 0 or argmax != 0), "all".
FOREGROUND_MODES = ("gt", "union", "all")

# Tolerance of the check that the class probabilities of a voxel sum to one (float16 / float32 softmax outputs).
_SUM_TOLERANCE = 1e-2
_SELECTION_TEXT = {"gt": "label != 0", "union": "label != 0 or argmax != 0", "all": "every voxel"}


def as_numpy(x: Any, name: str) -> np.ndarray:
    """A NumPy view (no copy on CPU) of a torch tensor (MetaTensor included), a NumPy array or a nested list."""
    if isinstance(x, torch.Tensor):
        x = as_plain_tensor(x)
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        return x.cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except Exception as e:  # pragma: no cover - message only
        raise ValueError(f"{name} must be a torch tensor or a numpy array, got {type(x).__name__}.") from e


def as_plain_tensor(x: torch.Tensor) -> torch.Tensor:
    """Detached plain tensor: a MetaTensor's ``__torch_function__`` would slow every following op."""
    x = x.detach()
    return x.as_tensor() if hasattr(x, "as_tensor") else x


def check_num_bins(num_bins: Any) -> int:
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"num_bins must be an integer >= 1, got {num_bins!r}.")
    return int(num_bins)


def check_foreground(foreground: Any) -> str:
    if foreground not in FOREGROUND_MODES:
        raise ValueError(f"foreground must be one of {FOREGROUND_MODES}, got {foreground!r}.")
    return str(foreground)


# ----------------------------------------------------------------------------------------------------------------
# messages


def probability_problem(
    name: str, lo: float, hi: float, sum_lo: float, sum_hi: float, class_dim: int = 1
) -> str | None:
    """The error message for probabilities with extremes ``[lo, hi]`` and class sums in ``[sum_lo, sum_hi]``, or None.

    The usual mistake is passing logits (or per-class sigmoids): the message says so and names the fix.
    """
    fix = (
        f"it looks like logits: apply torch.softmax(x, dim={class_dim}) (NumPy: scipy.special.softmax(x, "
        f"axis={class_dim})) to the network output first"
    )
    if not all(np.isfinite(v) for v in (lo, hi, sum_lo, sum_hi)):
        return f"{name} must hold finite softmax probabilities, got NaN or infinite values (range [{lo}, {hi}])."
    if lo < 0.0 or hi > 1.0:
        bad = lo if lo < 0.0 else hi
        return (
            f"{name} must lie in [0, 1] (softmax probabilities over the class dimension {class_dim}), but it "
            f"holds the value {bad:.6g} (values seen in [{lo:.6g}, {hi:.6g}]); {fix}."
        )
    bad = sum_hi if sum_hi - 1.0 >= 1.0 - sum_lo else sum_lo
    if abs(bad - 1.0) > _SUM_TOLERANCE:
        return (
            f"{name} must sum to 1 over the class dimension {class_dim}, but the class probabilities of a voxel "
            f"sum to {bad:.6g}; {fix} (a sigmoid output p of one class: stack [1 - p, p])."
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


# ----------------------------------------------------------------------------------------------------------------
# NumPy path


def _labels_to_int(labels: np.ndarray) -> np.ndarray:
    if labels.dtype == np.bool_:
        return labels.astype(np.int64)
    if np.issubdtype(labels.dtype, np.integer):
        return labels
    if np.issubdtype(labels.dtype, np.floating):
        # Loaded label maps are often float32: accept them when every value is a whole number.
        as_int = labels.astype(np.int64)
        if not np.array_equal(as_int, labels):
            raise ValueError(f"labels must hold integer class indices, got non-integral {labels.dtype} values.")
        return as_int
    raise ValueError(f"labels must be an integer (or integral float) array, got dtype {labels.dtype}.")


def prepare_inputs(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Check and reshape ``probs`` and ``labels`` (NumPy, on the CPU) to ``(B, C, N)`` and ``(B, N)``.

    Accepted layouts: ``probs (B, C, *spatial)`` with ``labels (B, 1, *spatial)`` or ``(B, *spatial)``, and
    ``probs (C, *spatial)`` with ``labels (*spatial)``. When ``labels`` has one dimension less than ``probs`` and both
    readings fit (only possible when ``B == C``), the batched reading ``(B, *spatial)`` is used.

    Raises:
        ValueError: non-floating probabilities, fewer than two classes, non-integral labels or shapes that do not
            match (value ranges are checked on the selected voxels by ``select_voxels``).
    """
    p = as_numpy(probs, "probs")
    y = as_numpy(labels, "labels")
    if not np.issubdtype(p.dtype, np.floating):
        raise ValueError(f"probs must be floating-point probabilities, got dtype {p.dtype}.")
    if _layout(p.shape, y.shape):
        p = p.reshape(p.shape[0], p.shape[1], -1)
        y = y.reshape(p.shape[0], -1)
    else:
        p = p.reshape(1, p.shape[0], -1)
        y = y.reshape(1, -1)
    return p, _labels_to_int(y)


def check_probabilities(p: np.ndarray, name: str = "probs", class_dim: int = 1) -> None:
    """``p (C, n)`` must be softmax outputs: values in [0, 1] summing to one over C (float32 tolerance 1e-2)."""
    if not p.size:
        return
    sums = p.sum(axis=0, dtype=np.float32)
    problem = probability_problem(name, float(p.min()), float(p.max()), float(sums.min()), float(sums.max()), class_dim)
    if problem:
        raise ValueError(problem)


def _check_label_range(ylo: int, yhi: int, num_classes: int) -> None:
    if ylo < 0 or yhi >= num_classes:
        raise ValueError(f"labels must lie in [0, {num_classes - 1}] for {num_classes} classes, got [{ylo}, {yhi}].")


def select_voxels(
    p: np.ndarray, y: np.ndarray, foreground: str, name: str = "probs", class_dim: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Voxels of one volume used by the calibration metrics: ``p (C, N)``, ``y (N,)`` -> ``(C, n)``, ``(n,)``."""
    if foreground == "all":
        p_sel, y_sel = p, y
    else:
        mask = y != 0
        if foreground == "union":
            mask |= p.argmax(axis=0) != 0
        index = np.flatnonzero(mask)
        # mode="clip" skips the bounds checks of valid sorted indices (2x faster than "raise")
        p_sel, y_sel = np.take(p, index, axis=1, mode="clip"), y[index]
    check_probabilities(p_sel if y_sel.size else p, name, class_dim)
    # Voxels left out have label 0 in every mode, so checking the selected labels checks them all.
    if y_sel.size:
        _check_label_range(int(y_sel.min()), int(y_sel.max()), p.shape[0])
    return p_sel, y_sel


# ----------------------------------------------------------------------------------------------------------------
# torch path (on the tensors' device)


def prepare_tensors(probs: torch.Tensor, labels: Any, name: str = "probs") -> tuple[torch.Tensor, torch.Tensor, int]:
    """Torch counterpart of ``prepare_inputs``: views ``(B, C, N)`` and ``(B, N)`` on ``probs``' device, and the
    class dimension of the caller's layout (for messages). Labels keep their dtype (converted once selected)."""
    p = as_plain_tensor(probs)
    y = as_plain_tensor(labels) if isinstance(labels, torch.Tensor) else torch.as_tensor(labels)
    y = y.to(p.device)  # no-op when already there
    if not p.is_floating_point():
        raise ValueError(f"{name} must be floating-point probabilities, got dtype {p.dtype}.")
    if y.is_complex():
        raise ValueError(f"labels must be an integer (or integral float) tensor, got dtype {y.dtype}.")
    batched = _layout(tuple(p.shape), tuple(y.shape))
    if not batched:
        p, y = p[None], y[None]
    return p.reshape(p.shape[0], p.shape[1], -1), y.reshape(p.shape[0], -1), 1 if batched else 0


def flat_nonzero(x: torch.Tensor) -> torch.Tensor:
    """int64 indices of the nonzero elements of a 1-D tensor, on its device. On the CPU: NumPy's ``flatnonzero`` of
    a zero-copy view (3x faster than ``torch.nonzero`` there; nothing leaves the CPU memory it is in)."""
    if x.device.type != "cpu":
        return x.nonzero().squeeze(1)
    view = x.as_subclass(torch.Tensor).numpy()  # the same memory
    return torch.from_numpy(np.flatnonzero(view if view.dtype == np.bool_ else view != 0))


def select_tensor_voxels(
    p: torch.Tensor, y: torch.Tensor, foreground: str, name: str = "probs", class_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch counterpart of ``select_voxels`` on ``p``'s device: ``(C, N)``, ``(N,)`` -> ``(C, n)`` float, ``(n,)``
    int64. The checks reduce on the device and bring 6 numbers to the host (one synchronisation)."""
    if foreground == "all":
        p_sel, y_sel = p, y
    else:
        mask = y
        if foreground == "union":
            mask = (y != 0) | (p[1:].amax(dim=0) > p[0])  # argmax != 0: a class beats class 0 (ties go to 0)
        index = flat_nonzero(mask)
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
    return p_sel, y_sel.long()
