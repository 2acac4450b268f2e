"""Calibration and segmentation metrics.

Reductions over volumes are named: the functions ``ece``, ``cece``, ``tace``, ``ace``, ``ml1ace``, ``nll``, ``brier``
and ``calibration_errors`` are *pooled over all volumes given* (their voxels binned together); the papers' tables, the
bundles' ``val_*`` / ``test_*`` metrics (``SegmentationCalibrationMetric``, default ``reduction="mean"``) and the
report's ``summary.json`` columns are the *mean over volumes* of per-volume values (``SegmentationReportMetric``;
its ``pooled_*`` values are the pooled ones).
"""

from .calibration import (
    CALIBRATION_METRICS,
    ace,
    brier,
    calibration_errors,
    cece,
    ece,
    ml1ace,
    nll,
    segmentation_calibration,
    tace,
    value_from_statistics,
    volume_statistics,
)
from .calibration_metric import SegmentationCalibrationMetric
from .case_quality import CASE_SCORE, case_quality, estimated_dice, low_confidence_fraction, predicted_volumes
from .failure_detection import (
    augrc,
    aurc,
    failure_detection_summary,
    quality_agreement,
    risk_coverage_curve,
    save_risk_coverage_plot,
)
from .ranking import friedman_rank, mean_case_rank, rank_methods, sum_rank
from .reliability import plot_reliability, reliability_diagram_data, save_reliability_diagram
from .report_table import SegmentationReportTable
from .segmentation import segmentation_metrics_per_volume
from .segmentation_report import SegmentationReportMetric
