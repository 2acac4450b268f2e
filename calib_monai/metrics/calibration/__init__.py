"""The calibration metrics: one torch implementation, computed on the inputs' device (``functions.py`` the entry
points, ``inputs.py`` the checks and the voxel selection, ``statistics.py`` the binning and the values, ``metric.py``
the MONAI ``CumulativeIterationMetric``, ``reliability.py`` the diagrams)."""

from .functions import (
    ace,
    brier,
    calibration_errors,
    calibration_statistics,
    cece,
    cece_all,
    ece,
    ml1ace,
    ml1ace_gt,
    nll,
    reliability_diagram_data,
    segmentation_calibration,
    tace,
)
from .inputs import (
    CALIBRATION_METRICS,
    METRIC_DEFINITIONS,
    POOLABLE_METRICS,
    metric_definition,
    probability_problem,
)
from .metric import SegmentationCalibrationMetric
from .reliability import plot_reliability, save_reliability_diagram
from .statistics import equal_width_bin, statistics_values, value_from_statistics
