"""Recalibration (post-hoc): temperatures fitted on held-out voxels, stored next to a bundle's weights and applied to
its logits (or to saved probabilities) without changing the segmentation on the network's grid; the validated range
and review rule measured with them. Measuring calibration error is :mod:`calib_monai.metrics.calibration_error`."""

from calib_monai.recalibration.external import calibrate_probabilities, temperature_scale
from calib_monai.recalibration.local_temperature import LocalTemperatureScaling
from calib_monai.recalibration.recalibrate import recalibrate
from calib_monai.recalibration.stored import (
    CALIBRATION_FILE,
    CalibratedNetwork,
    CalibrateLogitsd,
    Uncalibrated,
    calibrate_volume,
    load_calibration,
    save_calibration,
)
from calib_monai.recalibration.temperature import TemperatureScaling, calibration_voxels, fit_temperature, sample_voxels
from calib_monai.recalibration.validated_range import (
    VALIDATED_RANGE_FILE,
    CaseQualityd,
    DeliveredDiced,
    ValidatedRange,
    load_validated_range,
    review_case,
)

__all__ = [
    "CALIBRATION_FILE",
    "VALIDATED_RANGE_FILE",
    "CaseQualityd",
    "DeliveredDiced",
    "ValidatedRange",
    "load_validated_range",
    "review_case",
    "CalibrateLogitsd",
    "CalibratedNetwork",
    "LocalTemperatureScaling",
    "TemperatureScaling",
    "Uncalibrated",
    "calibrate_probabilities",
    "calibration_voxels",
    "calibrate_volume",
    "fit_temperature",
    "load_calibration",
    "recalibrate",
    "sample_voxels",
    "save_calibration",
    "temperature_scale",
]
