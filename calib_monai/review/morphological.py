"""The morphological margin of Mossina and Friedrich (2025, "Conformal prediction for image segmentation using
morphological prediction sets"): the prediction dilated (outer) or eroded (inner) by ``d`` voxels (6-connected steps
in 3D, 4-connected in 2D), ``d`` the same for every case and chosen conformally on the validation subjects with the
guarantee of :mod:`calib_monai.review.contours` (per case: the outer set holds ``1 - eps`` of the true structure,
the inner set lies ``1 - eps`` inside it, each with probability ``1 - alpha``). The baseline the contours from
calibrated probabilities are compared with: it needs no probabilities, only the segmentation.

>>> import numpy as np
>>> truth = np.zeros((9, 9), bool); truth[2:7, 2:7] = True
>>> pred = np.zeros((9, 9), bool); pred[3:6, 3:6] = True
>>> morphological_requirements(pred, truth, epsilon=0.0)
(2.0, 0.0)
>>> choose_margin([0, 1, 1, 2, 3, 1, 0, 2, 2], alpha=0.1)
3
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import ndimage

from calib_monai.defaults import CONTOUR_ALPHA, CONTOUR_EPSILON
from calib_monai.review.conformal import flag_rank

__all__ = ["MAX_MARGIN", "choose_margin", "morphological_contours", "morphological_requirements"]

MAX_MARGIN = 32  # voxels: a case needing more counts as needing more than any margin


def _allowed(epsilon: float, count: int) -> int:
    return math.floor(epsilon * count + 1e-9)


def morphological_requirements(
    pred: np.ndarray, truth: np.ndarray, epsilon: float = CONTOUR_EPSILON, max_margin: int = MAX_MARGIN
) -> tuple[float, float]:
    """``(d_out, d_in)`` one volume requires of one structure (boolean masks of the prediction and the truth): the
    fewest dilations after which the prediction misses at most ``eps`` of the truth (the miss only falls with ``d``;
    ``inf`` beyond ``max_margin``), and the fewest erosions from which on every eroded prediction has at most ``eps``
    of its voxels outside the truth (not monotone in ``d``: every larger ``d`` is asked too; an empty set holds)."""
    pred, truth = np.asarray(pred, bool), np.asarray(truth, bool)
    structure = ndimage.generate_binary_structure(pred.ndim, 1)
    n_true, d_out, grown = int(truth.sum()), math.inf, pred
    for d in range(max_margin + 1):
        if int((truth & ~grown).sum()) <= _allowed(epsilon, n_true):
            d_out = d
            break
        grown = ndimage.binary_dilation(grown, structure)
    losses, shrunk = [], pred
    for _ in range(max_margin + 1):
        size = int(shrunk.sum())
        losses.append(size > 0 and int((shrunk & ~truth).sum()) > _allowed(epsilon, size))
        if size == 0:
            break
        shrunk = ndimage.binary_erosion(shrunk, structure)
    failing = [d for d, bad in enumerate(losses) if bad]
    if losses[-1]:  # still wrong, and not yet empty, at max_margin
        return float(d_out), math.inf
    return float(d_out), float(failing[-1] + 1 if failing else 0)


def choose_margin(required: Sequence[float], alpha: float = CONTOUR_ALPHA) -> float | None:
    """The ``k = ceil((m + 1)(1 - alpha))``-th smallest of the ``m`` subjects' required margins (each subject's
    largest over its volumes): a new subject needs more with probability at most ``alpha``; None when
    ``m < 1 / alpha - 1`` (or that margin is ``inf``: beyond :data:`MAX_MARGIN`)."""
    m = len(required)
    j = flag_rank(alpha, m)
    if j == 0:
        return None
    chosen = sorted(float(r) for r in required)[m - j]
    return int(chosen) if math.isfinite(chosen) else None


def morphological_contours(pred: np.ndarray, d_out: int, d_in: int) -> tuple[np.ndarray, np.ndarray]:
    """``(inner, outer)``: the boolean prediction eroded by ``d_in`` and dilated by ``d_out`` voxels."""
    pred = np.asarray(pred, bool)
    structure = ndimage.generate_binary_structure(pred.ndim, 1)
    outer = ndimage.binary_dilation(pred, structure, iterations=d_out) if d_out > 0 else pred.copy()
    inner = ndimage.binary_erosion(pred, structure, iterations=d_in) if d_in > 0 else pred.copy()
    return inner, outer
