"""Calibration statistics in torch, computed on the inputs' device (CPU or CUDA): ECE, CECE, TACE, ACE, mL1-ACE, NLL,
Brier. The one implementation: NumPy inputs come here as CPU tensors (``_inputs.as_tensors``).

The bin rule is ``calibration_numpy.equal_width_bin_index``'s, the values come from ``value_from_statistics``, and
the tests hold them equal to a float64 brute force (1e-12): counts are accumulated in int64, sums in float64 (bucket
sums of float32 values even exactly, as int64 sums of their low mantissa bits), and only per-bin statistics and a few
checked numbers leave the device. Every helper tensor is created on the inputs' device; accumulation uses fixed-size
scatters (no host synchronisation, and the meta device can follow its shapes).

How, per chunk of selected voxels ``p (C, n)`` (float32 or float64), ``y (n,)``:

- ECE: top-label confidence and correctness (argmax == y, the lowest class on ties, as NumPy's argmax) binned by
  ``equal_width_bin_index``'s rule: bin k is ``(e_k, e_{k+1}]`` with ``e_k = k / M`` rounded to the confidences'
  dtype, so a float32 confidence equal to float32(k / M) goes to the lower bin, as in MONAI and the authors' code.
- CECE, mL1-ACE (the same per-class bins), TACE, ACE: every p_k is bucketed once by its float bit pattern
  (``bits >> 13``: 1024 buckets per octave, down to 1 / M, the TACE threshold or 2**-24 for ACE; below, one bucket),
  a grid that preserves the order and is fine where probabilities crowd (near 0 and near the threshold). One packed
  int64 ``index_add_`` gives each bucket's count and exact sum, another its hits ``[y == k]`` (over each voxel's own
  class only). CECE (and mL1-ACE) sums the buckets of each equal-width bin; the few buckets that straddle a bin edge
  e_k are refined element by element. TACE / ACE need prefix sums of the values sorted by ``(p_k, [y == k])`` at
  the R + 1 equal-mass edges: the cumulative bucket statistics give them at bucket boundaries, and the buckets that
  an edge (or the threshold) cuts are refined exactly: their elements are gathered from the kept chunks and sorted.
- NLL, Brier: float64 sums of ``-log max(p_y, 1e-12)`` and ``sum_k p_k^2 - 2 p_y + 1``.

On the CPU the work is memory-bound: no full float64 / int64 copy of a chunk where avoidable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from . import calibration_kernel as _kernel
from ._inputs import flat_nonzero
from .calibration_grid import GRID_SHIFT as _GRID_SHIFT
from .calibration_grid import PACK_FLUSH as _PACK_FLUSH
from .calibration_grid import PACK_SHIFT as _PACK_SHIFT
from .calibration_grid import bucket_grid as _grid
from .calibration_grid import edge_tensors as _edge_tensors
from .calibration_grid import grid_octaves as _octaves
from .calibration_numpy import CLASSWISE_METRICS, NLL_EPS, threshold_for_dtype

__all__ = ["CalibrationAccumulator", "equal_width_bins", "first_argmax"]

# Values (C x voxels) per chunk on the CPU: float64 temporaries stay <= 16 MiB, which the allocator reuses from
# volume to volume instead of mapping fresh pages (first touches of fresh pages cost more than the work itself).
_CPU_CHUNK_VALUES = 1 << 21
_CUDA_CHUNK_VALUES = 1 << 26


def first_argmax(x: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(max, argmax)`` over ``dim``; ``torch.max`` returns the first index on ties, as NumPy's argmax."""
    return tuple(torch.max(x, dim=dim))


def equal_width_bins(v64: torch.Tensor, num_bins: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """int64 bin indices of ``v64`` (float64 copies of ``dtype`` values) by ``equal_width_bin_index``'s rule: bin ``k``
    is ``(e_k, e_{k+1}]`` with ``e_k = k / M`` rounded to ``dtype``; ``ceil(v * M) - 1``, then moved to the
    neighbouring bin where the rounded edges say so."""
    lower, upper = _edge_tensors(num_bins, str(dtype).replace("torch.", ""), v64.device)
    t = v64 * float(num_bins)
    index = t.ceil_().clamp_(1.0, float(num_bins)).long().sub_(1)
    index -= (v64 <= lower[index]).long()
    index += (v64 > upper[index]).long()
    return index


def _count(index: torch.Tensor, size: int) -> torch.Tensor:
    """int64 ``bincount(index, minlength=size)`` as a scatter into a fixed-size tensor: no host synchronisation, and
    shapes the meta device can follow (``torch.bincount`` sizes its output from the data)."""
    return torch.zeros(size, dtype=torch.int64, device=index.device).scatter_add_(0, index, torch.ones_like(index))


def _weighted(index: torch.Tensor, weights: torch.Tensor, size: int) -> torch.Tensor:
    """float64 sums of ``weights`` per ``index`` (``bincount(index, weights)``), as ``_count``."""
    out = torch.zeros(size, dtype=torch.float64, device=index.device)
    return out.scatter_add_(0, index, weights.to(torch.float64))


def _sparse_flatnonzero(mask: torch.Tensor) -> torch.Tensor:
    """``mask.nonzero()`` for a 1-D mask with few True values: scan it 8 bytes at a time (CUDA), or with NumPy on
    the CPU (``flat_nonzero``)."""
    if mask.device.type == "cpu":
        return flat_nonzero(mask)
    if mask.numel() % 8:
        mask = torch.cat([mask, mask.new_zeros(8 - mask.numel() % 8)])
    words = mask.view(torch.int64).nonzero().squeeze(1)
    candidates = (words[:, None] * 8 + torch.arange(8, device=mask.device)).view(-1)
    return candidates[mask[candidates]]


class CalibrationAccumulator:
    """Pooled statistics of the voxels passed to ``add`` (chunks of one or several volumes), on their device.

    Args:
        metrics: names among ``("ece", "cece", "tace", "ace", "ml1ace", "nll", "brier")``.
        num_classes, num_bins, include_background, threshold: as in ``calibration.calibration_errors``.
    """

    def __init__(
        self,
        metrics: Sequence[str],
        num_classes: int,
        num_bins: int = 15,
        include_background: bool = True,
        threshold: float = 1e-3,
    ) -> None:
        self.names = tuple(metrics)
        self.num_classes, self.num_bins = int(num_classes), int(num_bins)
        self.classes = list(range(0 if include_background else 1, self.num_classes))
        self.thresholds = {n: (threshold if n == "tace" else None) for n in ("tace", "ace") if n in self.names}
        self.classwise = bool(set(CLASSWISE_METRICS) & set(self.names))  # CECE / mL1-ACE: equal-width class bins
        self.use_grid = bool(self.thresholds) or self.classwise
        self.octaves = _octaves(self.num_bins, self.thresholds)
        self._packed_voxels = 0
        self.count = 0  # selected voxels so far
        self.totals: dict[str, torch.Tensor] = {}
        self.chunks: list[tuple[torch.Tensor, torch.Tensor]] = []  # (p, y) of each chunk, for refinement
        self.grid: dict | None = None
        self.value_dtype: torch.dtype | None = None
        self.device = torch.device("cpu")  # the voxels' device, once some are added
        self._refined: tuple | None = None
        self.kernel: bool | None = None  # compiled CPU pass (calibration_kernel), decided at the first chunk

    # ------------------------------------------------------------------------------------------------ accumulation

    def add(self, p: torch.Tensor, y: torch.Tensor) -> None:
        """Add the selected voxels ``p (C, n)`` (float32 / float64) with labels ``y (n,)`` of any integer dtype (already
        checked; widened to int64 one chunk at a time, inside the flat index of ``p_y``)."""
        n = y.shape[0]
        step = max(1, min((_CUDA_CHUNK_VALUES if p.is_cuda else _CPU_CHUNK_VALUES) // self.num_classes, _PACK_FLUSH))
        for start in range(0, n, step):
            stop = min(n, start + step)
            part = p if (start, stop) == (0, n) else p[:, start:stop]
            self._add_chunk(part.contiguous(), y[start:stop])

    def _add_chunk(self, p: torch.Tensor, y: torch.Tensor) -> None:
        n, dev, m = y.shape[0], p.device, self.num_bins
        if n == 0:
            return
        if self.value_dtype not in (None, p.dtype):
            raise ValueError(f"all chunks must have one dtype, got {p.dtype} after {self.value_dtype}.")
        self.count += n
        self.value_dtype, self.device = p.dtype, dev
        self._refined = None
        # --- ECE and the bucket histograms in one compiled pass (calibration_kernel), eager otherwise
        if self.kernel is None:
            self.kernel = _kernel.available(p, y)
        if self.kernel:
            y = y if y.dtype in _kernel.LABEL_DTYPES else y.long()
            _kernel.add_chunk(self, p, y.contiguous())
            if not {"nll", "brier"} & set(self.names):
                return
        # ---
        own = torch.add(torch.arange(n, device=dev), y, alpha=n)  # flat index of p_y in p (C, n)
        if {"ece", "nll", "brier"} & set(self.names):
            p_true = p.view(-1).index_select(0, own)
        if "ece" in self.names and not self.kernel:
            conf = p.amax(dim=0)
            # argmax == y: p_y is the max and every lower class is below it (argmax takes the lowest class on ties)
            below = torch.empty((self.num_classes, n), dtype=p.dtype, device=dev)  # row k: max of p_0..p_{k-1}
            below[0] = -1.0
            below[1] = p[0]
            for k in range(2, self.num_classes):
                torch.maximum(below[k - 1], p[k - 1], out=below[k])
            correct = (p_true == conf) & (below.view(-1).index_select(0, own) < conf)
            conf = conf.double()
            bins = equal_width_bins(conf, m, p.dtype)
            if "ece_count" not in self.totals:  # running totals, updated in place (fewer ops per chunk)
                self.totals["ece_count"] = torch.zeros(2 * m, dtype=torch.int64, device=dev)
                self.totals["ece_sum"] = torch.zeros(m, dtype=torch.float64, device=dev)
            key = torch.add(correct, bins, alpha=2)  # bin * 2 + [correct]
            self.totals["ece_count"].scatter_add_(0, key, torch.ones_like(key))
            self.totals["ece_sum"].scatter_add_(0, bins, conf)
        if self.use_grid and not self.kernel:
            self._add_grid(p, y, own)
        if "nll" in self.names or "brier" in self.names:
            p_true = p_true.double()
            if "nll" not in self.totals:
                self.totals.update({k: torch.zeros((), dtype=torch.float64, device=dev) for k in ("nll", "brier")})
            if "nll" in self.names:
                self.totals["nll"] -= p_true.clamp(min=NLL_EPS).log_().sum()
            if "brier" in self.names:
                flat = p.view(-1).double()
                self.totals["brier"] += torch.dot(flat, flat) - 2.0 * p_true.sum() + float(n)

    def _add_grid(self, p: torch.Tensor, y: torch.Tensor, own: torch.Tensor) -> None:
        """Bucket statistics of every p_k: counts and hits (int64), sums (exact int64 low bits for float32 values,
        else float64), and the class totals of p_k (float64: bucket 0's sum, whose values have mixed ulps)."""
        dev = p.device
        grid = self.grid = _grid(str(p.dtype).replace("torch.", ""), self.num_bins, self.octaves)
        bits = p.view(torch.int32 if p.dtype == torch.float32 else torch.int64)
        size = self.num_classes * grid["size"]
        if "grid_hit" not in self.totals:
            zeros = {k: torch.int64 for k in ("grid_hit", "grid_count", "grid_packed", "grid_low")}
            self.totals.update({k: torch.zeros(size, dtype=t, device=dev) for k, t in zeros.items()})
            self.totals["grid_sum"] = torch.zeros(size, dtype=torch.float64, device=dev)
            self.totals["class_sum"] = torch.zeros(self.num_classes, dtype=torch.float64, device=dev)
            offsets = torch.arange(self.num_classes, device=dev, dtype=bits.dtype) * grid["size"] - grid["offset"]
            self._offsets = offsets[:, None]
        keys = self._keys(bits).view(-1)  # int32 for float32 values: index_add_ takes it, no int64 copy
        # running totals updated in place: per chunk, only scatters of its own length
        if p.dtype == torch.float32:
            if self._packed_voxels + y.shape[0] > _PACK_FLUSH:
                self._flush_packed()
            # one int64 scatter for both: count in the high bits, sum of the 13 low bits of the value below
            packed = (bits & ((1 << _GRID_SHIFT) - 1)).long().add_(1 << _PACK_SHIFT)
            self.totals["grid_packed"].index_add_(0, keys, packed.view(-1))
            self._packed_voxels += y.shape[0]
        else:
            self.totals["grid_count"].index_add_(0, keys, torch.ones_like(keys))
            self.totals["grid_sum"].index_add_(0, keys, p.view(-1))
        own_keys = keys.index_select(0, own)
        self.totals["grid_hit"].index_add_(0, own_keys, torch.ones_like(own_keys, dtype=torch.int64))
        for start in range(0, y.shape[0], 1 << 15):  # float64 in slices: no float64 copy of the chunk
            self.totals["class_sum"] += p[:, start : start + (1 << 15)].sum(dim=1, dtype=torch.float64)
        # Kept for refinement: the values and small labels only (keys are recomputed): kept chunks are fresh memory,
        # whose page faults cost more than recomputing.
        self.chunks.append((p, y.to(torch.uint8 if self.num_classes <= 256 else torch.int32)))

    def _keys(self, bits: torch.Tensor) -> torch.Tensor:
        """Flat bucket keys ``k * size + b`` (int32 / int64 as ``bits``) of non-negative value bits ``(C, n)``."""
        return (bits >> self.grid["shift"]).clamp_(min=self.grid["offset"]).add_(self._offsets)

    def _flush_packed(self) -> None:
        """Move the packed float32 histogram into the count and low-bit totals (before its fields could overflow)."""
        packed = self.totals["grid_packed"]
        self.totals["grid_count"] += packed >> _PACK_SHIFT
        self.totals["grid_low"] += packed & ((1 << _PACK_SHIFT) - 1)
        packed.zero_()
        self._packed_voxels = 0

    def _grid_sums(self) -> torch.Tensor:
        """float64 ``(C, size)`` sums of p_k per bucket (bucket 0: the class total minus the other buckets)."""
        grid, c = self.grid, self.num_classes
        if self.value_dtype != torch.float32:
            return self.totals["grid_sum"].view(c, grid["size"])
        count = self.totals["grid_count"].view(c, grid["size"]).double()
        low = self.totals["grid_low"].view(c, grid["size"]).double()
        lows = torch.as_tensor(grid["lows"].astype(np.float64), device=count.device)
        ulp = torch.as_tensor(grid["ulp"], device=count.device)
        sums = count * lows + low * ulp
        if self.kernel:  # calibration_kernel sums bucket 0 itself
            sums[:, 0] = self.totals["grid_zero"]
            return sums
        sums[:, 0] = self.totals["class_sum"] - sums[:, 1:].sum(1)
        return sums

    # ------------------------------------------------------------------------------------------------ results

    def statistics(self, name: str) -> torch.Tensor | None:
        """Additive float64 statistics on the device, as ``volume_statistics``: ECE ``(M, 3)``, CECE / mL1-ACE
        ``(C, M, 3)``, NLL / Brier ``[count, sum]``; None when nothing was added."""
        classwise = "grid_hit" if name in CLASSWISE_METRICS else None
        needs = {"ece": "ece_count", "nll": "nll", "brier": "brier"}.get(name, classwise)
        if not self.count or needs not in self.totals:
            return None
        if name == "ece":
            counts = self.totals["ece_count"].view(self.num_bins, 2)
            return torch.stack([counts.sum(1).double(), self.totals["ece_sum"], counts[:, 1].double()], dim=1)
        if name in ("nll", "brier"):
            return torch.stack([self.totals[name].new_tensor(float(self.count)), self.totals[name]])
        self._flush_packed()
        grid, c, m = self.grid, self.num_classes, self.num_bins
        bins = torch.as_tensor(grid["bins"], device=self.device)
        out = torch.zeros((c, m + 1, 3), dtype=torch.float64, device=bins.device)  # column m: straddling buckets
        stats = (self.totals["grid_count"], self._grid_sums(), self.totals["grid_hit"])
        for j, value in enumerate(stats):
            out[:, :, j].index_add_(1, bins, value.view(c, grid["size"]).double())
        keys, values, hits, _ = self._refine()
        cls = keys // grid["size"]
        straddle = bins[keys % grid["size"]] == m
        cls, values, hits = cls[straddle], values[straddle].double(), hits[straddle].double()
        slot = cls * m + equal_width_bins(values, m, self.value_dtype)
        for j, weights in enumerate((None, values, hits)):
            add = _count(slot, c * m) if weights is None else _weighted(slot, weights, c * m)
            out[:, :m, j] += add.view(c, m).double()
        return out[:, :m]

    def adaptive_errors(self) -> dict[str, float]:
        """TACE / ACE of the pooled voxels: ``{name: value}``, NaN when no class has a voxel above the threshold."""
        if not self.thresholds:
            return {}
        if self.count == 0:
            return {name: float("nan") for name in self.thresholds}
        self._flush_packed()
        keys, values, hits, plans = self._refine()
        return {name: self._finish(plan, keys, values, hits) for name, plan in plans.items()}

    def _refine(self) -> tuple:
        """Elements of every bucket to refine (straddling for CECE, cut for TACE / ACE), over all kept chunks."""
        if self._refined is None:
            grid = self.grid
            plans = {name: self._plan(thr) for name, thr in self.thresholds.items()}
            dev = self.device
            lut = torch.zeros((self.num_classes, grid["size"]), dtype=torch.bool, device=dev)
            for plan in plans.values():
                lut[plan["classes"]] |= plan["marked"]
            if self.classwise:
                lut[:, torch.as_tensor(grid["straddle"], device=dev)] = True
            parts = []
            if self.kernel:  # gathered by calibration_kernel, at most the marked buckets' counts
                capacity = int(self.totals["grid_count"][lut.view(-1)].sum())
                parts = [_kernel.refine(p, y, lut, grid["size"], grid["offset"], capacity) for p, y in self.chunks]
            for p, y in self.chunks if not self.kernel else ():
                keys = self._keys(p.view(torch.int32 if p.dtype == torch.float32 else torch.int64)).view(-1)
                index = _sparse_flatnonzero(lut.view(-1).index_select(0, keys))
                flat_keys = keys[index].long()
                hit = y[index % y.shape[0]].long() == flat_keys // grid["size"]
                parts.append((flat_keys, p.view(-1)[index], hit))
            self._refined = (*(torch.cat(t) for t in zip(*parts)), plans)
        return self._refined

    def _plan(self, threshold: float | None) -> dict:
        """Buckets to refine for one equal-mass metric: the threshold's and those that can hold an interior edge.

        The count kept in the threshold's bucket (``0..cp``) is only known after refinement, so each edge marks the
        buckets over all the positions it can take (usually one: the threshold's bucket is narrow).
        """
        grid, r_bins = self.grid, self.num_bins
        size, dev = grid["size"], self.device
        classes = torch.tensor(self.classes, device=dev, dtype=torch.int64)
        stats = {"count": self.totals["grid_count"], "sum": self._grid_sums(), "hit": self.totals["grid_hit"]}
        view = {k: v.view(self.num_classes, size)[classes] for k, v in stats.items()}
        first_full, partial, thr = 0, None, None
        if threshold is not None:
            thr = threshold_for_dtype(threshold, grid["lows"].dtype)
            partial = int(np.searchsorted(grid["lows"], thr, side="right")) - 1  # bucket holding thr
            first_full = partial + 1
            if thr >= grid["highs"][partial]:  # thr is the bucket's last value: the whole bucket is <= thr
                partial = None
        full = {k: v.clone() for k, v in view.items()}
        for v in full.values():
            v[:, :first_full] = 0
        cp = view["count"][:, partial] if partial is not None else torch.zeros_like(classes)
        n_full = full["count"].sum(1)
        cumf = torch.nn.functional.pad(full["count"].cumsum(1), (1, 0))
        r = torch.arange(1, r_bins, device=dev, dtype=torch.int64)[None]
        lo = ((r * n_full[:, None]) // r_bins - cp[:, None]).clamp_(min=0)
        hi = torch.minimum((r * (n_full + cp)[:, None]) // r_bins, n_full[:, None] - 1)
        valid = (lo <= hi).long()
        first = (torch.searchsorted(cumf, lo, right=True) - 1).clamp_(0, size - 1)
        last = (torch.searchsorted(cumf, hi, right=True) - 1).clamp_(0, size - 1)
        diff = torch.zeros((len(self.classes), size + 1), dtype=torch.int64, device=dev)
        diff.scatter_add_(1, first, valid).scatter_add_(1, last + 1, -valid)
        marked = diff.cumsum(1)[:, :size] > 0
        if partial is not None:
            marked[:, partial] = True
        return {"classes": classes, "marked": marked, "full": full, "partial": partial, "threshold": thr}

    def _finish(self, plan: dict, keys: torch.Tensor, values: torch.Tensor, hits: torch.Tensor) -> float:
        """Equal-mass error of each class from the cumulative bucket statistics plus the sorted refined elements."""
        size, r_bins, dev = self.grid["size"], self.num_bins, keys.device
        k_all = len(self.classes)
        position = torch.full((self.num_classes,), -1, dtype=torch.int64, device=dev)
        position[plan["classes"]] = torch.arange(k_all, device=dev)
        cls, q = position[keys // size], keys % size
        keep = cls >= 0
        keep &= plan["marked"][cls.clamp(min=0), q]
        if plan["partial"] is not None:
            thr = torch.tensor(plan["threshold"].item(), dtype=values.dtype, device=dev)
            keep &= (q != plan["partial"]) | (values > thr)
        cls, q, values, hits = cls[keep], q[keep], values[keep] + 0.0, hits[keep]  # + 0.0: -0.0 sorts as 0.0
        # sort by (class, value, hit): the equal-mass order, ties included (Nixon's bins of the sorted values)
        bits = values.view(torch.int32 if values.dtype == torch.float32 else torch.int64).long()
        if values.dtype == torch.float32:
            order = torch.sort((cls << 31) | (bits << 1) | hits.long()).indices
        else:
            order = torch.sort((bits << 1) | hits.long(), stable=True).indices
            order = order[torch.sort(cls[order], stable=True).indices]
        cls, q, values, hits = cls[order], q[order], values[order].double(), hits[order].double()
        segment = cls * size + q  # non-decreasing: buckets are monotone in the value within a class
        prefix_v = torch.nn.functional.pad(values.cumsum(0), (1, 0))
        prefix_t = torch.nn.functional.pad(hits.cumsum(0), (1, 0))

        full = plan["full"]
        count, total_v, total_t = full["count"].clone(), full["sum"].clone(), full["hit"].double()
        if plan["partial"] is not None:  # the threshold's bucket: only its values above the threshold
            in_partial = q == plan["partial"]
            pc = cls[in_partial]
            count[:, plan["partial"]] = _count(pc, k_all)
            total_v[:, plan["partial"]] = _weighted(pc, values[in_partial], k_all)
            total_t[:, plan["partial"]] = _weighted(pc, hits[in_partial], k_all)
        cum_n = torch.nn.functional.pad(count.cumsum(1), (1, 0))
        cum_v = torch.nn.functional.pad(total_v.cumsum(1), (1, 0))
        cum_t = torch.nn.functional.pad(total_t.cumsum(1), (1, 0))
        n_k = cum_n[:, -1]
        edges = (torch.arange(r_bins + 1, device=dev, dtype=torch.int64)[None] * n_k[:, None]) // r_bins
        bucket = (torch.searchsorted(cum_n, edges, right=True) - 1).clamp_(max=size)
        offset = edges - cum_n.gather(1, bucket)  # > 0: the edge cuts this bucket, whose elements were refined
        start = torch.searchsorted(segment, torch.arange(k_all, device=dev)[:, None] * size + bucket)
        stop = (start + offset).clamp_(max=segment.shape[0])
        f_v = cum_v.gather(1, bucket) + prefix_v[stop] - prefix_v[start]
        f_t = cum_t.gather(1, bucket) + prefix_t[stop] - prefix_t[start]
        errors = (f_t.diff(dim=1) - f_v.diff(dim=1)).abs().sum(1) / n_k.clamp(min=1)
        errors = errors[n_k > 0]
        return float(errors.mean()) if errors.numel() else float("nan")
