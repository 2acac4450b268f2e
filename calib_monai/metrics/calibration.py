"""Calibration metrics of segmentation networks: ECE, CECE, TACE, ACE, NLL and Brier score.

All of them take softmax probabilities ``probs (B, C, *spatial)`` (or ``(C, *spatial)``) and integer labels
``(B, 1, *spatial)``, ``(B, *spatial)`` or ``(*spatial)``, and are computed over the voxels chosen by ``foreground``:

- ``"gt"``: ground-truth foreground (label != 0), as in NACL (Murugesan et al., MedIA 2024, Sec. 4), MbLS
  (Murugesan et al., 2023) and CRaC (MICCAI 2024), following Islam & Glocker (SVLS, IPMI 2021);
- ``"union"``: voxels that are foreground in the prediction (argmax != 0) or in the ground truth;
- ``"all"``: every voxel.

Counts are accumulated in int64 and sums in float64 (``numpy.bincount``), so the values do not drift however many
voxels are pooled (float32 accumulators stop counting at 2**24). The work is one bucketing pass per metric, no
Python loop over bins or voxels.

Reductions over volumes (``segmentation_calibration``): ``"none"`` (one value per volume), ``"mean"`` (unweighted
mean over volumes: the papers' tables, see ``calib_segment_test.py`` of Bala93/CRac) and ``"pooled"`` (all selected
voxels of all volumes binned together). A volume without selected voxels gets NaN and is left out of ``"mean"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._inputs import check_foreground, check_num_bins, prepare_inputs, select_voxels

__all__ = [
    "CALIBRATION_METRICS",
    "POOLABLE_METRICS",
    "calibration_errors",
    "ece",
    "cece",
    "tace",
    "ace",
    "nll",
    "brier",
    "segmentation_calibration",
    "volume_statistics",
    "value_from_statistics",
    "equal_width_bin_index",
]

CALIBRATION_METRICS = ("ece", "cece", "tace", "ace", "nll", "brier")
#: Metrics whose per-volume statistics add up to the statistics of the pooled voxels (equal-width bins, sums).
POOLABLE_METRICS = ("ece", "cece", "nll", "brier")
REDUCTIONS = ("mean", "pooled", "none")

# Probabilities are clamped to this before the log of the NLL, so a wrong prediction with p = 0 costs 27.6 nats.
NLL_EPS = 1e-12
# Most buckets of the first histogram pass of the equal-mass binning (a power of two: v * 2**k is exact).
_ADAPTIVE_BUCKETS = 1 << 18
# Voxels per chunk of the additive statistics.
_CHUNK = 1 << 20


def equal_width_bin_index(values: np.ndarray, num_bins: int) -> np.ndarray:
    """Index of the equal-width bin ``(k / M, (k + 1) / M]`` holding each value in ``[0, 1]`` (0 goes to bin 0).

    ``values * M`` is exact in float64 for float32 inputs, so ``ceil(values * M) - 1`` puts a value lying exactly on
    an edge ``k / M`` (as a real number) into the lower bin, like the authors' ``conf > lo and conf <= hi``.
    """
    scaled = np.multiply(values, float(num_bins), dtype=np.float64)
    np.ceil(scaled, out=scaled)
    index = scaled.astype(np.int64)
    index -= 1
    np.clip(index, 0, num_bins - 1, out=index)
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
    for k in range(p.shape[0] - 1, 0, -1):
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
                keep = np.flatnonzero(v > threshold)
                vs.append(v[keep])
                ts.append(y[keep] == k)
        v_all, t_all = (vs[0], ts[0]) if len(vs) == 1 else (np.concatenate(vs), np.concatenate(ts))
        err = _adaptive_class_error(v_all, t_all, num_bins)
        if not np.isnan(err):
            errors.append(err)
    return float(np.mean(errors)) if errors else float("nan")


# ----------------------------------------------------------------------------------------------------------------
# Statistics -> values
# ----------------------------------------------------------------------------------------------------------------


def _check_options(metric_name: Any, threshold: Any) -> str:
    if metric_name not in CALIBRATION_METRICS:
        raise ValueError(f"metric_name must be one of {CALIBRATION_METRICS}, got {metric_name!r}.")
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0.0 <= threshold < 1.0):
        raise ValueError(f"threshold must be a float in [0, 1), got {threshold!r}.")
    return str(metric_name)


def volume_statistics(
    p: np.ndarray,
    y: np.ndarray,
    metric_name: str,
    num_bins: int = 15,
    include_background: bool = True,
    threshold: float = 1e-3,
) -> np.ndarray:
    """Flat float64 statistics of the selected voxels of one volume (``p (C, n)``, ``y (n,)``).

    ECE: ``(M * 3)``, CECE: ``(C * M * 3)``, NLL / Brier: ``[count, sum]``; they add up over volumes. TACE / ACE:
    ``[value]`` (equal-mass bins depend on all the voxels binned together, so they are not additive).
    """
    if metric_name in POOLABLE_METRICS:
        stats_fn = {"ece": _ece_stats, "cece": _cece_stats, "nll": _nll_stats, "brier": _brier_stats}[metric_name]
        args = (num_bins,) if metric_name in ("ece", "cece") else ()
        # Additive statistics: chunks keep the temporaries small (and in the allocator's cache) on big volumes.
        total = None
        for start in range(0, max(p.shape[1], 1), _CHUNK):
            part = stats_fn(p[:, start : start + _CHUNK], y[start : start + _CHUNK], *args).ravel()
            total = part if total is None else total + part
        return total
    classes = range(0 if include_background else 1, p.shape[0])
    thr = threshold if metric_name == "tace" else None
    return np.array([_adaptive_error([(p, y)], num_bins, thr, classes)])


def value_from_statistics(
    stats: np.ndarray,
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
    """
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
    per_class = np.abs(bins[..., 2] - bins[..., 1]).sum(axis=1) / n
    return float(per_class[0 if include_background else 1 :].mean())


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
        probs: softmax probabilities ``(B, C, *spatial)`` or ``(C, *spatial)`` (torch or NumPy; moved to the CPU).
        labels: integer labels ``(B, 1, *spatial)``, ``(B, *spatial)`` or ``(*spatial)``.
        metric_name: ``"ece"``, ``"cece"``, ``"tace"``, ``"ace"``, ``"nll"`` or ``"brier"``.
        num_bins: number of bins M (equal-width for ECE / CECE, equal-mass for TACE / ACE). The papers use 15.
        foreground: ``"gt"`` (default, the papers), ``"union"`` or ``"all"``: which voxels are scored.
        reduction: ``"mean"`` (unweighted mean of the per-volume values, NaN volumes left out: the papers),
            ``"pooled"`` (all selected voxels binned together) or ``"none"`` (NumPy array of per-volume values).
        include_background: CECE / TACE / ACE average over classes 0..C-1 when True (default, as the authors' code
            does on foreground voxels), over 1..C-1 when False.
        threshold: TACE only: class probabilities ``<= threshold`` are left out (Nixon et al. use 1e-3).
    """
    metric_name = _check_options(metric_name, threshold)
    num_bins = check_num_bins(num_bins)
    foreground = check_foreground(foreground)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    p, y = prepare_inputs(probs, labels)
    num_classes = p.shape[1]
    parts = [select_voxels(p[b], y[b], foreground) for b in range(p.shape[0])]

    if reduction == "pooled" and metric_name in ("tace", "ace"):
        classes = range(0 if include_background else 1, num_classes)
        return _adaptive_error(parts, num_bins, threshold if metric_name == "tace" else None, classes)

    stats = [volume_statistics(pb, yb, metric_name, num_bins, include_background, threshold) for pb, yb in parts]
    if reduction == "pooled":
        return value_from_statistics(np.sum(stats, axis=0), metric_name, num_bins, num_classes, include_background)
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
    """Several calibration metrics of the same voxels at once, pooled over the volumes: ``{name: value}``.

    Equal to calling ``ece``, ``cece``, ``tace``, ``ace``, ``nll`` and ``brier`` one by one (same definitions, same
    arguments), but the inputs are checked and the voxels selected once, and ECE and CECE share one bucketing of the
    class probabilities; TACE / ACE bin each class's values of all volumes together.

    Args:
        probs, labels, num_bins, foreground, include_background, threshold: as in ``segmentation_calibration``
            (``include_background`` for CECE / TACE / ACE, ``threshold`` for TACE).
        metrics: names among ``CALIBRATION_METRICS``, in the order of the returned dict.
    """
    if isinstance(metrics, str):
        metrics = (metrics,)
    names = [_check_options(m, threshold) for m in metrics]
    if not names:
        raise ValueError(f"metrics must name at least one of {CALIBRATION_METRICS}, got {metrics!r}.")
    num_bins = check_num_bins(num_bins)
    foreground = check_foreground(foreground)
    p, y = prepare_inputs(probs, labels)
    num_classes = p.shape[1]
    wanted = set(names)
    totals: dict[str, np.ndarray] = {}
    parts = []

    def add(name: str, value: np.ndarray) -> None:
        totals[name] = value if name not in totals else totals[name] + value

    for b in range(p.shape[0]):
        pb, yb = select_voxels(p[b], y[b], foreground)
        if "ece" in wanted or "cece" in wanted:
            for start in range(0, max(pb.shape[1], 1), _CHUNK):
                pc, yc = pb[:, start : start + _CHUNK], yb[start : start + _CHUNK]
                if "ece" in wanted and "cece" in wanted:
                    ece_stats, cece_stats = _ece_cece_stats(pc, yc, num_bins)
                    add("ece", ece_stats.ravel())
                    add("cece", cece_stats.ravel())
                elif "ece" in wanted:
                    add("ece", _ece_stats(pc, yc, num_bins).ravel())
                else:
                    add("cece", _cece_stats(pc, yc, num_bins).ravel())
        for name in ("nll", "brier"):
            if name in wanted:
                add(name, volume_statistics(pb, yb, name))
        if "tace" in wanted or "ace" in wanted:
            parts.append((pb, yb))

    classes = range(0 if include_background else 1, num_classes)
    out = {}
    for name in names:
        if name in ("tace", "ace"):
            out[name] = _adaptive_error(parts, num_bins, threshold if name == "tace" else None, classes)
        else:
            out[name] = value_from_statistics(totals[name], name, num_bins, num_classes, include_background)
    return out


def ece(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt") -> float:
    """Expected calibration error (Naeini et al., AAAI 2015; Guo et al., ICML 2017), pooled over the selected voxels.

    ``ECE = sum_b |B_b| / N * |acc(B_b) - conf(B_b)|`` with top-label confidence ``max_k p_k`` in M equal-width bins
    ``(b / M, (b + 1) / M]`` and accuracy ``[argmax_k p_k == y]`` (NACL Eq. 10). Ties of argmax go to the lower class.
    """
    return calibration_errors(probs, labels, ("ece",), num_bins, foreground)["ece"]


def cece(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt", include_background: bool = True) -> float:
    """Classwise ECE (Kull et al., NeurIPS 2019; NACL Eq. 11), pooled over the selected voxels.

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
    """Thresholded adaptive calibration error (Nixon et al., CVPR-W 2019), pooled over the selected voxels.

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
    """Adaptive calibration error (Nixon et al., CVPR-W 2019): TACE without the threshold (every p_k is binned).

    Not netcal's ``ACE`` (the "average calibration error", an unweighted mean over equal-width bins).
    """
    return calibration_errors(probs, labels, ("ace",), num_bins, foreground, include_background)["ace"]


def nll(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt") -> float:
    """Mean negative log-likelihood ``-1/N sum_i log p_{i, y_i}`` (p clamped at 1e-12). ``num_bins`` is unused."""
    return calibration_errors(probs, labels, ("nll",), num_bins, foreground)["nll"]


def brier(probs: Any, labels: Any, num_bins: int = 15, foreground: str = "gt") -> float:
    """Multiclass Brier score (Brier, 1950) ``1/N sum_i sum_k (p_ik - [y_i == k])^2``. ``num_bins`` is unused.

    The authors' ``seg_brier_score`` compares with 3x3 neighbourhood label proportions instead of one-hot labels.
    """
    return calibration_errors(probs, labels, ("brier",), num_bins, foreground)["brier"]
