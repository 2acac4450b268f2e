"""Deprecated: renamed :mod:`calib_monai.metrics.calibration_error`. Removed in 0.3.0."""

from calib_monai._renamed import alias_module

alias_module(__name__, "calib_monai.metrics.calibration_error", globals())
