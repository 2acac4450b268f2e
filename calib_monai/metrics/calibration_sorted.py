"""Calibration statistics of selected voxels in a few whole-tensor operations: the path of
:func:`~calib_monai.metrics.calibration_error.calibration_errors` for CUDA tensors.

The CPU path (``calibration_torch.CalibrationAccumulator`` with ``calibration_kernel``) streams chunks through a fine
bucket grid and refines the few buckets a bin edge cuts; on a GPU its many small steps are bound by kernel launches
and host synchronisations. Here all selected voxels of all volumes are reduced at once:

- ECE: top-label confidence (the first argmax on ties) and its equal-width bin; one ``bincount`` per statistic;
- CECE / mL1-ACE: each ``p_k`` in its equal-width bin, ``(C, M)`` counts, sums and hits by ``bincount``;
- TACE / ACE: the values (above the threshold for TACE) sorted by ``(class, p_k, [y == k])`` in one sort of packed
  int64 keys; the equal-mass bin ``b`` of a class holds its ranks ``floor(b n_k / M)`` to ``floor((b + 1) n_k / M)``
  (exclusive), so its sums are differences of float64 prefix sums;
- NLL, Brier: float64 sums.

The definitions, bin rule and float64 accumulation are those of the grid path, and the tests hold the two equal, and
both equal to a float64 brute force. Only the statistics come to the host, in one transfer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import torch

from ._inputs import select_tensor_voxels, warn_empty_selection
from .calibration_numpy import NLL_EPS, threshold_for_dtype, value_from_statistics
from .calibration_torch import equal_width_bins

__all__ = [
    "adaptive_error_of_keys",
    "sorted_errors",
    "sorted_path",
    "sorted_statistics",
    "statistics_values",
    "use_sorted",
]

_enabled = True


def sorted_path(p: torch.Tensor) -> bool:
    """Whether the voxels of ``p`` take this path: CUDA tensors, unless ``use_sorted(False)`` or deterministic
    algorithms are asked for (``torch.use_deterministic_algorithms``: CUDA's weighted ``bincount`` has none)."""
    return _enabled and p.is_cuda and not torch.are_deterministic_algorithms_enabled()


@contextlib.contextmanager
def use_sorted(flag: bool):
    """Switch this path on or off for CUDA tensors within the block (the benchmark times both on one GPU)."""
    global _enabled
    previous, _enabled = _enabled, bool(flag)
    try:
        yield
    finally:
        _enabled = previous


def _per_slot(slot: torch.Tensor, size: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """float64 counts (or sums of ``weights``) per slot: ``bincount``, whose CUDA kernel adds float64 weights into
    shared memory when the slots are few (a scatter into a handful of global float64 slots serialises on their
    atomics, and so does its unweighted int64 count: counts are taken as sums of float64 ones, exact to 2**53)."""
    weights = torch.ones_like(slot, dtype=torch.float64) if weights is None else weights.double()
    return torch.bincount(slot, weights, minlength=size)


def _adaptive_error(p: torch.Tensor, y: torch.Tensor, classes: torch.Tensor, num_bins: int, threshold) -> torch.Tensor:
    """0-d float64 TACE / ACE of ``p (C, n)``: mean over ``classes`` with a kept value of the equal-mass bins'
    ``sum |hits - sum p| / n_k`` (NaN when no class keeps a value)."""
    values = p.index_select(0, classes) + 0.0  # + 0.0: -0.0 sorts as 0.0
    hits = y[None] == classes[:, None]
    row = torch.arange(len(classes), device=p.device)[:, None].expand_as(values)
    if threshold is not None:
        keep = values > float(threshold_for_dtype(threshold, str(p.dtype)[6:]))  # exact in p's dtype
        values, hits, row = values[keep], hits[keep], row[keep]
    else:
        values, hits, row = values.reshape(-1), hits.reshape(-1), row.reshape(-1)
    if p.dtype == torch.float32:  # one sort: class above the 31 value bits and the hit bit
        key = (row << 32) | (values.view(torch.int32).long() << 1) | hits.long()
        return adaptive_error_of_keys(torch.sort(key).values, len(classes), num_bins)
    # float64: 63 value bits, so the class goes in a second stable sort
    order = torch.sort((values.view(torch.int64) << 1) | hits.long(), stable=True).indices
    order = order[torch.sort(row[order], stable=True).indices]
    return _adaptive_of_sorted(row[order], hits[order].double(), values[order].double(), len(classes), num_bins)


def adaptive_error_of_keys(key: torch.Tensor, k: int, num_bins: int) -> torch.Tensor:
    """0-d float64 TACE / ACE of sorted float32 keys ``row << 32 | bits(p) << 1 | hit`` of ``k`` classes."""
    value = ((key >> 1) & 0x7FFFFFFF).int().view(torch.float32).double()
    return _adaptive_of_sorted(key >> 32, (key & 1).double(), value, k, num_bins)


def _adaptive_of_sorted(
    row: torch.Tensor, hit: torch.Tensor, value: torch.Tensor, k: int, num_bins: int
) -> torch.Tensor:
    # sorted by class: where each class starts (a count of a few classes by bincount serialises on its atomics)
    bounds = torch.searchsorted(row, torch.arange(k + 1, device=row.device, dtype=row.dtype))
    start, n_k = bounds[:-1], bounds.diff()
    # the bins' sums are differences of prefix sums at the equal-mass edges floor(b n_k / M)
    edges = start[:, None] + torch.arange(num_bins + 1, device=row.device) * n_k[:, None] // num_bins
    zero = value.new_zeros(1)
    prefix_v, prefix_t = torch.cat([zero, value.cumsum(0)]), torch.cat([zero, hit.cumsum(0)])
    gaps = (prefix_t[edges].diff(dim=1) - prefix_v[edges].diff(dim=1)).abs().sum(1)
    present = n_k > 0  # a mask by where, not by indexing: indexing by a mask synchronises with the host
    return torch.where(present, gaps / n_k.clamp(min=1), 0.0).sum() / present.sum()


def sorted_statistics(
    p: torch.Tensor,
    y: torch.Tensor,
    names: Sequence[str],
    num_bins: int = 15,
    include_background: bool = True,
    threshold: float = 1e-3,
) -> dict[str, torch.Tensor]:
    """``{name: flat float64 statistics}`` on ``p``'s device of the selected voxels ``p (C, n)`` (float32 / float64,
    checked), ``y (n,)`` integer labels, in ``volume_statistics``' layout: ECE ``(M * 3)``, CECE / mL1-ACE
    ``(C * M * 3)``, NLL / Brier ``[count, sum]``, TACE / ACE ``[value]``."""
    c, n = p.shape
    dev, m = p.device, int(num_bins)
    y = y.long()
    out: dict[str, torch.Tensor] = {}
    if "ece" in names:
        conf, arg = torch.max(p, 0)  # the first index on ties, as NumPy's argmax
        conf = conf.double()
        bins = equal_width_bins(conf, m, p.dtype)
        out["ece"] = torch.stack([_per_slot(bins, m), _per_slot(bins, m, conf), _per_slot(bins, m, arg == y)], 1)
        out["ece"] = out["ece"].reshape(-1)
    classwise = [name for name in names if name in ("cece", "ml1ace")]
    if classwise:
        values = p.double()
        slot = equal_width_bins(values, m, p.dtype) + torch.arange(c, device=dev)[:, None] * m
        own = slot.gather(0, y[None])[0]  # each voxel hits only its own class: n slots, not C n
        slot = slot.reshape(-1)
        stats = [_per_slot(slot, c * m), _per_slot(slot, c * m, values.reshape(-1)), _per_slot(own, c * m)]
        flat = torch.stack(stats, 1).reshape(-1)
        out.update({name: flat for name in classwise})
    classes = torch.arange(0 if include_background else 1, c, device=dev)
    for name, cut in (("tace", threshold), ("ace", None)):
        if name in names:
            out[name] = _adaptive_error(p, y, classes, m, cut).reshape(1)
    if "nll" in names or "brier" in names:
        p_true = p.gather(0, y[None])[0].double()
        count = torch.tensor(float(n), dtype=torch.float64, device=dev)
        if "nll" in names:
            out["nll"] = torch.stack([count, -p_true.clamp(min=NLL_EPS).log().sum()])
        if "brier" in names:
            squares = p.double().square().sum()
            out["brier"] = torch.stack([count, squares - 2.0 * p_true.sum() + float(n)])
    return out


def sorted_errors(
    p: torch.Tensor,
    y: torch.Tensor,
    class_dim: int,
    names: Sequence[str],
    num_bins: int = 15,
    foreground: str = "gt",
    include_background: bool = True,
    threshold: float = 1e-3,
) -> dict[str, float]:
    """``calibration_errors`` of ``p (B, C, N)``, ``y (B, N)`` (``prepare_tensors``' views): the voxels of all volumes
    selected and checked at once, their statistics brought to the host in one transfer."""
    b, c, _ = p.shape
    flat_p = p[0] if b == 1 else p.transpose(0, 1).reshape(c, -1)
    p_sel, y_sel = select_tensor_voxels(flat_p, y.reshape(-1), foreground, "probs", class_dim)
    if y_sel.numel() == 0:
        warn_empty_selection(foreground, stacklevel=4)
        return {name: float("nan") for name in names}
    stats = sorted_statistics(p_sel, y_sel, names, num_bins, include_background, threshold)
    return statistics_values(stats, num_bins, c, include_background)


def statistics_values(
    stats: Mapping[str, torch.Tensor], num_bins: int, num_classes: int, include_background: bool
) -> dict[str, float]:
    """``{name: value}`` of flat statistics in ``volume_statistics``' layout, brought to the host in one transfer."""
    flat = list(stats.values())
    host = torch.cat(flat).cpu().numpy() if flat else []
    out, start = {}, 0
    for name, part in zip(stats, flat):
        out[name] = value_from_statistics(
            host[start : start + part.numel()], name, num_bins, num_classes, include_background
        )
        start += part.numel()
    return out
