"""The bucket grid of the calibration statistics: float values in [0, 1] bucketed by their bit pattern (an order-
preserving grid, fine where probabilities crowd), the equal-width bin of each bucket, and the packed int64 histogram's
limits. Shared by the eager torch ops (``calibration_torch``) and the compiled CPU pass (``calibration_kernel``)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from .calibration_numpy import bin_edge_tables, equal_width_bin_index

__all__ = ["GRID_OCTAVES", "GRID_SHIFT", "PACK_FLUSH", "PACK_SHIFT", "bucket_grid", "edge_tensors", "grid_octaves"]

# 2**(23 - 13) = 1024 buckets per octave of float32 values (float64: the same buckets, shifted 29 bits more).
GRID_SHIFT = 13
# ACE bins every value: octaves down to 2**-24 get their own buckets, values below share bucket 0.
GRID_OCTAVES = 24
# The packed int64 histogram of float32 values holds the count in bits 40.. and the sum of 13-bit low parts below:
# exact while a bucket has < 2**23 values, so it is flushed into separate totals every 2**22 voxels.
PACK_SHIFT = 40
PACK_FLUSH = 1 << 22


@functools.lru_cache(maxsize=64)
def edge_tensors(num_bins: int, dtype: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``bin_edge_tables`` as float64 tensors on ``device`` (a few numbers, made where the values are), read only.
    Made once per device: a copy to a GPU from host memory synchronises, and a loss calls this every step."""
    return tuple(torch.tensor(t.tolist(), dtype=torch.float64, device=device) for t in bin_edge_tables(num_bins, dtype))


def grid_octaves(num_bins: int, thresholds: dict) -> int:
    """Octaves below 1 that get buckets: values under 2**-octaves share bucket 0, which must lie in the first
    equal-width bin (CECE) and at or below the threshold (TACE), so that it is never refined; ACE needs them all."""
    octaves = max(1, (num_bins - 1).bit_length())  # 2**-octaves <= 1 / M
    for threshold in thresholds.values():
        if threshold is None or threshold <= 2.0**-GRID_OCTAVES:
            return GRID_OCTAVES
        octaves = max(octaves, int(np.ceil(-np.log2(threshold))))  # 2**-octaves <= threshold
    return min(octaves, GRID_OCTAVES)


@functools.lru_cache(maxsize=64)
def bucket_grid(dtype: str, num_bins: int, octaves: int) -> dict:
    """Host-side geometry of the bucket grid of ``dtype`` values in [0, 1]: key offset, bucket count, the value range
    and equal-width bin of each bucket, and which buckets straddle a bin edge."""
    fdtype = np.dtype(dtype)
    itype = np.int32 if fdtype == np.float32 else np.int64
    shift = GRID_SHIFT + (np.finfo(fdtype).nmant - 23)
    low = int(np.asarray(2.0**-octaves, dtype=fdtype).view(itype)) >> shift
    top = int(np.asarray(1.0, dtype=fdtype).view(itype)) >> shift
    keys = np.arange(low, top + 1, dtype=np.int64)  # bucket b >= 1 holds the bit patterns of key low - 1 + b
    first = (keys << shift).astype(itype).view(fdtype)
    last = (((keys + 1) << shift) - 1).astype(itype).view(fdtype)
    lows = np.concatenate([np.zeros(1, fdtype), first])
    highs = np.concatenate([np.nextafter(first[:1], np.zeros(1, fdtype)), last])
    highs[-1] = 1.0  # the bucket of 1.0 holds nothing above it
    bins = equal_width_bin_index(lows, num_bins)
    straddle = bins != equal_width_bin_index(highs, num_bins)
    # float32: a bucket's values are lows[b] + j * ulp[b], j < 2**13 its low bits (bucket 0 excepted: mixed ulps)
    ulp = np.spacing(lows).astype(np.float64)
    return {
        "shift": shift,
        "offset": low - 1,
        "size": top - low + 2,
        "lows": lows,
        "highs": highs,
        "ulp": ulp,
        "bins": np.where(straddle, num_bins, bins),
        "straddle": np.flatnonzero(straddle),
    }
