"""Calibration and segmentation metrics."""

from .calibration import (
    CALIBRATION_METRICS,
    ace,
    brier,
    calibration_errors,
    cece,
    ece,
    nll,
    segmentation_calibration,
    tace,
    value_from_statistics,
    volume_statistics,
)
from .calibration_metric import SegmentationCalibrationMetric
from .ranking import friedman_rank, mean_case_rank, rank_methods, sum_rank
from .reliability import plot_reliability, reliability_diagram_data, save_reliability_diagram
from .segmentation import segmentation_metrics_per_volume
