"""Calibration, segmentation, case-quality and failure-detection metrics. The functions ``ece``, ``cece``... pool
the voxels of all volumes given; ``SegmentationCalibrationMetric`` (the bundles' ``val_*`` / ``test_*``) and the
report's columns are the papers' mean over volumes (``calibration/functions.py``)."""

from .calibration import (
    CALIBRATION_METRICS,
    METRIC_DEFINITIONS,
    SegmentationCalibrationMetric,
    ace,
    brier,
    calibration_errors,
    calibration_statistics,
    cece,
    cece_all,
    ece,
    metric_definition,
    ml1ace,
    ml1ace_gt,
    nll,
    plot_reliability,
    reliability_diagram_data,
    save_reliability_diagram,
    segmentation_calibration,
    tace,
    value_from_statistics,
)
from .case_quality import (
    CASE_SCORE,
    case_quality,
    estimated_dice,
    fit_volume_interval_scale,
    low_confidence_fraction,
    predicted_volumes,
)
from .failure_detection import (
    augrc,
    aurc,
    failure_detection_summary,
    quality_agreement,
    risk_coverage_curve,
    save_risk_coverage_plot,
)
from .ranking import friedman_rank, mean_case_rank, rank_methods, sum_rank
from .report_table import SegmentationReportTable
from .segmentation import label_map_dice, segmentation_metrics_per_volume
from .segmentation_report import SegmentationReportMetric
