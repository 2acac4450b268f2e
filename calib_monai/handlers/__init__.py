"""Ignite handlers that attach calib_monai metrics and updates to MONAI engines."""

from __future__ import annotations

from .alm import ALMUpdateHandler
from .calibration import SegmentationCalibration
from .calibration_fit import CalibrationFitter
from .report import SegmentationReport, SegmentationReportMetricHandler
from .report_saver import SegmentationReportSaver
from .training import EpochSummary, NetworkWeightsLoader, TrainingCheckpoint, select_epoch
