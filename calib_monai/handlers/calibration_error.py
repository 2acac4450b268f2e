"""Ignite handler of ``SegmentationCalibrationMetric``, usable as key or additional metric of MONAI engines."""

from __future__ import annotations

from collections.abc import Callable

from monai.handlers import IgniteMetricHandler

from calib_monai.defaults import TACE_THRESHOLD
from calib_monai.metrics.calibration import SegmentationCalibrationMetric

__all__ = ["SegmentationCalibrationError"]


class SegmentationCalibrationError(IgniteMetricHandler):
    """Attach :class:`calib_monai.metrics.SegmentationCalibrationMetric` as ``monai.handlers.MeanDice`` attaches
    ``DiceMetric`` (``"pred"``: softmax probabilities, ``"label"``: labels or one-hot)::

        "key_val_metric": {"val_ece": {
            "_target_": "calib_monai.handlers.SegmentationCalibrationError", "metric_name": "ece", "num_bins": 15,
            "foreground": "gt", "output_transform": "$monai.handlers.from_engine(['pred', 'label'])"}},
        "metric_cmp_fn": "$lambda current, best: current < best"

    Calibration errors are lower-is-better: hence ``metric_cmp_fn`` above. Logits raise a ``ValueError``.

    Args:
        metric_name, num_bins, foreground, reduction, include_background, threshold: see the metric.
        output_transform: extracts ``(y_pred, y)`` from ``engine.state.output``.
    """

    def __init__(
        self,
        metric_name: str = "ece",
        num_bins: int | None = None,
        foreground: str | None = None,
        reduction: str = "mean",
        include_background: bool | None = None,
        threshold: float = TACE_THRESHOLD,
        output_transform: Callable = lambda x: x,
    ) -> None:
        metric_fn = SegmentationCalibrationMetric(
            metric_name=metric_name,
            num_bins=num_bins,
            foreground=foreground,
            reduction=reduction,
            include_background=include_background,
            threshold=threshold,
        )
        super().__init__(metric_fn=metric_fn, output_transform=output_transform, save_details=True)
