"""Deprecated: renamed :mod:`calib_monai.metrics.calibration_error`. Removed in 0.3.0."""

from calib_monai._renamed import alias_module

globals().update(
    {
        k: v
        for k, v in vars(alias_module(__name__, "calib_monai.metrics.calibration_error")).items()
        if not k.startswith("__")
    }
)
