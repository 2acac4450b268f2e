"""The host side of the calibration metrics (NumPy): the one bin rule and metric values from per-bin statistics.

The statistics themselves are computed by one implementation, ``calibration_torch.py``, on the inputs' device (NumPy
inputs as CPU tensors); what comes back to the host is per-bin counts and sums, turned into values here. The tests
hold the values equal to a float64 brute force. (Before: a second, NumPy implementation of every statistic.)
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = [
    "CLASSWISE_METRICS",
    "NLL_EPS",
    "bin_edge_tables",
    "equal_width_bin_index",
    "threshold_for_dtype",
    "value_from_statistics",
]

# Probabilities are clamped to this before the log of the NLL, so a wrong prediction with p = 0 costs 27.6 nats.
NLL_EPS = 1e-12
#: Metrics computed from the same per-class equal-width statistics ``(C, M, 3)`` (``_cece_stats``).
CLASSWISE_METRICS = ("cece", "ml1ace")


def threshold_for_dtype(threshold: float, dtype: np.dtype) -> np.floating:
    """The largest value of ``dtype`` not above ``threshold``: ``v > result`` is ``v > threshold`` as real numbers.

    A plain ``v > 1e-3`` on float32 values compares with float32(1e-3) = 0.0010000000475 (NumPy 2 and torch cast
    the scalar), which would drop v = float32(1e-3) although it exceeds 1e-3.
    """
    t = np.asarray(threshold, dtype=dtype)
    if float(t) > threshold:
        t = np.nextafter(t, np.asarray(-1.0, dtype=dtype))
    return t[()]


def _nearest(k: int, m: int, dtype: np.dtype) -> float:
    """``k / m`` rounded to the nearest value of ``dtype`` (exactly: compared as fractions), as a float64."""
    target = Fraction(k, m)
    x = np.asarray(k / m, dtype=dtype)
    candidates = (x, np.nextafter(x, np.asarray(-1.0, dtype=dtype)), np.nextafter(x, np.asarray(2.0, dtype=dtype)))
    return float(min(candidates, key=lambda c: abs(Fraction(float(c)) - target)))


@functools.lru_cache(maxsize=64)
def bin_edge_tables(num_bins: int, dtype: str = "float64") -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` float64 edges of the ``num_bins`` equal-width bins for values of ``dtype``: bin ``k`` holds
    ``lower[k] < v <= upper[k]``, with ``e_k = k / M`` rounded to the nearest ``dtype`` value (exact in float64);
    ``lower[0] = -inf`` (so 0 goes to bin 0) and ``upper[M - 1] = +inf``. See :func:`equal_width_bin_index`."""
    fdtype = np.dtype(dtype)
    edges = np.array([_nearest(k, num_bins, fdtype) for k in range(num_bins + 1)], dtype=np.float64)
    edges[0], edges[-1] = -np.inf, np.inf
    return edges[:-1], edges[1:]


def _edge_dtype(values: np.ndarray) -> str:
    return str(values.dtype) if np.issubdtype(values.dtype, np.floating) else "float64"


def equal_width_bin_index(values: np.ndarray, num_bins: int) -> np.ndarray:
    """Index of the equal-width bin holding each value in ``[0, 1]``: the one bin rule of every calibration metric.

    Bin ``k`` is ``(e_k, e_{k+1}]`` with ``e_k = k / M`` **rounded to the values' own floating-point type** (float32
    edges for float32 confidences), and 0 goes to bin 0. So a float32 confidence that lies on an edge, i.e. equals
    float32(k / M), falls in the **lower** bin, as in MONAI's ``calibration_binning`` (its ``small_left_edge`` test:
    0.2, 0.4, 0.6, 0.8 with 5 bins land in bins 0..3) and in the authors' code (``conf > lo and conf <= hi`` on a
    float32 tensor, i.e. in float32). float32(k / M) is not k / M: float32(0.2) = 0.2000000030 lies above 0.2, so the
    rule "edges at k / M as real numbers" would put it in the upper bin. (The authors' edges come from
    ``torch.linspace``, which for some M, e.g. 15, rounds a few edges one float32 step away from the nearest float32;
    only a value exactly on such an edge is binned differently.)

    Computed as ``ceil(v * M) - 1`` in float64 (exact for float32 ``v``), then moved to the neighbouring bin where
    the rounded edges say so: a gather and a comparison, no search.
    """
    lower, upper = bin_edge_tables(int(num_bins), _edge_dtype(values))
    scaled = np.multiply(values, float(num_bins), dtype=np.float64)
    np.ceil(scaled, out=scaled)
    index = scaled.astype(np.int64)
    index -= 1
    np.clip(index, 0, num_bins - 1, out=index)
    index -= values <= lower[index]
    index += values > upper[index]
    return index


# ----------------------------------------------------------------------------------------------------------------
# Statistics -> values, and the NumPy path of calibration_errors
# ----------------------------------------------------------------------------------------------------------------


def value_from_statistics(
    stats: Any,
    metric_name: str,
    num_bins: int = 15,
    num_classes: int | None = None,
    include_background: bool = True,
) -> float:
    """Metric value from (possibly summed) ``volume_statistics``; NaN when no voxel was selected.

    - ECE (Guo et al., ICML 2017; NACL Eq. 10):
      ``sum_b |B_b| / N * |acc_b - conf_b| = sum_b |correct_b - sum conf_b| / N``.
    - CECE (Kull et al., NeurIPS 2019; NACL Eq. 11): ``1/K sum_k sum_b |B_kb| / N * |acc_kb - conf_kb|``. Eq. 11 has
      no 1/K; the authors' code (``ClasswiseECELoss``) averages over classes, and so do we.
    - mL1-ACE (Barfoot et al., arXiv:2506.03942): ``1/K sum_k 1/|{b: B_kb != {}}| sum_{b: B_kb != {}}
      |acc_kb - conf_kb|``, the same bins as CECE but every non-empty bin weighted equally.
    """
    if hasattr(stats, "detach"):  # a (small) torch tensor of statistics
        stats = stats.detach().cpu().numpy()
    stats = np.asarray(stats, dtype=np.float64)
    if metric_name in ("tace", "ace"):
        return float(stats.reshape(-1)[0])
    if metric_name in ("nll", "brier"):
        count, total = stats.reshape(-1)[:2]
        return float(total / count) if count > 0 else float("nan")
    if metric_name == "ece":
        bins = stats.reshape(num_bins, 3)
        n = bins[:, 0].sum()
        return float(np.abs(bins[:, 2] - bins[:, 1]).sum() / n) if n > 0 else float("nan")
    if num_classes is None:
        num_classes = stats.size // (num_bins * 3)
    bins = stats.reshape(num_classes, num_bins, 3)
    n = bins[0, :, 0].sum()
    if n == 0:
        return float("nan")
    if metric_name == "ml1ace":
        # every class bins the same n > 0 voxels, so each has at least one non-empty bin
        occupied = bins[..., 0] > 0
        gaps = np.abs(bins[..., 2] - bins[..., 1]) / np.where(occupied, bins[..., 0], 1.0)
        per_class = gaps.sum(axis=1) / occupied.sum(axis=1)
    else:
        per_class = np.abs(bins[..., 2] - bins[..., 1]).sum(axis=1) / n
    return float(per_class[0 if include_background else 1 :].mean())
