"""The calibration metrics' per-volume statistics (values: ``calibration_numpy.value_from_statistics``): the flat
float64 statistics of one volume's selected voxels, routed by where they are (Triton kernels for "gt" on CUDA where
installed, the sorted path on CUDA otherwise, the bucket grid on the CPU). Shared by ``segmentation_calibration``
and ``SegmentationCalibrationMetric``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._inputs import as_tensors
from .calibration_kernel import select_voxels
from .calibration_sorted import sorted_path, sorted_statistics
from .calibration_torch import CalibrationAccumulator
from .calibration_triton import triton_volume_statistics

__all__ = ["per_volume_statistics", "selected_statistics", "torch_volume_statistics", "volume_statistics"]


def volume_statistics(
    p: Any,
    y: Any,
    metric_name: str,
    num_bins: int = 15,
    include_background: bool = True,
    threshold: float = 1e-3,
) -> np.ndarray:
    """Flat float64 statistics of the selected voxels of one volume (``p (C, n)``, ``y (n,)``, already checked).

    ECE: ``(M * 3)``, CECE: ``(C * M * 3)``, NLL / Brier: ``[count, sum]``; they add up over volumes. TACE / ACE:
    ``[value]`` (equal-mass bins depend on all the voxels binned together, so they are not additive). Reduced on
    the tensors' device (NumPy arrays: as CPU tensors); only the statistics come back (as NumPy).
    """
    if not isinstance(p, torch.Tensor):
        p, y = as_tensors(p, y)
    y = torch.as_tensor(y, device=p.device)
    return selected_statistics(p, y, metric_name, num_bins, include_background, threshold).cpu().numpy()


def per_volume_statistics(
    p: torch.Tensor,
    y: torch.Tensor,
    metric_name: str,
    foreground: str,
    num_bins: int = 15,
    include_background: bool = True,
    threshold: float = 1e-3,
    class_dim: int = 1,
    name: str = "probs",
) -> tuple[list[torch.Tensor], list[int]]:
    """Each volume's ``selected_statistics`` of ``p (B, C, N)``, ``y (B, N)`` and the volumes that select no voxel
    (``name`` in the checks' messages): "gt" on CUDA with Triton selected, checked and binned in one read, otherwise
    selected (by the compiled pass on the CPU) and binned. ``segmentation_calibration``'s and the metric class's."""
    settings, stats, empty = (num_bins, include_background, threshold), [], []
    for b in range(p.shape[0]):
        fast = triton_volume_statistics(p[b : b + 1], y[b : b + 1], metric_name, foreground, *settings, class_dim, name)
        if fast is None:
            pb, yb = select_voxels(p[b], y[b], foreground, name, class_dim)
            empty += [b] if yb.shape[0] == 0 else []
            fast = selected_statistics(pb, yb, metric_name, *settings)
        stats.append(fast)
    return stats, empty


def selected_statistics(
    p: torch.Tensor,
    y: torch.Tensor,
    metric_name: str,
    num_bins: int = 15,
    include_background: bool = True,
    threshold: float = 1e-3,
) -> torch.Tensor:
    """``volume_statistics`` as a flat float64 tensor on the voxels' device: the sorted path for CUDA voxels
    (whole-tensor operations; the grid's many small steps are launch- and sync-bound on a GPU), the accumulator's
    bucket grid otherwise and for an empty selection; half-precision values binned as float32."""
    p = p.float() if p.dtype in (torch.float16, torch.bfloat16) else p
    if sorted_path(p) and y.numel():
        return sorted_statistics(p, y, (metric_name,), num_bins, include_background, threshold)[metric_name]
    acc = CalibrationAccumulator((metric_name,), p.shape[0], num_bins, include_background, threshold)
    acc.add(p, y)
    return torch_volume_statistics(acc, metric_name, p.device)


def torch_volume_statistics(acc: CalibrationAccumulator, metric_name: str, device: torch.device) -> torch.Tensor:
    """``volume_statistics`` of an accumulator's voxels as a flat float64 tensor on ``device`` (the voxels'; zeros
    when empty, which ``value_from_statistics`` turns into NaN; ``[value]`` for TACE / ACE)."""
    if metric_name in ("tace", "ace"):
        return torch.tensor([acc.adaptive_errors()[metric_name]], dtype=torch.float64, device=device)
    stats = acc.statistics(metric_name)
    if stats is None:
        classwise = acc.num_classes * acc.num_bins * 3
        size = {"ece": acc.num_bins * 3, "cece": classwise, "ml1ace": classwise}.get(metric_name, 2)
        return torch.zeros(size, dtype=torch.float64, device=device)
    return stats.reshape(-1)
