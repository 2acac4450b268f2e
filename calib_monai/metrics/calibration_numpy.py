"""Calibration statistics in NumPy (CPU): the path of NumPy inputs, and the reference of the torch path.

Per volume (or chunk) of selected voxels ``p (C, n)``, ``y (n,)``: per-bin counts accumulated in int64 and sums in
float64 (``numpy.bincount``), so the values do not drift however many voxels are pooled (float32 accumulators stop
counting at 2**24). The work is one bucketing pass per metric, no Python loop over bins or voxels.
``calibration_torch.py`` computes the same statistics with torch on the inputs' device; the tests hold both equal.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Any

import numpy as np

from ._inputs import prepare_inputs, select_voxels, warn_empty_selection

__all__ = [
    "CLASSWISE_METRICS",
    "NLL_EPS",
    "bin_edge_tables",
    "equal_width_bin_index",
    "numpy_calibration_errors",
    "threshold_for_dtype",
    "value_from_statistics",
]

# Probabilities are clamped to this before the log of the NLL, so a wrong prediction with p = 0 costs 27.6 nats.
NLL_EPS = 1e-12
# Most buckets of the first histogram pass of the equal-mass binning (a power of two: v * 2**k is exact).
_ADAPTIVE_BUCKETS = 1 << 18
# Voxels per chunk of the additive statistics.
_CHUNK = 1 << 20
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
# Per-volume statistics (additive over volumes for the equal-width and mean metrics)
# ----------------------------------------------------------------------------------------------------------------


def _binned_sums(v: np.ndarray, hit: np.ndarray, num_bins: int) -> np.ndarray:
    """``(M, 3)``: per equal-width bin of ``v``, [count, sum of v, number of hits] (int64 counts, float64 sums)."""
    index = equal_width_bin_index(v, num_bins)
    index *= 2
    index += hit
    counts = np.bincount(index, minlength=2 * num_bins).reshape(num_bins, 2)
    sums = np.bincount(index, weights=v, minlength=2 * num_bins).reshape(num_bins, 2).sum(axis=1)
    return np.stack([counts.sum(axis=1), sums, counts[:, 1]], axis=1).astype(np.float64)


def _first_argmax(p: np.ndarray, conf: np.ndarray) -> np.ndarray:
    """``argmax`` over axis 0 (lowest class on ties) given ``conf = p.max(0)``; numpy's axis-0 argmax is 3x slower."""
    pred = np.zeros(p.shape[1], dtype=np.int64)
    for k in range(p.shape[0] - 1, -1, -1):  # down to class 0: a tie with class 0 must end on 0
        pred[p[k] == conf] = k
    return pred


def _ece_stats(p: np.ndarray, y: np.ndarray, num_bins: int) -> np.ndarray:
    """``(M, 3)``: per top-label confidence bin, [count, sum of confidences, number of correct predictions]."""
    conf = p.max(axis=0)
    return _binned_sums(conf, _first_argmax(p, conf) == y, num_bins)


def _cece_stats(p: np.ndarray, y: np.ndarray, num_bins: int, index: np.ndarray | None = None) -> np.ndarray:
    """``(C, M, 3)``: per class k and bin of p_k, [count, sum of p_k, number of voxels labelled k].

    All classes go through one bucketing pass and two ``bincount`` calls (keys ``k * M + bin``); the hits need only
    the bin of each voxel's own class. ``index``: the equal-width bin indices of ``p`` when already computed.
    """
    num_classes = p.shape[0]
    if index is None:
        index = equal_width_bin_index(p, num_bins)
    own = np.take_along_axis(index, y[None], axis=0)[0]  # bin of p_y (y checked to lie in [0, C))
    own += y * np.int64(num_bins)
    keys = index + (np.arange(num_classes, dtype=np.int64) * num_bins)[:, None]
    size = num_classes * num_bins
    counts = np.bincount(keys.ravel(), minlength=size)
    sums = np.bincount(keys.ravel(), weights=p.ravel(), minlength=size)
    hits = np.bincount(own, minlength=size)
    return np.stack([counts, sums, hits], axis=1).astype(np.float64).reshape(num_classes, num_bins, 3)


def _ece_cece_stats(p: np.ndarray, y: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """ECE and CECE statistics from one bucketing of ``p``: the top-label bin is the largest class bin."""
    index = equal_width_bin_index(p, num_bins)
    cece_stats = _cece_stats(p, y, num_bins, index)
    conf = p.max(axis=0)
    correct = _first_argmax(p, conf) == y
    conf_bin = index.max(axis=0)  # the bins are monotone in p_k, so max_k bin(p_k) = bin(max_k p_k)
    conf_bin *= 2
    conf_bin += correct
    counts = np.bincount(conf_bin, minlength=2 * num_bins).reshape(num_bins, 2)
    sums = np.bincount(conf_bin >> 1, weights=conf, minlength=num_bins)
    ece_stats = np.stack([counts.sum(axis=1), sums, counts[:, 1]], axis=1).astype(np.float64)
    return ece_stats, cece_stats


def _nll_stats(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    p_true = np.take_along_axis(p, y[None], axis=0)[0].astype(np.float64)
    return np.array([p_true.size, -np.log(np.maximum(p_true, NLL_EPS)).sum()])


def _brier_stats(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    # sum_k (p_k - [y = k])^2 = sum_k p_k^2 - 2 p_y + 1
    x = p.astype(np.float64)
    p_true = np.take_along_axis(x, y[None], axis=0)[0]
    return np.array([y.size, float(np.einsum("cn,cn->", x, x) - 2.0 * p_true.sum() + y.size)])


def _order_key(v: np.ndarray, t: np.ndarray) -> np.ndarray:
    """int64 key sorting by (v, t) for non-negative floats: their bit patterns are ordered like their values."""
    v = v + 0.0  # turns -0.0 into 0.0
    bits = v.view(np.int32).astype(np.int64) if v.dtype == np.float32 else v.astype(np.float64).view(np.int64)
    return (bits << 1) | t


def _key_value(key: np.ndarray, dtype: np.dtype) -> np.ndarray:
    bits = key >> 1
    if dtype == np.float32:
        return bits.astype(np.int32).view(np.float32).astype(np.float64)
    return bits.view(np.float64)


def _adaptive_class_error(v: np.ndarray, t: np.ndarray, num_bins: int) -> float:
    """Equal-mass calibration error of one class: ``sum_r |sum_{i in r} t_i - sum_{i in r} v_i| / n``.

    Bin r holds the sorted positions ``[floor(r n / R), floor((r + 1) n / R))``; voxels are ordered by (v, t), so
    the result does not depend on voxel order. Instead of sorting all n values, prefix sums at the R + 1 bin edges
    come from a histogram of up to 2**18 buckets, refined exactly (``np.unique`` of the bit patterns) only in the
    buckets that an edge cuts.
    """
    n = v.size
    if n == 0:
        return float("nan")
    # ~n / 16 buckets, a power of two: small histograms, and an edge's bucket holds few voxels to refine
    buckets = 1 << min(_ADAPTIVE_BUCKETS.bit_length() - 1, max(4, n.bit_length() - 4))
    q2 = (v * buckets).astype(np.int64)  # exact floor: scaling by a power of two
    q2 *= 2
    q2 += t  # histogram key: bucket * 2 + [y == k]
    both = np.bincount(q2, minlength=2 * buckets + 2)
    sum_v = np.bincount(q2, weights=v.astype(np.float64), minlength=2 * buckets + 2)  # float64 weights: 2x faster
    cum_n = np.concatenate([[0], np.cumsum(both[0::2] + both[1::2])])
    cum_t = np.concatenate([[0], np.cumsum(both[1::2])]).astype(np.float64)
    cum_v = np.concatenate([[0.0], np.cumsum(sum_v[0::2] + sum_v[1::2])])

    edges = (np.arange(num_bins + 1, dtype=np.int64) * n) // num_bins
    bucket = np.searchsorted(cum_n, edges, side="right") - 1  # edge n maps to index Q + 1 with offset 0
    offset = edges - cum_n[bucket]
    f_v, f_t = cum_v[bucket].copy(), cum_t[bucket].copy()
    cut = offset > 0
    if cut.any():
        lut = np.zeros(2 * buckets + 2, dtype=bool)
        lut[2 * bucket[cut]] = lut[2 * bucket[cut] + 1] = True
        inside = lut[q2]
        keys, key_counts = np.unique(_order_key(v[inside], t[inside]), return_counts=True)
        values = _key_value(keys, v.dtype)
        is_t = (keys & 1).astype(np.float64)
        key_bucket = (values * buckets).astype(np.int64)
        pre_n = np.concatenate([[0], np.cumsum(key_counts)])
        pre_v = np.concatenate([[0.0], np.cumsum(values * key_counts)])
        pre_t = np.concatenate([[0.0], np.cumsum(is_t * key_counts)])
        first = np.searchsorted(key_bucket, bucket[cut], side="left")  # first distinct key of each cut bucket
        target = pre_n[first] + offset[cut]
        cell = np.searchsorted(pre_n, target, side="right") - 1  # distinct key holding the edge
        partial = target - pre_n[cell]
        f_v[cut] += pre_v[cell] - pre_v[first] + partial * values[cell]
        f_t[cut] += pre_t[cell] - pre_t[first] + partial * is_t[cell]
    return float(np.abs(np.diff(f_t) - np.diff(f_v)).sum() / n)


def _adaptive_error(
    parts: list[tuple[np.ndarray, np.ndarray]], num_bins: int, threshold: float | None, classes: range
) -> float:
    """Mean over classes (with at least one voxel above ``threshold``) of the equal-mass error of p_k vs [y = k]."""
    errors = []
    for k in classes:
        vs, ts = [], []
        for p, y in parts:
            v = p[k]
            if threshold is None:
                vs.append(v)
                ts.append(y == k)
            else:
                keep = np.flatnonzero(v > threshold_for_dtype(threshold, v.dtype))
                vs.append(v[keep])
                ts.append(y[keep] == k)
        v_all, t_all = (vs[0], ts[0]) if len(vs) == 1 else (np.concatenate(vs), np.concatenate(ts))
        err = _adaptive_class_error(v_all, t_all, num_bins)
        if not np.isnan(err):
            errors.append(err)
    return float(np.mean(errors)) if errors else float("nan")


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


def numpy_calibration_errors(
    probs: Any,
    labels: Any,
    names: list[str],
    num_bins: int,
    foreground: str,
    include_background: bool,
    threshold: float,
) -> dict[str, float]:
    """``calibration_errors`` of NumPy inputs (see there), on the CPU."""
    p, y = prepare_inputs(probs, labels)
    num_classes = p.shape[1]
    wanted = set(names)
    totals: dict[str, np.ndarray] = {}
    parts = []

    def add(name: str, value: np.ndarray) -> None:
        totals[name] = value if name not in totals else totals[name] + value

    classwise = [name for name in CLASSWISE_METRICS if name in wanted]  # CECE and mL1-ACE share their statistics
    selected = 0
    for b in range(p.shape[0]):
        pb, yb = select_voxels(p[b], y[b], foreground)
        selected += yb.size
        if "ece" in wanted or classwise:
            for start in range(0, max(pb.shape[1], 1), _CHUNK):
                pc, yc = pb[:, start : start + _CHUNK], yb[start : start + _CHUNK]
                if "ece" in wanted and classwise:
                    ece_stats, cece_stats = _ece_cece_stats(pc, yc, num_bins)
                    add("ece", ece_stats.ravel())
                elif "ece" in wanted:
                    add("ece", _ece_stats(pc, yc, num_bins).ravel())
                    continue
                else:
                    cece_stats = _cece_stats(pc, yc, num_bins)
                for name in classwise:
                    add(name, cece_stats.ravel())
        for name, stats_fn in (("nll", _nll_stats), ("brier", _brier_stats)):
            if name in wanted:
                for start in range(0, max(pb.shape[1], 1), _CHUNK):
                    add(name, stats_fn(pb[:, start : start + _CHUNK], yb[start : start + _CHUNK]))
        if "tace" in wanted or "ace" in wanted:
            parts.append((pb, yb))
    if selected == 0:
        warn_empty_selection(foreground, stacklevel=4)

    classes = range(0 if include_background else 1, num_classes)
    out = {}
    for name in names:
        if name in ("tace", "ace"):
            out[name] = _adaptive_error(parts, num_bins, threshold if name == "tace" else None, classes)
        else:
            out[name] = value_from_statistics(totals[name], name, num_bins, num_classes, include_background)
    return out
