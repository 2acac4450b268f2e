"""``configs/calibrate.json`` and the calibration keys of ``evaluate.json`` and ``inference.json``.

``calibrate`` (over ``train.json``, like ``evaluate.json``) runs the validation volumes through the trained network and
fits a temperature (``calibration_method`` ``"temperature"``, default) or a local temperature network
(``"local_temperature"``) on their logits: ``<models>/calibration.pt`` and ``calibration.json``. ``evaluate`` and
``inference`` apply it before the softmax when the file is there and was fitted for the ``model.pt`` they load
(``calib_monai.calibration.CalibrateLogitsd``); ``evaluate`` also scores the uncalibrated softmax
(``test_ece_uncalibrated``), so its output shows ECE before and after.
"""

from __future__ import annotations

from typing import Any

from calib_monai.bundle_factory.checks import DATA_CHECK, REPORT_ERRORS, check_settings
from calib_monai.bundle_factory.common import FLOAT_PRED
from calib_monai.bundle_factory.specs import Dataset, Method

__all__ = ["CALIBRATION_PATH", "calibrate_config", "calibrate_logits"]

CALIBRATION_PATH = "$@output_dir + '/calibration.pt'"


def calibrate_logits(weights: str, uncalibrated_key: str | None = None) -> dict[str, Any]:
    """The transform that applies ``@calibration_path`` (fitted for ``weights``) to the logits under ``pred``."""
    transform = {"_target_": "calib_monai.calibration.CalibrateLogitsd", "keys": "pred",
                 "calibration": "@calibration_path", "weights": weights}  # fmt: skip
    if uncalibrated_key:
        transform["uncalibrated_key"] = uncalibrated_key
    return transform


def calibrate_config(name: str, method: Method, dataset: Dataset) -> dict[str, Any]:
    """``configs/calibrate.json`` (over train.json): fit the calibration on the validation volumes."""
    return {
        "calibration_path": CALIBRATION_PATH,
        "calibration_method": "temperature",
        "calibration_voxels": "foreground",  # temperature scaling's NLL on ground-truth foreground voxels, or "all"
        # the raw logits only: no softmax, no one-hot, no metrics
        "validate#postprocessing": {"_target_": "Compose", "transforms": [FLOAT_PRED]},
        "validate#key_metric": None,
        "validate#additional_metrics": None,
        "validate#handlers": [
            {
                "_target_": "calib_monai.handlers.NetworkWeightsLoader",
                "load_path": "$@output_dir + '/model.pt'",
                "network": "@network",
                "map_location": "@device",
            },
            {
                "_target_": "calib_monai.handlers.CalibrationFitter",
                "output_path": "@calibration_path",
                "weights": "$@output_dir + '/model.pt'",
                "method": "@calibration_method",
                "voxels": "@calibration_voxels",
                "num_classes": "@num_classes",
                "in_channels": "@in_channels",
                "seed": "@seed",
            },
        ],
        "initialize": [REPORT_ERRORS, check_settings(), "$monai.utils.set_determinism(seed=@seed)"],
        "run": [DATA_CHECK, "$@validate#evaluator.run()"],
        "calibrate": [DATA_CHECK, "$@validate#evaluator.run()"],
    }
