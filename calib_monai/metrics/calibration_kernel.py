"""A compiled CPU kernel for ``CalibrationAccumulator``: one pass over a chunk of selected voxels
``p (C, n)`` float32 and labels ``y (n,)`` read in their own integer dtype gives ECE's bin counts and sums and every
class's bucket histogram; a second pass (``refine``) gathers the few values of the buckets that need refinement
(TACE's equal-mass edges and CECE's straddling buckets are only known once the histogram is complete). Same
statistics as the eager torch ops of ``calibration_torch.py`` (int64 counts, exact bucket sums), no temporaries.
``select_voxels``: ``select_tensor_voxels``'s "gt" selection and checks in one pass over the labels; ``add_volume``:
that selection, the checks and the chunk pass together, one pass over a volume's labels (``calibration_errors``).

C through ``ctypes``, not ``torch.compile``: inductor compiles the chunk pass in tens of seconds and turns its scatters
into atomic adds, while this C needs no torch headers (the figures: ``docs/notes/metrics.md``, "Measurements"). Built
once per source and compiler into ``$CALIB_MONAI_KERNEL_DIR`` (default ``~/.cache/calib_monai``);
``CALIB_MONAI_KERNEL=0`` switches it off. Without a C compiler, or when the build fails, the eager path runs (logged
once). CPU float32 only: float64, CUDA and meta tensors take the eager path.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from .calibration_grid import PACK_FLUSH, bucket_grid, edge_tensors
from .calibration_kernel_source import SOURCE

__all__ = [
    "LABEL_DTYPES",
    "add_chunk",
    "add_volume",
    "available",
    "chunk_statistics",
    "enabled",
    "refine",
    "select_gt",
    "select_voxels",
    "use_kernel",
]

_LOG = logging.getLogger(__name__)

_SOURCE = SOURCE

_FLAGS = ["-O3", "-shared", "-fPIC", "-std=c99", "-fno-strict-aliasing"]
_LABEL_TYPES = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4}
#: Label dtypes the kernel reads in place (others are widened to int64 first).
LABEL_DTYPES = tuple(_LABEL_TYPES)
_library: ctypes.CDLL | None = None
_failed = False
_enabled = os.environ.get("CALIB_MONAI_KERNEL", "1").strip().lower() not in ("0", "false", "no", "off")


def _build() -> ctypes.CDLL:
    """The compiled library, built once per source, flags, compiler and machine (then loaded from the cache)."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise OSError(f"no C compiler {cc!r} on PATH")
    tag = hashlib.sha256("\0".join([_SOURCE, *_FLAGS, cc, platform.machine()]).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("CALIB_MONAI_KERNEL_DIR", Path.home() / ".cache" / "calib_monai"))
    target = folder / f"calibration_kernel_{tag}.so"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:  # built aside, renamed: no reader sees half a file
            source, built = Path(tmp) / "kernel.c", Path(tmp) / "kernel.so"
            source.write_text(_SOURCE)
            subprocess.run([cc, *_FLAGS, "-o", str(built), str(source)], check=True, capture_output=True, timeout=120)
            os.replace(built, target)
    lib = ctypes.CDLL(str(target))
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    lib.calib_chunk.argtypes = [ptr, i64, i64, ptr, ctypes.c_int, i64, ptr, ptr, ptr, ptr, i64, i32, ptr, ptr, ptr]
    lib.calib_chunk.argtypes += [ctypes.c_int, ctypes.c_int]
    lib.calib_chunk.restype = ctypes.c_int
    lib.calib_refine.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_int, i64, i32, ptr, i64, ptr, ptr, ptr]
    lib.calib_refine.restype = i64
    lib.calib_count.argtypes, lib.calib_count.restype = [ptr, ctypes.c_int, i64], i64
    lib.calib_select.argtypes = [ptr, i64, i64, ptr, ctypes.c_int, i64, ptr, ptr, ptr]
    lib.calib_select.restype = None
    lib.calib_gt.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_int, i64, ptr, ptr, ptr, i64, ptr, ptr, ptr, ptr, ptr]
    lib.calib_gt.argtypes += [i64, i32, ptr, ptr, ptr, ctypes.c_int, ctypes.c_int]
    lib.calib_gt.restype = i64
    return lib


def _load() -> ctypes.CDLL | None:
    global _library, _failed
    if _library is None and not _failed:
        try:
            _library = _build()
        except (OSError, subprocess.SubprocessError) as error:  # no compiler, failed build: the eager path runs
            _failed = True
            detail = getattr(error, "stderr", b"") or b""
            _LOG.warning("calibration kernel unavailable, using eager torch ops: %s %s", error, detail.decode()[-500:])
    return _library


def enabled() -> bool:
    """Whether the kernel is switched on (``CALIB_MONAI_KERNEL``, ``use_kernel``), built or not."""
    return _enabled


@contextlib.contextmanager
def use_kernel(flag: bool):
    """Switch the kernel on or off within the block (benchmarks compare both paths in one process)."""
    global _enabled
    previous, _enabled = _enabled, bool(flag)
    try:
        yield
    finally:
        _enabled = previous


def available(p: torch.Tensor, y: torch.Tensor) -> bool:
    """True when the kernel takes these inputs: on, built, CPU float32 ``(C, n)`` contiguous, integer labels."""
    if not _enabled or p.device.type != "cpu" or y.device.type != "cpu" or p.dtype != torch.float32:
        return False
    if p.dim() != 2 or y.dim() != 1 or p.shape[1] != y.shape[0]:
        return False
    return _load() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    """Address of a tensor the C code reads or writes: CPU, contiguous (else an error, never a wild access)."""
    if t is None:
        return None
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"calibration kernel needs contiguous CPU tensors, got {t.device} {tuple(t.stride())}")
    return t.data_ptr()


def chunk_statistics(
    p: torch.Tensor,
    y: torch.Tensor,
    ece: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    grid: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None,
) -> None:
    """Add a chunk into running totals, in place. ``ece``: ``(count (2M,) int64, sum (M,) float64, lower, upper)``,
    the edge tables (float64); ``grid``: ``(packed (C*size,) int64, hit (C*size,) int64, zero_sum (C,) float64,
    size, offset)``: count << 40 plus low 13 bits per bucket as ``calibration_torch`` packs them, hits per bucket,
    and the float64 sum of bucket 0 (values below the grid)."""
    c, n = p.shape
    num_bins = 0 if ece is None else ece[1].shape[0]
    e = ece or (None,) * 4
    g = grid or (None, None, None, 0, 0)
    status = _library.calib_chunk(
        _ptr(p), n, c, _ptr(y), _LABEL_TYPES[y.dtype], num_bins, *map(_ptr, (e[2], e[3], e[0], e[1])),
        g[3], g[4], *map(_ptr, g[:3]), int(ece is not None), int(grid is not None),
    )  # fmt: skip
    if status == 1:
        raise MemoryError("calibration kernel: no memory for its per-lane accumulators")
    if status == 2:
        raise ValueError(f"labels must lie in [0, {c - 1}] for {c} classes (calibration kernel)")


def select_gt(p: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[float]] | None:
    """The voxels with ``y != 0`` of a volume ``p (C, N)``, ``y (N,)``: ``(p_sel (C, n), y_sel (n,) in y's dtype,
    [min p, max p, min and max class sum (float32), min y, max y])`` in two passes over the labels; None when the
    kernel does not take the inputs or nothing is selected (the caller's path then checks the whole volume)."""
    if not available(p, y) or p.shape[1] == 0 or y.dtype not in _LABEL_TYPES:  # float or bool labels: torch's path
        return None
    c, size = p.shape
    p, y = p.contiguous(), y.contiguous()
    n = _library.calib_count(_ptr(y), _LABEL_TYPES[y.dtype], size)
    if n == 0:
        return None
    p_sel = torch.empty((c, n), dtype=p.dtype, device=p.device)
    y_sel = torch.empty(n, dtype=y.dtype, device=y.device)
    extremes = torch.empty(6, dtype=torch.float64, device=p.device)
    _library.calib_select(_ptr(p), size, c, _ptr(y), _LABEL_TYPES[y.dtype], n, *map(_ptr, (p_sel, y_sel, extremes)))
    return p_sel, y_sel, extremes.tolist()


def select_voxels(
    p: torch.Tensor, y: torch.Tensor, foreground: str, name: str = "probs", class_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_inputs.select_tensor_voxels`` (same results, checks and messages) with its ``"gt"`` selection of float32
    CPU volumes done by the kernel: one pass over the labels that copies the selected voxels out and finds the
    extremes the checks need, instead of ``flatnonzero``, two gathers and four reductions. Other cases: as before."""
    from ._inputs import select_tensor_voxels

    selected = select_gt(p, y) if foreground == "gt" else None
    if selected is None:
        return select_tensor_voxels(p, y, foreground, name, class_dim)
    p_sel, y_sel, values = selected
    _check_extremes(values, p.shape[0], name, class_dim)
    return p_sel, y_sel


def add_chunk(acc, p: torch.Tensor, y: torch.Tensor) -> None:
    """``CalibrationAccumulator._add_chunk``'s ECE and ``_add_grid``'s statistics of one chunk: the same running
    totals of ``acc``, except bucket 0's sum, accumulated directly (``grid_zero``) instead of as the class total minus
    the other buckets (exact to float64 rounding of values below 2**-octaves, not of the class total)."""
    ece, grid = _tables(acc, p.device, y.shape[0])
    if grid is not None:
        acc.chunks.append((p, y))  # refined by ``refine``
    chunk_statistics(p, y, ece, grid)


def add_volume(acc, p: torch.Tensor, y: torch.Tensor, name: str = "probs", class_dim: int = 1) -> bool:
    """The ``"gt"`` voxels of a volume ``p (C, N)``, ``y (N,)`` selected, checked (``select_voxels``' messages) and
    added to ``acc`` in one pass over the labels (``calib_gt``) instead of a selection pass and a pass over the
    selection; the selected values are kept for ``refine``. False (nothing added) when the kernel does not take the
    volume or it has no foreground: the caller then selects and adds as before (and checks such a volume whole)."""
    fused = not set(acc.names) - _FUSED_METRICS and acc.num_classes <= 256 and acc.num_bins < 255
    if acc.kernel is False or not fused or acc.value_dtype not in (None, torch.float32):
        return False
    if not available(p, y) or y.dtype not in _LABEL_TYPES or p.shape[0] != acc.num_classes:
        return False
    p, y = p.contiguous(), y.contiguous()
    c, size = p.shape
    dev, m = p.device, acc.num_bins
    geometry = bucket_grid("float32", m, acc.octaves)
    lut = _ece_lut(m, acc.octaves)
    extremes = torch.empty(6, dtype=torch.float64, device=dev)  # explicit: a torch.device("meta") context is no memory
    added = 0
    for start in range(0, size, PACK_FLUSH):  # slabs: the packed histogram stays exact (< PACK_FLUSH voxels)
        n = min(size, start + PACK_FLUSH) - start
        ece, grid = _tables(acc, dev, n)
        e, g = ece or (None,) * 4, grid or (None, None, None)
        out_p = torch.empty((c, n), dtype=torch.float32, device=dev)
        out_y = torch.empty(n, dtype=torch.uint8, device=dev)
        found = _library.calib_gt(
            p[:, start:].data_ptr(), size, n, c, y[start:].data_ptr(), _LABEL_TYPES[y.dtype], n, out_p.data_ptr(),
            out_y.data_ptr(), extremes.data_ptr(), m, lut.data_ptr(), *map(_ptr, (e[2], e[3], e[0], e[1])),
            geometry["size"], geometry["offset"], *map(_ptr, g[:3]), int(ece is not None), int(grid is not None),
        )  # fmt: skip
        if found < 0:
            raise MemoryError("calibration kernel: no memory for its per-lane accumulators")
        if grid is not None:
            acc._packed_voxels += found - n  # _tables counted the slab's voxels, at most this many selected
        if found:
            _check_extremes(extremes.tolist(), c, name, class_dim)
            if grid is not None:  # rows of stride n: refined in place, no compacting copy
                acc.chunks.append((out_p[:, :found], out_y[:found]))
        added += found
    if added:
        acc.count += added
        acc.value_dtype, acc.device, acc.kernel, acc._refined = torch.float32, dev, True, None
    return bool(added)


_FUSED_METRICS = {"ece", "cece", "tace", "ace", "ml1ace"}  # NLL and Brier take the eager ops over the selection


@functools.lru_cache(maxsize=64)
def _ece_lut(num_bins: int, octaves: int) -> torch.Tensor:
    """uint8 equal-width bin of each float32 bucket, ``num_bins`` where a bucket straddles an edge."""
    return torch.as_tensor(bucket_grid("float32", num_bins, octaves)["bins"].astype(np.uint8), device="cpu")


def _check_extremes(values: list[float], c: int, name: str, class_dim: int) -> None:
    """``select_voxels``' checks of the selected voxels from their extremes (min / max value and class sum, label)."""
    from ._inputs import probability_problem

    problem = probability_problem(name, *values[:4], class_dim)
    if problem:
        raise ValueError(problem)
    if values[4] < 0 or values[5] >= c:
        raise ValueError(f"labels must lie in [0, {c - 1}] for {c} classes, got [{int(values[4])}, {int(values[5])}].")


def _tables(acc, dev: torch.device, voxels: int) -> tuple[tuple | None, tuple | None]:
    """``acc``'s running ECE and bucket tables for a chunk of up to ``voxels`` voxels, made at the first chunk; the
    packed histogram is flushed first when the chunk could overflow it."""
    m, c, totals = acc.num_bins, acc.num_classes, acc.totals
    ece = grid = None
    if "ece" in acc.names:
        if "ece_count" not in totals:
            totals["ece_count"] = torch.zeros(2 * m, dtype=torch.int64, device=dev)
            totals["ece_sum"] = torch.zeros(m, dtype=torch.float64, device=dev)
        ece = (totals["ece_count"], totals["ece_sum"], *edge_tensors(m, "float32", dev))
    if acc.use_grid:
        acc.grid = bucket_grid("float32", m, acc.octaves)
        size = acc.grid["size"]
        if "grid_hit" not in totals:
            for name in ("grid_hit", "grid_count", "grid_packed", "grid_low"):
                totals[name] = torch.zeros(c * size, dtype=torch.int64, device=dev)
            totals["grid_zero"] = torch.zeros(c, dtype=torch.float64, device=dev)
        if acc._packed_voxels + voxels > PACK_FLUSH:
            acc._flush_packed()
        acc._packed_voxels += voxels
        grid = (totals["grid_packed"], totals["grid_hit"], totals["grid_zero"], size, acc.grid["offset"])
    return ece, grid


def refine(
    p: torch.Tensor, y: torch.Tensor, lut: torch.Tensor, size: int, offset: int, capacity: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(flat keys int64, values, hits bool)`` of the elements of a chunk (``p``: rows of unit stride) whose bucket
    ``lut`` (bool ``(C*size,)``) marks, class by class and in voxel order; ``capacity`` bounds their number (the
    marked buckets' counts)."""
    c, n = p.shape
    if p.device.type != "cpu" or (n > 1 and p.stride(1) != 1):
        raise ValueError(f"calibration kernel needs CPU rows of unit stride, got {p.device} {tuple(p.stride())}")
    # explicit device: under a ``torch.device("meta")`` context a bare factory call gives memory-less tensors
    keys = torch.empty(capacity, dtype=torch.int64, device=p.device)
    values = torch.empty(capacity, dtype=p.dtype, device=p.device)
    hits = torch.empty(capacity, dtype=torch.bool, device=p.device)
    lut = lut.contiguous().view(torch.uint8)
    found = _library.calib_refine(
        p.data_ptr(),
        n,
        p.stride(0),
        c,
        _ptr(y),
        _LABEL_TYPES[y.dtype],
        size,
        offset,
        _ptr(lut),
        capacity,
        *map(_ptr, (keys, values, hits)),
    )
    if found > capacity:  # cannot happen (capacity counts every marked element); nothing was written beyond it
        raise RuntimeError(f"calibration kernel found {found} elements for a capacity of {capacity}")
    return keys[:found], values[:found], hits[:found]
