"""ECE, CECE / mL1-ACE and TACE / ACE of the ground-truth foreground of CUDA tensors in Triton kernels: the path of
:func:`~calib_monai.metrics.calibration_sorted.sorted_errors` when Triton is installed.

The sorted path selects the voxels (``nonzero``), checks them and bins them in whole-tensor operations: some 160
launches and 20 host synchronisations per call. Here one kernel reads each volume's labels and probabilities once (any
integer label dtype, no copy), selects ``label != 0``, takes the checks' extremes and fills the equal-width bins of
ECE and of every class in per-program float64 partial sums; a second kernel writes the packed ``(class, p_k, hit)``
keys of TACE / ACE, which one sort puts in the equal-mass order of ``calibration_sorted``. Two synchronisations: the
checks (and the key count), and the statistics. The bin rule, the keys and the statistics' layout are those of
``calibration_sorted``; only the order of the float64 additions differs (a few ulps).

Taken for float32 probabilities, ``foreground="gt"`` and no NLL / Brier; anything else, or Triton missing, takes the
sorted path (``triton_path`` says which).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Sequence

import torch

from ._inputs import probability_problem
from .calibration_grid import edge_tensors
from .calibration_numpy import threshold_for_dtype
from .calibration_sorted import adaptive_error_of_keys, statistics_values

try:  # an optional dependency (CUDA builds of torch bring it); the sorted path runs without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CPU image has no Triton
    triton = None

__all__ = [
    "TRITON_METRICS",
    "available",
    "triton_errors",
    "triton_path",
    "triton_statistics",
    "triton_volume_statistics",
    "use_triton",
]

TRITON_METRICS = frozenset({"ece", "cece", "ml1ace", "tace", "ace"})
_BLOCK = 256  # voxels per step of a program
_KEY_BLOCK = 1024
_enabled = True


def available() -> bool:
    """Whether Triton can be imported."""
    return triton is not None


@contextlib.contextmanager
def use_triton(flag: bool):
    """Switch this path on or off within the block (the benchmark times it against the sorted path)."""
    global _enabled
    previous, _enabled = _enabled, bool(flag)
    try:
        yield
    finally:
        _enabled = previous


def triton_path(p: torch.Tensor, y: torch.Tensor, names: Sequence[str], foreground: str) -> bool:
    """Whether ``p (B, C, N)``, ``y (B, N)`` take this path: Triton there and on, CUDA (or the Triton interpreter's
    CPU tensors), float32, "gt", integer labels, metrics among ``TRITON_METRICS``, voxel indices within int32."""
    device_ok = p.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    return (
        _enabled
        and triton is not None
        and device_ok
        and foreground == "gt"
        and p.dtype == torch.float32
        and not y.is_floating_point()
        and set(names) <= TRITON_METRICS
        and 0 < y.numel() < 2**31 - _KEY_BLOCK
        and p.shape[1] <= 64
    )


def triton_errors(
    p: torch.Tensor,
    y: torch.Tensor,
    class_dim: int,
    names: Sequence[str],
    num_bins: int = 15,
    foreground: str = "gt",
    include_background: bool = True,
    threshold: float = 1e-3,
) -> dict[str, float] | None:
    """``sorted_errors``' ``{name: value}`` of ``p (B, C, N)``, ``y (B, N)`` on this path; None where it does not
    apply (``triton_path``) or nothing is selected: the caller's path takes them."""
    stats = _statistics_or_none(p, y, names, foreground, num_bins, include_background, threshold, class_dim)
    return None if stats is None else statistics_values(stats, num_bins, p.shape[1], include_background)


def triton_volume_statistics(
    p: torch.Tensor,
    y: torch.Tensor,
    name: str,
    foreground: str,
    num_bins: int,
    include_background: bool,
    threshold: float,
    class_dim: int = 1,
    input_name: str = "probs",
) -> torch.Tensor | None:
    """``selected_statistics`` of one volume ``p (1, C, N)``, ``y (1, N)`` (``volume_statistics``' flat layout) on
    this path, selected and checked here; None where it does not apply or nothing is selected."""
    stats = _statistics_or_none(
        p, y, (name,), foreground, num_bins, include_background, threshold, class_dim, input_name
    )
    return None if stats is None else stats[name]


def _statistics_or_none(
    p, y, names, foreground, num_bins, include_background, threshold, class_dim, input_name="probs"
):
    global _enabled
    if not triton_path(p, y, names, foreground):
        return None
    try:
        return triton_statistics(p, y, names, num_bins, include_background, threshold, class_dim, input_name)
    except ValueError:  # the inputs' checks: the caller's message
        raise
    except Exception as error:  # a Triton that cannot build or run its kernels here (no C compiler, an old GPU)
        _enabled = False
        message = f"the calibration metrics' Triton kernels failed ({error!r}); they use the sorted path from now"
        warnings.warn(message, stacklevel=4)
        return None


def triton_statistics(
    p: torch.Tensor,
    y: torch.Tensor,
    names: Sequence[str],
    num_bins: int,
    include_background: bool,
    threshold: float,
    class_dim: int = 1,
    input_name: str = "probs",
) -> dict[str, torch.Tensor] | None:
    """``sorted_statistics``' ``{name: flat float64 statistics}`` of the ground-truth foreground of ``p (B, C, N)``,
    ``y (B, N)``, checked as ``select_tensor_voxels`` checks (the same messages); None when nothing is selected (the
    caller's path warns)."""
    b, c, n = p.shape
    p, y = p.contiguous(), y.contiguous()
    y = y.view(torch.uint8) if y.dtype == torch.bool else y
    total, m = b * n, int(num_bins)
    lower, upper = edge_tensors(m, "float32", p.device)
    cut = float(threshold_for_dtype(threshold, "float32"))
    width = 3 * m + 3 * c * m + c + 2  # ECE (count, sum, hits), per-class the same, kept per class, selected, NaNs
    programs = max(1, min(triton.cdiv(total, _BLOCK), 4 * _processors(p.device)))
    part = torch.empty((programs, width), dtype=torch.float64, device=p.device)
    extremes = torch.empty((programs, 6), dtype=torch.float64, device=p.device)
    _stats_kernel[(programs,)](
        p, y, lower, upper, part, extremes, total, n, cut,
        C=c, M=m, MP=triton.next_power_of_2(m), CP=triton.next_power_of_2(c), BLOCK=_BLOCK,
    )  # fmt: skip
    sums = part.sum(0)
    head = torch.cat([sums[-(c + 2) :], extremes[:, :3].amin(0), extremes[:, 3:].amax(0)]).tolist()  # sync 1
    kept, (selected, nans), (lo, sum_lo, ylo, hi, sum_hi, yhi) = head[:c], head[c : c + 2], head[c + 2 :]
    if selected == 0:
        return None
    if nans:
        lo = hi = float("nan")
    problem = probability_problem(input_name, lo, hi, sum_lo, sum_hi, class_dim)
    if problem:
        raise ValueError(problem)
    if ylo < 0 or yhi >= c:
        raise ValueError(f"labels must lie in [0, {c - 1}] for {c} classes, got [{int(ylo)}, {int(yhi)}].")
    out: dict[str, torch.Tensor] = {}
    if "ece" in names:
        out["ece"] = sums[: 3 * m].reshape(3, m).T.reshape(-1)
    classwise = sums[3 * m : 3 * m + 3 * c * m].reshape(3, c * m).T.reshape(-1)
    out.update({name: classwise for name in names if name in ("cece", "ml1ace")})
    first = 0 if include_background else 1
    for name, use_cut in (("tace", True), ("ace", False)):
        if name in names:
            count = int(sum(kept[first:])) if use_cut else int(selected) * (c - first)
            out[name] = _adaptive(p, y, total, n, cut, use_cut, first, count, m).reshape(1)
    return out


def _adaptive(p, y, total: int, n: int, cut: float, use_cut: bool, first: int, count: int, m: int) -> torch.Tensor:
    keys = torch.empty(count, dtype=torch.int64, device=p.device)
    if count:
        counter = torch.zeros(1, dtype=torch.int32, device=p.device)
        programs = max(1, min(triton.cdiv(total, _KEY_BLOCK), 4 * _processors(p.device)))
        _keys_kernel[(programs,)](
            p, y, keys, counter, total, n, cut, C=p.shape[1], FIRST=first, USE_CUT=use_cut, BLOCK=_KEY_BLOCK
        )
    return adaptive_error_of_keys(torch.sort(keys).values, p.shape[1] - first, m)


def _processors(device: torch.device) -> int:
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


if triton is not None:

    @triton.jit
    def _bin(v64, lower_ptr, upper_ptr, M: tl.constexpr):
        """``equal_width_bins``' rule: ``ceil(v M) - 1`` in [0, M - 1], moved by the dtype-rounded edges."""
        index = tl.minimum(tl.maximum(tl.ceil(v64 * M), 1.0), M * 1.0).to(tl.int32) - 1
        index -= (v64 <= tl.load(lower_ptr + index)).to(tl.int32)
        index += (v64 > tl.load(upper_ptr + index)).to(tl.int32)
        return index

    @triton.jit
    def _stats_kernel(
        p_ptr, y_ptr, lower_ptr, upper_ptr, part_ptr, ext_ptr, total, n, cut,
        C: tl.constexpr, M: tl.constexpr, MP: tl.constexpr, CP: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        pid, programs = tl.program_id(0), tl.num_programs(0)
        bins, rows = tl.arange(0, MP), tl.arange(0, CP)
        ece = tl.zeros((4, MP), dtype=tl.float64)  # count, confidence sum, hits per bin (and a row of padding)
        per_class = tl.zeros((CP, MP), dtype=tl.float64)
        per_class_sum = tl.zeros((CP, MP), dtype=tl.float64)
        per_class_hit = tl.zeros((CP, MP), dtype=tl.float64)
        kept = tl.zeros((CP,), dtype=tl.float64)
        selected, nans = tl.full((), 0.0, tl.float64), tl.full((), 0.0, tl.float64)
        lo = tl.full((), float("inf"), tl.float64)
        sum_lo, ylo, hi, sum_hi, yhi = lo, lo, -lo, -lo, -lo
        stat = tl.arange(0, 4)[:, None]
        for step in range(pid, tl.cdiv(total, BLOCK), programs):
            i = tl.arange(0, BLOCK).to(tl.int64) + step * BLOCK
            label = tl.load(y_ptr + i, mask=i < total, other=0)
            chosen = (label != 0) & (i < total)
            if tl.sum(chosen.to(tl.int32)) > 0:
                base = (i // n) * (C * n) + i % n
                conf = tl.full((BLOCK,), -1.0, tl.float32)
                arg = tl.zeros((BLOCK,), dtype=tl.int32)
                total_p = tl.zeros((BLOCK,), dtype=tl.float32)
                for c in tl.static_range(C):
                    v = tl.load(p_ptr + base + c * n, mask=chosen, other=0.0)
                    nans += tl.sum((chosen & (v != v)).to(tl.float64))
                    lo = tl.minimum(lo, tl.min(tl.where(chosen, v, float("inf"))).to(tl.float64))
                    hi = tl.maximum(hi, tl.max(tl.where(chosen, v, -float("inf"))).to(tl.float64))
                    total_p += v
                    arg = tl.where(v > conf, c, arg)  # strict: the first index on ties, as torch.max
                    conf = tl.maximum(conf, v)
                    v64 = v.to(tl.float64)
                    hot = (_bin(v64, lower_ptr, upper_ptr, M)[:, None] == bins[None, :]) & chosen[:, None]
                    own = hot & (label == c)[:, None]
                    row = rows[:, None] == c
                    per_class += tl.where(row, tl.sum(hot.to(tl.float64), 0)[None, :], 0.0)
                    per_class_sum += tl.where(row, tl.sum(tl.where(hot, v64[:, None], 0.0), 0)[None, :], 0.0)
                    per_class_hit += tl.where(row, tl.sum(own.to(tl.float64), 0)[None, :], 0.0)
                    kept += tl.where(rows == c, tl.sum((chosen & (v > cut)).to(tl.float64)), 0.0)
                conf64 = conf.to(tl.float64)
                hot = (_bin(conf64, lower_ptr, upper_ptr, M)[:, None] == bins[None, :]) & chosen[:, None]
                hit = hot & (arg == label)[:, None]
                ece += tl.where(stat == 0, tl.sum(hot.to(tl.float64), 0)[None, :], 0.0)
                ece += tl.where(stat == 1, tl.sum(tl.where(hot, conf64[:, None], 0.0), 0)[None, :], 0.0)
                ece += tl.where(stat == 2, tl.sum(hit.to(tl.float64), 0)[None, :], 0.0)
                selected += tl.sum(chosen.to(tl.float64))
                sum_lo = tl.minimum(sum_lo, tl.min(tl.where(chosen, total_p, float("inf"))).to(tl.float64))
                sum_hi = tl.maximum(sum_hi, tl.max(tl.where(chosen, total_p, -float("inf"))).to(tl.float64))
                yl = label.to(tl.float64)
                ylo = tl.minimum(ylo, tl.min(tl.where(chosen, yl, float("inf"))))
                yhi = tl.maximum(yhi, tl.max(tl.where(chosen, yl, -float("inf"))))
        out = part_ptr + pid * (3 * M + 3 * C * M + C + 2)
        tl.store(out + stat * M + bins[None, :], ece, mask=(stat < 3) & (bins[None, :] < M))
        cell = rows[:, None] * M + bins[None, :]
        inside = (rows[:, None] < C) & (bins[None, :] < M)
        tl.store(out + 3 * M + cell, per_class, mask=inside)
        tl.store(out + 3 * M + C * M + cell, per_class_sum, mask=inside)
        tl.store(out + 3 * M + 2 * C * M + cell, per_class_hit, mask=inside)
        tl.store(out + 3 * M + 3 * C * M + rows, kept, mask=rows < C)
        tl.store(out + 3 * M + 3 * C * M + C, selected)
        tl.store(out + 3 * M + 3 * C * M + C + 1, nans)
        ext = ext_ptr + pid * 6
        tl.store(ext, lo)
        tl.store(ext + 1, sum_lo)
        tl.store(ext + 2, ylo)
        tl.store(ext + 3, hi)
        tl.store(ext + 4, sum_hi)
        tl.store(ext + 5, yhi)

    @triton.jit
    def _keys_kernel(
        p_ptr, y_ptr, key_ptr, counter_ptr, total, n, cut,
        C: tl.constexpr, FIRST: tl.constexpr, USE_CUT: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """The ``(class - FIRST) << 32 | bits(p_k) << 1 | [y == k]`` keys of the kept values, in any order."""
        pid, programs = tl.program_id(0), tl.num_programs(0)
        for step in range(pid, tl.cdiv(total, BLOCK), programs):
            i = tl.arange(0, BLOCK).to(tl.int64) + step * BLOCK
            label = tl.load(y_ptr + i, mask=i < total, other=0)
            chosen = (label != 0) & (i < total)
            if tl.sum(chosen.to(tl.int32)) > 0:
                base = (i // n) * (C * n) + i % n
                for c in tl.static_range(FIRST, C):
                    v = tl.load(p_ptr + base + c * n, mask=chosen, other=0.0)
                    keep = chosen
                    if USE_CUT:
                        keep = chosen & (v > cut)
                    count = tl.sum(keep.to(tl.int32))
                    if count > 0:
                        start = tl.atomic_add(counter_ptr, count)
                        at = start + tl.cumsum(keep.to(tl.int32), 0) - 1
                        bits = tl.where(v == 0.0, 0.0, v).to(tl.int32, bitcast=True).to(tl.int64)  # -0.0 as 0.0
                        key = (bits << 1) | (label == c).to(tl.int64) | ((c - FIRST) << 32)
                        tl.store(key_ptr + at, key, mask=keep)
