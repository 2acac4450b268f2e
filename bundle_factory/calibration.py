"""``configs/calibrate.json`` and the calibration keys of ``evaluate.json`` and ``inference.json``.

``calibrate`` (over ``train.json``, like ``evaluate.json``) runs the validation volumes through the trained network and
fits a local temperature network (``calibration_method`` ``"local_temperature"``, default) or one temperature
(``"temperature"``) on their logits: ``<models>/calibration.pt`` and ``calibration.json``. ``evaluate`` and
``inference`` apply it before the softmax when the file is there and was fitted for the ``model.pt`` they load
(``calib_monai.recalibration.CalibrateLogitsd``); ``evaluate`` also scores the uncalibrated softmax
(``test_ece_uncalibrated``), so its output shows ECE before and after.

Every validation volume's case score is measured with a recalibration it did not fit (``calibration_crossfit``,
default true: 2-fold cross-fitting, seeded halves each scored by the fit on the other, the served recalibration fitted
on all; false: a plain split, ``calibration_split`` of them fit, the others measure) and stored with its image
statistics and pooled bottleneck features as the validated range (``<models>/validated_range.json``, with the rule's
false-flag bound), and ``inference`` scores every case against it (``CaseQualityd``: estimated DSC, volumes and the
review flag in ``<case>_quality.json`` and ``quality.csv``); ``evaluate`` runs the same transform on the test
volumes and writes the flag beside the true DSC (``review_flag``, ``review_reasons`` in ``eval/metrics.csv``).
"""

from __future__ import annotations

from typing import Any

from bundle_factory.checks import DATA_CHECK, REPORT_ERRORS, check_settings
from bundle_factory.common import FLOAT_PRED
from bundle_factory.specs import Dataset, Method
from calib_monai import defaults

__all__ = [
    "CALIBRATION_PATH",
    "calibrate_config",
    "calibrate_logits",
    "case_quality_keys",
    "contour_keys",
    "evaluation_case_quality",
]

CALIBRATION_PATH = "$@output_dir + '/calibration.pt'"
VALIDATED_RANGE_PATH = "$@output_dir + '/validated_range.json'"
#: The review rule (calib_monai.review.validated_range): measure the case and the n validation volumes by case
#: score, image (intensities, sharpness, geometry) and network features as robust z-scores, take each one's largest and
#: flag the case among the k = floor(alpha (m + 1)) most extreme of the m validation subjects (one full-conformal rule,
#: bound k / (m + 1) <= alpha; a subject is a patient, ACDC's two frames of one are one);
#: volume_factor 0 leaves the volume rule off.
REVIEW = {
    "review_alpha": defaults.REVIEW_ALPHA,
    "review_volume_factor": defaults.REVIEW_VOLUME_FACTOR,
    "review_input_check": defaults.REVIEW_INPUT_CHECK,
    "review_feature_check": defaults.REVIEW_FEATURE_CHECK,
    "review_score_check": defaults.REVIEW_SCORE_CHECK,
}
#: Each structure's inner and outer contour (calib_monai.review.contours): the outer holds >= 1 - epsilon of the true
#: structure and the inner lies >= 1 - epsilon inside it, each for >= 1 - alpha of cases ("per_case", counted by
#: subject: m >= 9 at alpha 0.1), or the expected missed fraction <= alpha ("expected"); stored as contours.json
CONTOURS = {
    "contour_alpha": defaults.CONTOUR_ALPHA,
    "contour_epsilon": defaults.CONTOUR_EPSILON,
    "contour_risk": defaults.CONTOUR_RISK,
}
#: calibrate.json's keys, each an argument of calib_monai.recalibration.RecalibrationSettings (checked there once)
SETTINGS_KEYS = {
    "method": "@calibration_method",
    "voxels": "@calibration_voxels",
    "crossfit": "@calibration_crossfit",
    "folds": "@calibration_folds",
    "split": "@calibration_split",
    "seed": "@seed",
    **{key: f"@{key}" for key in REVIEW},
    **{key: f"@{key}" for key in CONTOURS},
}


def case_quality_keys() -> dict[str, Any]:
    """``inference.json``'s case quality: the validated range next to the weights and the transform that scores each
    case against it (its ``review`` flag)."""
    return {
        "validated_range_path": "$os.path.join(os.path.dirname(@model_path), 'validated_range.json')",
        "case_quality": {
            "_target_": "calib_monai.review.CaseQualityd",
            "keys": "pred",
            "validated_range": "@validated_range_path",
            "weights": "@model_path",
            "label_names": "@label_names",
            "network": "@network",  # its bottleneck features: the range's feature signal
        },
    }


def contour_keys() -> dict[str, Any]:
    """``inference.json``'s contours: the margins ``calibrate`` chose (``contours.json`` next to the weights) and the
    transform that makes each case's inner and outer contours after the review verdict."""
    return {
        "contours_path": "$os.path.join(os.path.dirname(@model_path), 'contours.json')",
        "contour_margins": {
            "_target_": "calib_monai.review.ContourMarginsd",
            "keys": "pred",
            "contours": "@contours_path",
            "weights": "@model_path",
            "label_names": "@label_names",
        },
    }


def evaluation_case_quality() -> dict[str, Any]:
    """``evaluate.json``'s case quality: ``inference.json``'s transform on the calibrated softmax of the test volumes
    on the network's grid (``prob``), as ``inferring`` scores a case, so ``eval/metrics.csv`` holds the review flag
    ``inferring`` gives beside the true DSC."""
    keys = case_quality_keys()
    keys["validated_range_path"] = VALIDATED_RANGE_PATH
    keys["case_quality"] = {**keys["case_quality"], "keys": "prob", "weights": "$@output_dir + '/model.pt'"}
    return keys


def calibrate_logits(weights: str, uncalibrated_key: str | None = None) -> dict[str, Any]:
    """The transform that applies ``@calibration_path`` (fitted for ``weights``) to the logits under ``pred``."""
    transform = {
        "_target_": "calib_monai.recalibration.CalibrateLogitsd",
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
        "calibration_method": defaults.RECALIBRATION_METHOD,
        # temperature scaling's NLL on ground-truth foreground voxels, or "all"
        "calibration_voxels": defaults.RECALIBRATION_VOXELS,
        # 2-fold cross-fitting: every validation volume in the validated range, scored by the fit on the other half
        # (m >= 19 subjects give k >= 1 at alpha 0.05: Hippocampus's 25-26 volumes; ACDC's 10 patients need alpha
        # 0.1); false: the plain split below
        "calibration_crossfit": defaults.CROSSFIT,
        # how many cross-fitting folds of validation subjects (2: halves; each fold scored by the fit on the others)
        "calibration_folds": defaults.CROSSFIT_FOLDS,
        # without cross-fitting, the share of validation volumes that fit the recalibration; the others measure
        "calibration_split": defaults.CALIBRATION_SPLIT,
        "validated_range_path": VALIDATED_RANGE_PATH,
        **REVIEW,
        **dataset.review,
        **CONTOURS,
        # every setting above as one object, each value range-checked once when initialize builds it; its fit
        # budgets (max_voxels, max_slices, steps, max_reference) are set as --calibration_settings#max_voxels ...
        "calibration_settings": {"_target_": "calib_monai.recalibration.RecalibrationSettings", **SETTINGS_KEYS},
        # the raw logits only: no softmax, no one-hot, no metrics
        "validate#postprocessing": {"_target_": "Compose", "transforms": [FLOAT_PRED]},
        "validate#key_metric": None,
        "validate#additional_metrics": None,
        "validate#handlers": [
            # first: the weights are loaded, fitted for and published under the run folder's lock
            {"_target_": "calib_monai.handlers.HoldOutputFolder", "folder": "@output_dir"},
            {
                "_target_": "calib_monai.handlers.NetworkWeightsLoader",
                "load_path": "$@output_dir + '/model.pt'",
                "network": "@network",
                "map_location": "@device",
            },
            {
                "_target_": "calib_monai.handlers.RecalibrationFitter",
                "output_path": "@calibration_path",
                "weights": "$@output_dir + '/model.pt'",
                "settings": "@calibration_settings",
                "validated_range_path": "@validated_range_path",
                "label_names": "@label_names",
                # the reference images through the served chain
                "preprocessing": "@validate#preprocessing",
                # the input and feature signals' fixed reference: the training images through the served chain
                "reference_images": "$@data.datalist()['training']",
            },
        ],
        "initialize": [
            REPORT_ERRORS,
            check_settings(),
            "@calibration_settings",
            "$monai.utils.set_determinism(seed=@seed)",
        ],
        "run": [DATA_CHECK, "$@validate#evaluator.run()"],
        "calibrate": "@run",
    }
