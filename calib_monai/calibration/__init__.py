"""Deprecated: renamed :mod:`calib_monai.recalibration` (post-hoc recalibration; calibration error is measured by
:mod:`calib_monai.metrics.calibration_error`). Removed in 0.3.0."""

from calib_monai._renamed import alias_package

_SUBMODULES = [
    "external",
    "fitting",
    "local_temperature",
    "nnunet_files",
    "readers",
    "references",
    "stored",
    "temperature",
]
alias_package(__name__, "calib_monai.recalibration", _SUBMODULES, globals())
