"""``SegmentationCalibrationMetric``: the calibration metrics as a MONAI ``CumulativeIterationMetric``."""

from __future__ import annotations

from typing import Any

import torch
from monai.metrics import CumulativeIterationMetric

from calib_monai.checks import check_option
from calib_monai.defaults import TACE_THRESHOLD
from calib_monai.tensors import detached_plain_tensor

from .inputs import (
    POOLABLE_METRICS,
    REDUCTIONS,
    check_metric,
    metric_definition,
    selected_voxels,
)
from .statistics import selected_statistics, value_from_statistics

__all__ = ["SegmentationCalibrationMetric"]


class SegmentationCalibrationMetric(CumulativeIterationMetric):
    """Calibration error of segmentation outputs, accumulated volume by volume (one batch item = one volume).

    Each call stores, per volume, its value and its additive statistics (``calibration_statistics``), so that
    ``aggregate`` returns ``"mean"`` (of the per-volume values, NaN volumes left out: NACL, MbLS, CRaC), ``"pooled"``
    (all selected voxels binned together; not TACE / ACE, whose equal-mass bins are not additive) or ``"none"``.

    MONAI's ``CalibrationErrorMetric`` equals ``metric_name="cece", foreground="all"`` here (``"ml1ace"`` with
    ``calibration_reduction="average"``) up to its float32 accumulation (``tests/test_metrics_vs_monai.py``); it has
    no top-label ECE, voxel selection, equal-mass bins nor pooling.

    Args:
        metric_name: one of ``CALIBRATION_METRICS`` or ``METRIC_DEFINITIONS``.
        num_bins, foreground, include_background: None takes the metric's definition (``metric_definition``).
        reduction: ``"mean"``, ``"pooled"`` or ``"none"``.
        threshold: TACE: probabilities ``<= threshold`` are left out (Nixon et al. 2019).

    Inputs of ``__call__(y_pred, y)``: ``y_pred`` softmax probabilities ``(B, C, *spatial)``; ``y`` integer labels
    ``(B, 1, *spatial)`` or one-hot, or lists of channel-first tensors. The buffer, on ``y_pred``'s device, holds
    ``[values (N, 1), statistics (N, S)]`` float64; only the statistics reach the host.

    >>> import torch
    >>> probs = torch.tensor([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]).reshape(1, 2, 2, 2)  # (B, C, H, W)
    >>> labels = torch.tensor([1, 0, 0, 0]).reshape(1, 1, 2, 2)
    >>> metric = SegmentationCalibrationMetric("ece", num_bins=10, foreground="all")
    >>> for _ in range(2):  # two volumes, one per call
    ...     _ = metric(probs, labels)
    >>> [round(v, 4) for v in metric.aggregate("none").tolist()]  # 2/4 * |0.5 - 0.8| + 1/4 * 0.3 + 1/4 * 0.1
    [0.25, 0.25]
    """

    def __init__(
        self,
        metric_name: str = "ece",
        num_bins: int | None = None,
        foreground: str | None = None,
        reduction: str = "mean",
        include_background: bool | None = None,
        threshold: float = TACE_THRESHOLD,
    ) -> None:
        super().__init__()
        self.named_metric = check_metric(metric_name, threshold, named=True)
        # metric_name: the formula the statistics compute ("ml1ace" for "ml1ace_gt"); named_metric: the name given
        self.metric_name, self.num_bins, self.foreground, self.include_background = metric_definition(
            self.named_metric, num_bins, foreground, include_background
        )
        self.reduction = self._check_reduction(reduction)
        self.threshold = threshold

    def _check_reduction(self, reduction: Any) -> str:
        check_option("reduction", reduction, REDUCTIONS)
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
        y_pred = detached_plain_tensor(y_pred)
        y = detached_plain_tensor(y) if isinstance(y, torch.Tensor) else torch.as_tensor(y, device=y_pred.device)
        if y.ndim == y_pred.ndim and y.shape[1] == num_classes and num_classes > 1:
            if not bool(((y == 0) | (y == 1)).all()):  # one reduction on the device
                raise ValueError(f"y with {num_classes} channels must be one-hot (0/1 values), got other values.")
            y = y.max(dim=1).indices[:, None]  # the first class on ties
        parts = selected_voxels(y_pred, y, self.foreground, "y_pred", pooled=False)
        settings = (self.num_bins, self.include_background, self.threshold)
        name = self.metric_name
        stats = torch.stack([selected_statistics([part], (name,), *settings)[name].reshape(-1) for part in parts])
        values = [value_from_statistics(s, name, *settings[:2]) for s in stats.cpu()]  # per-volume bins only
        return torch.tensor(values, dtype=torch.float64, device=stats.device)[:, None], stats

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
        value = value_from_statistics(buffer[1].sum(dim=0), self.metric_name, self.num_bins, self.include_background)
        return torch.tensor(value, dtype=torch.float64)
