"""Calibration statistics of selected voxels in torch, on their device: the one implementation of ECE, CECE,
mL1-ACE, TACE, ACE, NLL and the Brier score.

``selected_statistics`` returns float64 statistics (equal to a float64 brute force however many voxels are pooled):
counts and sums per bin, additive over volumes, and TACE / ACE as their value (equal-mass bins are not additive);
``value_from_statistics`` turns them into a value.

- ECE: per equal-width bin of the top-label confidence: count, sum of confidences, number correct.
- CECE, mL1-ACE, TACE, ACE share one histogram of every class probability, bucketed by the top bits of its bit
  pattern (1,024 buckets per octave, in value order): count, sum, hits ``[y == k]`` per bucket. CECE sums the
  buckets of each bin; TACE's equal-mass edges (sorted by ``(p_k, [y == k])``) fall in buckets found from the
  cumulative counts. Only the buckets an edge or the threshold cuts are refined (their values sorted).
- NLL, Brier: sums of ``-log max(p_y, 1e-12)`` and ``sum_k p_k^2 - 2 p_y + 1``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import torch

from calib_monai.defaults import NUM_BINS, TACE_THRESHOLD

__all__ = [
    "ADAPTIVE_METRICS",
    "CLASSWISE_METRICS",
    "equal_width_bin",
    "selected_statistics",
    "statistics_values",
    "value_from_statistics",
]

#: Metrics of the per-class equal-width bins ``(C, M, 3)``; they differ only in how the bins are weighted.
CLASSWISE_METRICS = ("cece", "ml1ace")
#: Metrics of per-class equal-mass bins (TACE: values above the threshold; ACE: all).
ADAPTIVE_METRICS = ("tace", "ace")
# p_y is clamped to this before the log of the NLL: a wrong prediction with p = 0 costs 27.6 nats
NLL_EPS = 1e-12
# values (C x voxels) per chunk: the float64 and key temporaries of a chunk stay small on the CPU
_CHUNK_VALUES = {"cpu": 1 << 21}
_LARGE_CHUNK = 1 << 26
# bucket key = bit pattern >> shift: 10 mantissa bits kept, 1,024 buckets per octave of either dtype
_BITS = {torch.float32: (torch.int32, 13), torch.float64: (torch.int64, 42)}
# ACE bins every value: octaves down to 2**-24 get buckets of their own, the values below share bucket 0
_MAX_OCTAVES = 24


def _nearest(k: int, m: int, dtype: torch.dtype) -> float:
    """``k / m`` rounded to the nearest ``dtype`` value, exactly (compared as fractions: no double rounding)."""
    x = torch.tensor(k / m, dtype=dtype, device="cpu")
    near = (x, torch.nextafter(x, x.new_tensor(-1.0)), torch.nextafter(x, x.new_tensor(2.0)))
    return min((float(c) for c in near), key=lambda c: abs(Fraction(c) - Fraction(k, m)))


@functools.lru_cache(maxsize=64)
def _edges(num_bins: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lower, upper)`` edges of the bins in ``dtype`` on ``device`` (made once: a copy to a GPU synchronises)."""
    edges = [-float("inf")] + [_nearest(k, num_bins, dtype) for k in range(1, num_bins)] + [float("inf")]
    edges_t = torch.tensor(edges, dtype=dtype, device=device)
    return edges_t[:-1], edges_t[1:]


def equal_width_bin(values: torch.Tensor, num_bins: int) -> torch.Tensor:
    """int64 index of the equal-width bin of each value in ``[0, 1]``: the one bin rule of every calibration metric.

    Bin ``k`` is ``(e_k, e_{k+1}]`` with ``e_k = k / M`` rounded to the values' dtype (0 in bin 0): float32(k / M)
    goes to the lower bin, as MONAI's ``calibration_binning`` and the authors' code. ``ceil(v * M) - 1``, then
    corrected by one where the rounded edges say so.

    >>> equal_width_bin(torch.tensor([0.0, 0.2, 0.21, 1.0]), 5).tolist()
    [0, 0, 1, 4]
    """
    lower, upper = _edges(int(num_bins), values.dtype, values.device)
    index = (values * num_bins).ceil_().long().clamp_(1, num_bins).sub_(1)
    index -= (values <= lower[index]).long()
    index += (values > upper[index]).long()
    return index


def _octaves(num_bins: int, names: Sequence[str], threshold: float) -> int:
    """Octaves below 1 with buckets of their own: bucket 0, the values under 2**-octaves, lies in the first
    equal-width bin (CECE) and at or below TACE's threshold, so it is never refined; ACE's goes down to 2**-24."""
    if "ace" in names or ("tace" in names and threshold <= 2.0**-_MAX_OCTAVES):
        return _MAX_OCTAVES
    octaves = max(1, (num_bins - 1).bit_length())  # 2**-octaves <= 1 / M
    return max(octaves, math.ceil(-math.log2(threshold))) if "tace" in names else octaves


@functools.lru_cache(maxsize=16)
def _bucket_grid(
    dtype: torch.dtype, num_bins: int, octaves: int, device: torch.device
) -> tuple[int, int, torch.Tensor]:
    """``(size, base, bins)`` of the bucket grid of ``dtype`` values in [0, 1]: buckets per class, the key of bucket
    0, and each bucket's equal-width bin (``num_bins`` for the buckets that straddle a bin edge: refined)."""
    itype, shift = _BITS[dtype]
    bits = torch.tensor([2.0**-octaves, 1.0], dtype=dtype, device="cpu").view(itype) >> shift
    base, top = int(bits[0]) - 1, int(bits[1])
    key = torch.arange(base + 1, top + 1, dtype=torch.int64, device="cpu")  # buckets 1.. ; bucket 0 holds the rest
    lows = (key << shift).to(itype).view(dtype)
    highs = ((key + 1 << shift) - 1).to(itype).view(dtype).clamp(max=1.0)
    lows = torch.cat([lows.new_zeros(1), lows])
    highs = torch.cat([torch.nextafter(lows[1:2], lows[:1]), highs])
    low_bin, high_bin = equal_width_bin(lows, num_bins), equal_width_bin(highs, num_bins)
    return top - base + 1, base, torch.where(low_bin == high_bin, low_bin, num_bins).to(device)


def _bucket_of(values: torch.Tensor, size: int, base: int) -> torch.Tensor:
    """Bucket keys ``class * size + bucket`` of ``values (C, n)`` (int32 for float32: index_add_ takes them)."""
    itype, shift = _BITS[values.dtype]
    keys = (values.view(itype) >> shift).sub_(base).clamp_(min=0)  # -0.0 (a negative bit pattern): bucket 0
    return keys + torch.arange(values.shape[0], dtype=itype, device=values.device)[:, None] * size


def _threshold(threshold: float, dtype: torch.dtype) -> torch.Tensor:
    """The largest ``dtype`` value not above ``threshold``: ``v > result`` is ``v > threshold`` as real numbers."""
    t = torch.tensor(threshold, dtype=dtype, device="cpu")
    return torch.nextafter(t, t.new_tensor(-1.0)) if float(t) > threshold else t


def _chunks(parts: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The selected voxels in column slices of a bounded size (views, no copies)."""
    out = []
    for p, y in parts:
        step = max(1, _CHUNK_VALUES.get(p.device.type, _LARGE_CHUNK) // p.shape[0])
        out += [(p[:, i : i + step], y[i : i + step].long()) for i in range(0, y.shape[0], step)]
    return out


def _accumulate(chunks: list, names: Sequence[str], num_bins: int, size: int, base: int) -> dict[str, torch.Tensor]:
    """float64 totals over the chunks: ECE's bins, the bucket grid, NLL and Brier sums, on the voxels' device."""
    p0 = chunks[0][0]
    c, dev, m = p0.shape[0], p0.device, num_bins
    grid = any(n in CLASSWISE_METRICS + ADAPTIVE_METRICS for n in names)
    shapes = {"ece": (3, m), "grid": (3, c * size) if grid else (0,), "nll": (), "brier": ()}
    totals = {k: torch.zeros(s, dtype=torch.float64, device=dev) for k, s in shapes.items()}
    for p, y in chunks:
        n = y.shape[0]
        ones = torch.ones((), dtype=torch.float64, device=dev).expand(c * n)
        if "ece" in names:
            conf, pred = torch.max(p, 0)  # the first class on ties, as NumPy's argmax
            bins = equal_width_bin(conf, m)
            totals["ece"][0].index_add_(0, bins, ones[:n])
            totals["ece"][1].index_add_(0, bins, conf.double())
            totals["ece"][2].index_add_(0, bins, (pred == y).double())
        p64 = p.double() if grid or "brier" in names else None
        if grid:
            keys = _bucket_of(p, size, base)
            totals["grid"][0].index_add_(0, keys.reshape(-1), ones)
            totals["grid"][1].index_add_(0, keys.reshape(-1), p64.reshape(-1))
            totals["grid"][2].index_add_(0, keys.gather(0, y[None])[0], ones[:n])  # each voxel hits its own class
        if "nll" in names or "brier" in names:
            p_true = p.gather(0, y[None])[0].double()
            totals["nll"] -= p_true.clamp(min=NLL_EPS).log().sum()
            if "brier" in names:
                totals["brier"] += p64.square().sum() - 2.0 * p_true.sum() + float(n)
    return totals


def _refine(chunks: list, marked: torch.Tensor, size: int, base: int) -> tuple[torch.Tensor, ...]:
    """``(class, bucket, value, hit)`` of every value in a marked bucket (``marked (C * size,)``), all chunks."""
    found = []
    for p, y in chunks:
        n = y.shape[0]
        keys = _bucket_of(p, size, base).reshape(-1)
        index = marked.index_select(0, keys).nonzero().squeeze(1)
        cls, col = index // n, index % n
        found.append((cls, keys[index].long() - cls * size, p[cls, col] + 0.0, y[col] == cls))  # + 0.0: -0.0 is 0
    return tuple(torch.cat(t) for t in zip(*found))


def _cumulative(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x.cumsum(1), (1, 0))


def _adaptive_marks(count: torch.Tensor, num_bins: int, partial: int | None) -> torch.Tensor:
    """Buckets ``(K, size)`` that an equal-mass edge can cut, and the threshold's (``partial``), whose values above
    the threshold are only counted once refined: each edge marks the buckets of every rank it can take."""
    full = count.long()
    kept = torch.zeros_like(full[:, 0])
    if partial is not None:
        kept = full[:, partial].clone()
        full[:, : partial + 1] = 0
    n_full = full.sum(1, keepdim=True)
    r = torch.arange(1, num_bins, device=count.device)[None]
    lo = ((r * (n_full + kept[:, None])) // num_bins - kept[:, None]).clamp(min=0)  # every value kept
    hi = torch.minimum((r * n_full) // num_bins, n_full - 1)  # none kept
    cum = _cumulative(full)
    first = torch.searchsorted(cum, lo, right=True) - 1
    last = torch.searchsorted(cum, hi, right=True) - 1
    valid = (lo <= hi).long()
    size = count.shape[1]
    diff = torch.zeros((count.shape[0], size + 1), dtype=torch.int64, device=count.device)
    diff.scatter_add_(1, first.clamp(0, size - 1), valid).scatter_add_(1, (last + 1).clamp(0, size), -valid)
    marked = diff.cumsum(1)[:, :size] > 0
    if partial is not None:
        marked[:, partial] = True
    return marked


def _adaptive_error(grid: torch.Tensor, refined: tuple, num_bins: int, partial: int | None, t: Any) -> torch.Tensor:
    """Equal-mass calibration error of the classes of ``grid (3, K, size)``, from the cumulative bucket statistics
    and the sorted ``refined`` values of the buckets an edge cuts."""
    count, total_v, total_t = grid.clone()
    cls, bucket, value, hit = refined
    k_all, size, dev = count.shape[0], count.shape[1], count.device
    if partial is not None:  # values at or below the threshold leave: the threshold's bucket keeps those above it
        keep = (bucket > partial) | ((bucket == partial) & (value > t.to(dev)))
        cls, bucket, value, hit = cls[keep], bucket[keep], value[keep], hit[keep]
        for x in (count, total_v, total_t):
            x[:, : partial + 1] = 0
        inside = bucket == partial
        for x, w in ((count, torch.ones_like(hit)), (total_v, value), (total_t, hit)):
            x[:, partial] = x.new_zeros(k_all).index_add_(0, cls[inside], w[inside].double())
    # sorted by (class, value, hit): the equal-mass order, ties included; buckets follow the values
    bits = value.view(torch.int32 if value.dtype == torch.float32 else torch.int64).long()
    if value.dtype == torch.float32:  # one sort: the class above the 31 bits of value and hit
        order = torch.sort((cls << 32) | (bits << 1) | hit.long()).indices
    else:
        order = torch.sort((bits << 1) | hit.long(), stable=True).indices
        order = order[torch.sort(cls[order], stable=True).indices]
    cls, bucket, value, hit = cls[order], bucket[order], value[order].double(), hit[order].double()
    segment = cls * size + bucket
    prefix_v = torch.nn.functional.pad(value.cumsum(0), (1, 0))
    prefix_t = torch.nn.functional.pad(hit.cumsum(0), (1, 0))
    cum_n, cum_v, cum_t = _cumulative(count.long()), _cumulative(total_v), _cumulative(total_t)
    n_k = cum_n[:, -1:]
    edges = torch.arange(num_bins + 1, device=dev)[None] * n_k // num_bins
    b = torch.searchsorted(cum_n, edges, right=True) - 1  # the bucket holding each edge's rank (size: past the end)
    offset = edges - cum_n.gather(1, b)  # > 0: the edge cuts bucket b, whose values were refined
    start = torch.searchsorted(segment, torch.arange(k_all, device=dev)[:, None] * size + b)
    stop = (start + offset).clamp(max=segment.shape[0])
    f_v = cum_v.gather(1, b) + prefix_v[stop] - prefix_v[start]
    f_t = cum_t.gather(1, b) + prefix_t[stop] - prefix_t[start]
    errors = (f_t.diff(dim=1) - f_v.diff(dim=1)).abs().sum(1) / n_k[:, 0].clamp(min=1)
    present = n_k[:, 0] > 0
    return torch.where(present, errors, 0.0).sum().div(present.sum()).reshape(1)  # NaN when no class has a value


def selected_statistics(
    parts: Sequence[tuple[torch.Tensor, torch.Tensor]],
    names: Sequence[str],
    num_bins: int = NUM_BINS,
    include_background: bool = True,
    threshold: float = TACE_THRESHOLD,
) -> dict[str, torch.Tensor]:
    """``{name: float64 statistics}`` of the checked voxels of ``parts`` (``[(p (C, n), y (n,))]``) binned together:
    ECE ``(M, 3)``, CECE / mL1-ACE ``(C, M, 3)`` (count, sum of probabilities, hits per bin), NLL / Brier ``[count,
    sum]`` (zeros without voxels), TACE / ACE ``[value]`` (NaN without voxels; ``include_background`` and
    ``threshold`` are theirs)."""
    p0 = parts[0][0]
    c, dev, m = p0.shape[0], p0.device, int(num_bins)
    chunks = _chunks(parts)
    size, base, bins = _bucket_grid(p0.dtype, m, _octaves(m, names, threshold), dev)
    totals = _accumulate(chunks, names, m, size, base) if chunks else None
    count = sum(y.shape[0] for _, y in parts)
    out: dict[str, torch.Tensor] = {}
    for name in names:
        if name == "ece":
            out[name] = totals["ece"].T if chunks else torch.zeros((m, 3), dtype=torch.float64, device=dev)
        elif name in ("nll", "brier"):
            total = totals[name] if chunks else torch.zeros((), dtype=torch.float64, device=dev)
            out[name] = torch.stack([total.new_tensor(float(count)), total])
    classwise = [n for n in names if n in CLASSWISE_METRICS]
    adaptive = [n for n in names if n in ADAPTIVE_METRICS]
    if not chunks:
        out.update({n: torch.zeros((c, m, 3), dtype=torch.float64, device=dev) for n in classwise})
        out.update({n: torch.full((1,), float("nan"), dtype=torch.float64, device=dev) for n in adaptive})
        return {n: out[n] for n in names}
    if not classwise and not adaptive:
        return out
    grid = totals["grid"].view(3, c, size)
    classes = torch.arange(0 if include_background else 1, c, device=dev)
    marked = torch.zeros((c, size), dtype=torch.bool, device=dev)
    if classwise:
        marked[:, bins == m] = True
    partials = {}
    for name in adaptive:
        t = _threshold(threshold, p0.dtype) if name == "tace" else None
        partials[name] = None if t is None else int(_bucket_of(t.reshape(1, 1), size, base)[0, 0])
        marked[classes] |= _adaptive_marks(grid[0, classes], m, partials[name])
    refined = _refine(chunks, marked.view(-1), size, base)
    if classwise:
        stats = torch.zeros((3, c, m + 1), dtype=torch.float64, device=dev)
        stats.index_add_(2, bins, grid)
        cls, bucket, value, hit = refined
        straddle = bins[bucket] == m
        slot = cls[straddle] * (m + 1) + equal_width_bin(value[straddle], m)
        for j, w in enumerate((torch.ones_like(slot, dtype=torch.float64), value[straddle].double(), hit[straddle])):
            stats[j].view(-1).index_add_(0, slot, w.double())
        out.update({n: stats[:, :, :m].permute(1, 2, 0) for n in classwise})
    position = torch.full((c,), -1, dtype=torch.int64, device=dev)
    position[classes] = torch.arange(len(classes), device=dev)
    cls = position[refined[0]]
    own = cls >= 0
    mine = (cls[own], *(x[own] for x in refined[1:]))
    for name in adaptive:
        t = _threshold(threshold, p0.dtype) if name == "tace" else None
        out[name] = _adaptive_error(grid[:, classes], mine, m, partials[name], t)
    return {n: out[n] for n in names}  # in the order asked


def value_from_statistics(
    stats: Any, metric_name: str, num_bins: int = NUM_BINS, include_background: bool = True
) -> float:
    """A metric's value from its (possibly summed) statistics of ``selected_statistics``; NaN without voxels. The
    formulas are the functions' (``ece``, ``cece``, ``ml1ace``); ECE is ``sum_b |hits_b - sum conf_b| / N``, and
    CECE averages over classes as the authors' ``ClasswiseECELoss`` (NACL Eq. 11 has no 1/K).

    >>> value_from_statistics(torch.tensor([[0, 0, 0], [2, 1.6, 1], [2, 1.6, 2]]), "ece", num_bins=3)
    0.25
    """
    s = stats if isinstance(stats, torch.Tensor) else torch.as_tensor(stats, device="cpu")  # NumPy: a CPU tensor
    s = s.detach().to("cpu", torch.float64).reshape(-1)
    if metric_name in ADAPTIVE_METRICS:
        return float(s[0])
    if metric_name in ("nll", "brier"):
        return float(s[1] / s[0]) if s[0] > 0 else float("nan")
    bins = s.reshape(-1, num_bins, 3)  # (1, M, 3) for ECE
    n = bins[0, :, 0].sum()
    if n == 0:
        return float("nan")
    gaps = (bins[..., 2] - bins[..., 1]).abs()
    if metric_name == "ml1ace":  # every class bins the same n > 0 voxels: each has a non-empty bin
        occupied = bins[..., 0] > 0
        per_class = (gaps / bins[..., 0].clamp(min=1)).sum(1) / occupied.sum(1)
    else:
        per_class = gaps.sum(1) / n
    return float(per_class[0 if include_background or metric_name == "ece" else 1 :].mean())


def statistics_values(
    stats: Mapping[str, torch.Tensor], num_bins: int = NUM_BINS, include_background: bool = True
) -> dict[str, float]:
    """``{name: value}`` of ``selected_statistics``' output, brought to the host in one transfer."""
    flat = [s.reshape(-1) for s in stats.values()]
    host = torch.cat(flat).cpu().split([f.numel() for f in flat]) if flat else []
    return {name: value_from_statistics(h, name, num_bins, include_background) for name, h in zip(stats, host)}
