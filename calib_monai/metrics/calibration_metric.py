"""``SegmentationCalibrationMetric``: ECE / CECE / TACE / ACE / NLL / Brier as a MONAI ``CumulativeIterationMetric``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from monai.metrics import CumulativeIterationMetric

from ._inputs import as_numpy, check_foreground, check_num_bins, prepare_inputs, select_voxels
from .calibration import POOLABLE_METRICS, REDUCTIONS, _check_options, value_from_statistics, volume_statistics

__all__ = ["SegmentationCalibrationMetric"]


class SegmentationCalibrationMetric(CumulativeIterationMetric):
    """Calibration error of segmentation outputs, accumulated volume by volume (one batch item = one volume).

    Each call stores, per volume, its metric value and its statistics (per-bin counts and sums for ECE / CECE,
    count and sum for NLL / Brier; see ``calib_monai.metrics.calibration``), so ``aggregate`` can return any of

    - ``"mean"`` (default): unweighted mean of the per-volume values, volumes without selected voxels (NaN) left out,
      as the papers report (NACL, MbLS, CRaC: ``calib_segment_test.py`` of Bala93/CRac);
    - ``"pooled"``: the metric of all selected voxels of all volumes binned together (ECE, CECE, NLL, Brier only:
      equal-mass bins of TACE / ACE depend on all voxels at once and are not additive);
    - ``"none"``: the per-volume values, shape ``(num_volumes,)``.

    Args:
        metric_name: ``"ece"``, ``"cece"``, ``"tace"``, ``"ace"``, ``"nll"`` or ``"brier"``.
        num_bins: number of bins (15 in the papers).
        foreground: ``"gt"`` (label != 0, the papers), ``"union"`` (label or prediction foreground) or ``"all"``.
        reduction: ``"mean"``, ``"pooled"`` or ``"none"``.
        include_background: CECE / TACE / ACE: average over class 0 too (default, as the authors' code does).
        threshold: TACE: probabilities ``<= threshold`` are left out (1e-3, Nixon et al. 2019).

    Inputs of ``__call__(y_pred, y)``: ``y_pred`` softmax probabilities ``(B, C, *spatial)``; ``y`` integer labels
    ``(B, 1, *spatial)`` or one-hot ``(B, C, *spatial)`` (C > 1), or lists of channel-first tensors.
    The buffer holds ``[values (N, 1), statistics (N, S)]``; ``IgniteMetricHandler`` saves it as metric details.
    """

    def __init__(
        self,
        metric_name: str = "ece",
        num_bins: int = 15,
        foreground: str = "gt",
        reduction: str = "mean",
        include_background: bool = True,
        threshold: float = 1e-3,
    ) -> None:
        super().__init__()
        self.metric_name = _check_options(metric_name, threshold)
        self.num_bins = check_num_bins(num_bins)
        self.foreground = check_foreground(foreground)
        self.reduction = self._check_reduction(reduction)
        self.include_background = bool(include_background)
        self.threshold = threshold
        self._num_classes: int | None = None

    def _check_reduction(self, reduction: Any) -> str:
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
        if reduction == "pooled" and self.metric_name not in POOLABLE_METRICS:
            raise ValueError(
                f"reduction='pooled' is available for {POOLABLE_METRICS}, not for metric_name={self.metric_name!r} "
                "(equal-mass bins are not additive over volumes); use 'mean' or 'none'."
            )
        return str(reduction)

    def _compute_tensor(  # type: ignore[override]
        self, y_pred: torch.Tensor, y: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if y is None:
            raise ValueError("SegmentationCalibrationMetric needs labels y, got None.")
        if y_pred.ndim < 3:
            raise ValueError(f"y_pred must have shape (B, C, *spatial), got {tuple(y_pred.shape)}.")
        num_classes = int(y_pred.shape[1])
        if y.ndim == y_pred.ndim and y.shape[1] == num_classes and num_classes > 1:
            onehot = as_numpy(y, "y")
            if not np.isin(onehot, (0, 1)).all():
                raise ValueError(f"y with {num_classes} channels must be one-hot (0/1 values), got other values.")
            y = onehot.argmax(axis=1)[:, None]
        p, labels = prepare_inputs(y_pred, y)
        values, stats = [], []
        for b in range(p.shape[0]):
            p_sel, y_sel = select_voxels(p[b], labels[b], self.foreground)
            s = volume_statistics(
                p_sel, y_sel, self.metric_name, self.num_bins, self.include_background, self.threshold
            )
            stats.append(s)
            values.append(
                value_from_statistics(s, self.metric_name, self.num_bins, num_classes, self.include_background)
            )
        self._num_classes = num_classes
        device = y_pred.device if isinstance(y_pred, torch.Tensor) else None
        values_t = torch.as_tensor(np.array(values)[:, None], dtype=torch.float64, device=device)
        return values_t, torch.as_tensor(np.stack(stats), dtype=torch.float64, device=device)

    def aggregate(self, reduction: str | None = None) -> torch.Tensor:  # type: ignore[override]
        """Reduce the buffer; ``reduction`` (``"mean"``, ``"pooled"``, ``"none"``) overrides the constructor's."""
        reduction = self.reduction if reduction is None else self._check_reduction(reduction)
        buffer = self.get_buffer()
        if not isinstance(buffer, list) or len(buffer) != 2:
            raise ValueError("SegmentationCalibrationMetric has no data yet: call it on (y_pred, y) first.")
        values = buffer[0][:, 0].double().cpu()
        if reduction == "none":
            return values
        if reduction == "mean":
            kept = values[~torch.isnan(values)]
            return kept.mean() if kept.numel() else torch.tensor(float("nan"), dtype=torch.float64)
        stats = buffer[1].double().cpu().sum(dim=0).numpy()
        num_classes = self._num_classes or stats.size // (self.num_bins * 3)
        value = value_from_statistics(stats, self.metric_name, self.num_bins, num_classes, self.include_background)
        return torch.tensor(value, dtype=torch.float64)

