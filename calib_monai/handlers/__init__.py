"""Ignite handlers that attach calib_monai metrics and updates to MONAI engines."""

from __future__ import annotations

from .alm import ALMUpdateHandler
from .calibration_error import SegmentationCalibrationError
from .checkpoint import TrainingCheckpoint
from .folder_lock import HoldOutputFolder
from .history import EpochSnapshots, ValidationHistory
from .recalibration import RecalibrationFitter
from .report import SegmentationReport, SegmentationReportMetricHandler, SegmentationReportSaver
from .rng import capture_rng_state, restore_rng_state
from .selection import ModelSelection, select_epoch
from .summary import EpochSummary, InferenceSummary
from .weights import NetworkWeightsLoader
