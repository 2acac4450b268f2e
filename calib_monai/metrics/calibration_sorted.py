"""CECE, mL1-ACE, TACE and ACE of kept voxels by sorting them: the path of
:class:`~calib_monai.metrics.calibration_torch.CalibrationAccumulator` on CUDA.

The CPU path buckets every class probability into a fine grid while it reads the voxels and refines the few buckets
a bin edge cuts: memory-bound, few elements touched twice. On a GPU that many small steps are launch- and
sync-bound (measured on an H100: 84 host synchronisations and 1,283 kernel launches per call, 8x slower than
torchmetrics' ECE; ``docs/results/benchmarks/calibration_metrics.md``). Here the kept voxels are read once at the end,
in a few whole-tensor operations:

- CECE / mL1-ACE: each ``p_k`` gets its equal-width bin (the bin rule of ``equal_width_bins``) and one ``bincount``
  per statistic fills the ``(C, M)`` counts, sums and hits;
- TACE / ACE: the values (above the threshold for TACE) are sorted by ``(class, p_k, [y == k])``, the equal-mass
  order with ties as the CPU path orders them, and float64 prefix sums give each of the ``M`` bins' sums at the
  edges ``floor(r n_k / M)``.

Same definitions and the same float64 accumulation as the grid path; the tests hold both equal to a float64 brute
force on the CPU (``use_sorted(True)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from .calibration_grid import equal_width_bins
from .calibration_numpy import threshold_for_dtype

__all__ = [
    "adaptive_error",
    "classwise_statistics",
    "count_per_index",
    "sorted_path",
    "sum_per_index",
    "use_sorted",
]

_forced: bool | None = None  # None: the sorted path on CUDA, the grid on the CPU


@contextmanager
def use_sorted(flag: bool | None) -> Iterator[None]:
    """Within the block, accumulators started on any device take the sorted path (True), the grid (False), or the
    device's default (None). Tests and benchmarks run both paths on one device."""
    global _forced
    previous, _forced = _forced, flag
    try:
        yield
    finally:
        _forced = previous


def sorted_path(device: torch.device) -> bool:
    """Whether an accumulator whose first voxels are on ``device`` keeps them and sorts at the end."""
    return device.type == "cuda" if _forced is None else _forced


def _bits(values: torch.Tensor) -> torch.Tensor:
    """Order-preserving int64 keys of non-negative floats (their bit patterns; -0.0 taken as 0.0)."""
    values = values + 0.0
    return values.view(torch.int32 if values.dtype == torch.float32 else torch.int64).long()


def count_per_index(index: torch.Tensor, size: int) -> torch.Tensor:
    """int64 ``bincount(index, minlength=size)`` as a scatter into a fixed-size tensor: no host synchronisation, and
    shapes the meta device can follow (``torch.bincount`` sizes its output from the data)."""
    return torch.zeros(size, dtype=torch.int64, device=index.device).scatter_add_(0, index, torch.ones_like(index))


def sum_per_index(index: torch.Tensor, weights: torch.Tensor, size: int) -> torch.Tensor:
    """float64 sums of ``weights`` per ``index`` (``bincount(index, weights)``), as ``count_per_index``."""
    out = torch.zeros(size, dtype=torch.float64, device=index.device)
    return out.scatter_add_(0, index, weights.to(torch.float64))


def classwise_statistics(p: torch.Tensor, y: torch.Tensor, num_bins: int) -> torch.Tensor:
    """float64 ``(C, M, 3)``: per class and equal-width bin of ``p_k`` (``equal_width_bins``' rule) the count, the sum
    of ``p_k`` and the hits ``[y == k]``."""
    c, dev = p.shape[0], p.device
    values = p.double()
    slot = equal_width_bins(values, num_bins, p.dtype) + torch.arange(c, device=dev)[:, None] * num_bins
    slot = slot.reshape(-1)
    hits = (y.long()[None] == torch.arange(c, device=dev)[:, None]).reshape(-1).double()
    size = c * num_bins
    out = torch.stack(
        [
            count_per_index(slot, size).double(),
            sum_per_index(slot, values.reshape(-1), size),
            sum_per_index(slot, hits, size),
        ],
        dim=1,
    )
    return out.view(c, num_bins, 3)


def adaptive_error(
    p: torch.Tensor, y: torch.Tensor, classes: Sequence[int], num_bins: int, threshold: float | None
) -> float:
    """TACE (``threshold``: only values above it) or ACE (None: every value) of the voxels ``p (C, n)``, ``y (n,)``:
    per class the values in ``(p_k, [y == k])`` order cut into ``M`` equal-mass bins at ``floor(r n_k / M)``, the
    error ``sum_r |hits_r - sum p_r| / n_k``, averaged over the classes with a value; NaN when none has one."""
    dev = p.device
    rows = torch.as_tensor(list(classes), dtype=torch.long, device=dev)
    values = p.index_select(0, rows)
    hits = y.long()[None] == rows[:, None]
    cls = torch.arange(len(rows), device=dev)[:, None].expand_as(values)
    if threshold is not None:
        limit = float(threshold_for_dtype(threshold, np.dtype(str(values.dtype).replace("torch.", ""))))
        keep = values > torch.tensor(limit, dtype=values.dtype, device=dev)
        values, hits, cls = values[keep], hits[keep], cls[keep]
    else:
        values, hits, cls = values.reshape(-1), hits.reshape(-1), cls.reshape(-1)
    bits = _bits(values)
    if values.dtype == torch.float32:  # one sort of (class, value, hit) in an int64 key
        order = torch.sort((cls << 33) | (bits << 1) | hits.long()).indices
    else:
        order = torch.sort((bits << 1) | hits.long(), stable=True).indices
        order = order[torch.sort(cls[order], stable=True).indices]
    values, hits = values[order].double(), hits[order].double()
    n_k = count_per_index(cls, len(rows))
    starts = torch.nn.functional.pad(n_k.cumsum(0), (1, 0))[:-1]
    prefix_v = torch.nn.functional.pad(values.cumsum(0), (1, 0))
    prefix_t = torch.nn.functional.pad(hits.cumsum(0), (1, 0))
    r = torch.arange(num_bins + 1, device=dev)[None]
    edges = starts[:, None] + (r * n_k[:, None]) // num_bins  # (K, M + 1) positions in the sorted order
    f_v, f_t = prefix_v[edges], prefix_t[edges]
    errors = (f_t.diff(dim=1) - f_v.diff(dim=1)).abs().sum(1) / n_k.clamp(min=1)
    errors = errors[n_k > 0]
    return float(errors.mean()) if errors.numel() else float("nan")
