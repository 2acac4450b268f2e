"""``configs/calibrate.json`` and the calibration keys of ``evaluate.json`` and ``inference.json``.

``calibrate`` (over ``train.json``, like ``evaluate.json``) runs the validation volumes through the trained network and
fits a local temperature network (``calibration_method`` ``"local_temperature"``, default) or one temperature
(``"temperature"``) on their logits: ``<models>/calibration.pt`` and ``calibration.json``. ``evaluate`` and
``inference`` apply it before the softmax when the file is there and was fitted for the ``model.pt`` they load
(``calib_monai.calibration.CalibrateLogitsd``); ``evaluate`` also scores the uncalibrated softmax
(``test_ece_uncalibrated``), so its output shows ECE before and after.

``calibrate`` also stores the validated range (``<models>/validated_range.json``: the validation volumes' case
scores under the fitted calibration), and ``inference`` scores every case against it (``CaseQualityd``: estimated
DSC, volumes and the review flag in ``<case>_quality.json`` and ``quality.csv``).
"""

from __future__ import annotations

from typing import Any

from calib_monai.bundle_factory.checks import DATA_CHECK, REPORT_ERRORS, check_settings
from calib_monai.bundle_factory.common import FLOAT_PRED
from calib_monai.bundle_factory.specs import Dataset, Method

__all__ = ["CALIBRATION_PATH", "calibrate_config", "calibrate_logits", "case_quality_keys"]

CALIBRATION_PATH = "$@output_dir + '/calibration.pt'"
VALIDATED_RANGE_PATH = "$@output_dir + '/validated_range.json'"
#: The review rule (calib_monai.calibration.validated_range; chosen by the quality study, docs/results): flag below
#: the k-th lowest validation case score or intensities unlike the validation images,
#: k = max(1, floor(alpha (n + 1))); volume_factor 0 leaves the volume rule off.
REVIEW = {"review_alpha": 0.05, "review_volume_factor": 0.0, "review_input_check": True}


def case_quality_keys() -> dict[str, Any]:
    """``inference.json``'s case quality: the validated range next to the weights and the transform that scores each
    case against it (its ``review`` flag)."""
    return {
        "validated_range_path": "$os.path.join(os.path.dirname(@model_path), 'validated_range.json')",
        "case_quality": {
            "_target_": "calib_monai.calibration.CaseQualityd",
            "keys": "pred",
            "validated_range": "@validated_range_path",
            "weights": "@model_path",
            "label_names": "@label_names",
        },
    }


def calibrate_logits(weights: str, uncalibrated_key: str | None = None) -> dict[str, Any]:
    """The transform that applies ``@calibration_path`` (fitted for ``weights``) to the logits under ``pred``."""
    transform = {
        "_target_": "calib_monai.calibration.CalibrateLogitsd",
        "keys": "pred",
        "calibration": "@calibration_path",
        "weights": weights,
    }
    if uncalibrated_key:
        transform["uncalibrated_key"] = uncalibrated_key
    return transform


def calibrate_config(name: str, method: Method, dataset: Dataset) -> dict[str, Any]:
    """``configs/calibrate.json`` (over train.json): fit the calibration on the validation volumes."""
    return {
        "calibration_path": CALIBRATION_PATH,
        # local temperature: the quality and calibrated studies (docs/results) find it the one recalibration that keeps
        # the foreground ECE low and the probabilities readable over all voxels (case score, volumes) for every loss
        "calibration_method": "local_temperature",
        "calibration_voxels": "foreground",  # temperature scaling's NLL on ground-truth foreground voxels, or "all"
        "validated_range_path": VALIDATED_RANGE_PATH,
        **REVIEW,
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
                "validated_range_path": "@validated_range_path",
                "label_names": "@label_names",
                "review_alpha": "@review_alpha",
                "review_volume_factor": "@review_volume_factor",
                "review_input_check": "$calib_monai.bundle.as_bool(@review_input_check)",
            },
        ],
        "initialize": [REPORT_ERRORS, check_settings(), "$monai.utils.set_determinism(seed=@seed)"],
        "run": [DATA_CHECK, "$@validate#evaluator.run()"],
        "calibrate": [DATA_CHECK, "$@validate#evaluator.run()"],
    }
