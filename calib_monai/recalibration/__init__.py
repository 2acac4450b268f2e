"""Recalibration (post-hoc): temperatures fitted on held-out voxels, stored next to a bundle's weights and applied to
its logits (or to saved probabilities) without changing the segmentation on the network's grid, and the validated range
measured with them (:func:`recalibrate`; the range and its review rule are :mod:`calib_monai.review`'s). Measuring
calibration error is :mod:`calib_monai.metrics.calibration`."""

from calib_monai.recalibration.external import calibrate_probabilities
from calib_monai.recalibration.local_temperature import LocalTemperatureScaling, temperature_maps
from calib_monai.recalibration.recalibrate import recalibrate
from calib_monai.recalibration.settings import RecalibrationSettings
from calib_monai.recalibration.stored import (
    CALIBRATION_FILE,
    CalibrateLogitsd,
    Uncalibrated,
    calibrate_volume,
    calibrate_volumes,
    case_score_offsets,
    load_calibration,
    load_calibrations,
)
from calib_monai.recalibration.temperature import (
    TemperatureScaling,
    calibration_voxels,
    fit_temperature,
    sample_voxels,
    temperature_scale,
)

__all__ = [
    "CALIBRATION_FILE",
    "CalibrateLogitsd",
    "LocalTemperatureScaling",
    "RecalibrationSettings",
    "TemperatureScaling",
    "Uncalibrated",
    "calibrate_probabilities",
    "calibration_voxels",
    "calibrate_volume",
    "calibrate_volumes",
    "case_score_offsets",
    "fit_temperature",
    "load_calibration",
    "load_calibrations",
    "recalibrate",
    "sample_voxels",
    "temperature_maps",
    "temperature_scale",
]
