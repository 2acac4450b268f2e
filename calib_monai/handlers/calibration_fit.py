"""Deprecated: renamed :mod:`calib_monai.handlers.recalibration` (``RecalibrationFitter``). Removed in 0.3.0."""

from calib_monai._renamed import alias_module

globals().update(
    {
        k: v
        for k, v in vars(alias_module(__name__, "calib_monai.handlers.recalibration")).items()
        if not k.startswith("__")
    }
)
