"""The old names of the measuring and recalibrating modules and handlers (issue 32.6) still work for one release,
each with a FutureWarning that names the new one; the new names are the objects the old ones give."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import calib_monai.handlers as handlers
import calib_monai.metrics.calibration_error as calibration_error
import calib_monai.recalibration as recalibration
from calib_monai.recalibration import fitting


def _fresh_import(module: str) -> str:
    """The warnings a fresh interpreter prints when it imports ``module`` (the alias warns once, at first import)."""
    code = (
        "import warnings\nwith warnings.catch_warnings(record=True) as seen:\n    warnings.simplefilter('always')\n"
        f"    import {module}\nprint([f'{{w.category.__name__}}: {{w.message}}' for w in seen])"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize(
    "old, new",
    [
        ("calib_monai.calibration", "calib_monai.recalibration"),
        ("calib_monai.calibration.fitting", "calib_monai.recalibration"),
        ("calib_monai.metrics.calibration", "calib_monai.metrics.calibration_error"),
        ("calib_monai.handlers.calibration_fit", "calib_monai.handlers.recalibration"),
        ("calib_monai.handlers.calibration", "calib_monai.handlers.calibration_error"),
    ],
)
def test_an_old_module_name_warns_and_names_the_new(old, new):
    printed = _fresh_import(old)
    assert f"FutureWarning: {old.rsplit('.fitting')[0]} is renamed {new} (" in printed and "removed in 0.3.0" in printed


def test_the_old_names_give_the_same_objects():
    old = importlib.import_module("calib_monai.calibration")
    assert old.recalibrate is recalibration.recalibrate and old.CalibrateLogitsd is recalibration.CalibrateLogitsd
    assert importlib.import_module("calib_monai.calibration.fitting") is fitting
    assert importlib.import_module("calib_monai.metrics.calibration").ece is calibration_error.ece


def test_the_old_handler_names_warn_and_are_the_same_handlers():
    with pytest.warns(FutureWarning, match="Use SegmentationCalibrationError"):
        metric = handlers.SegmentationCalibration(metric_name="ece")
    assert isinstance(metric, handlers.SegmentationCalibrationError)
    with pytest.warns(FutureWarning, match="Use RecalibrationFitter"):
        fitter = handlers.CalibrationFitter("calibration.pt", "model.pt", num_classes=2)
    assert isinstance(fitter, handlers.RecalibrationFitter) and fitter.method == "local_temperature"
