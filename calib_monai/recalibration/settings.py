"""The calibrate step's settings (``configs/calibrate.json``'s ``calibration_settings``) as one typed object, checked
once when it is made: a value out of range is one line naming the key as the user sets it, the value and the fix.

>>> RecalibrationSettings(method="temperature").review["alpha"]
0.05
>>> RecalibrationSettings(folds=1)  # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: calibration_folds must be an integer >= 2 (...), got 1: set --calibration_folds e.g. 2.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from calib_monai import defaults
from calib_monai.bundle.runtime import as_bool
from calib_monai.checks import check_number, check_option
from calib_monai.recalibration.temperature import VOXEL_CHOICES
from calib_monai.review.contours import RISKS

__all__ = ["METHODS", "RecalibrationSettings"]

METHODS = ("temperature", "local_temperature")

# field: (the key a user sets, low, high, low_open, high_open, integer, what it is)
_NUMBERS = {
    "folds": ("calibration_folds", 2, None, False, False, True, "cross-fitting folds of validation subjects"),
    "split": ("calibration_split", 0, 1, False, True, False, "the share of validation subjects that fit"),
    "seed": ("seed", 0, None, False, False, True, "the seed of the split and the fit"),
    "max_voxels": ("calibration_settings#max_voxels", 1, None, False, False, True, "temperature scaling's voxels"),
    "max_slices": ("calibration_settings#max_slices", 1, None, False, False, True, "local temperature's slices"),
    "steps": ("calibration_settings#steps", 1, None, False, False, True, "local temperature's Adam steps"),
    "max_reference": ("calibration_settings#max_reference", 0, None, False, False, True, "training images"),
    "review_alpha": ("review_alpha", 0, 1, True, True, False, "the review rule's false-flag bound"),
    "contour_alpha": ("contour_alpha", 0, 1, True, True, False, "the share of cases a contour may fail"),
    "contour_epsilon": ("contour_epsilon", 0, 1, True, True, False, "the fraction of a structure a contour may miss"),
}
_SWITCHES = {
    "crossfit": "calibration_crossfit",
    "review_input_check": "review_input_check",
    "review_feature_check": "review_feature_check",
    "review_score_check": "review_score_check",
}


@dataclass(frozen=True)
class RecalibrationSettings:
    """What ``calibrate`` fits and how it scores the validated range.

    Args:
        method: ``"local_temperature"`` (:class:`~calib_monai.recalibration.LocalTemperatureScaling`) or
            ``"temperature"`` (one ``T``); key ``calibration_method``.
        voxels: temperature scaling's voxels, ``"foreground"`` (ground truth) or ``"all"``; ``calibration_voxels``.
        crossfit: every validation volume in the range, scored by the fit on the other folds
            (``calibration_crossfit``); else a plain split.
        folds: cross-fitting folds of validation subjects, at least 2 and at most the subjects
            (``calibration_folds``).
        split: without cross-fitting, the share of validation subjects that fit, in [0, 1); 0: in-sample
            (``calibration_split``).
        seed: of the split and the fit (the bundle's ``seed``).
        max_voxels, max_slices, steps: the fit's budget: temperature scaling's voxel sample, local temperature
            scaling's slices and Adam steps.
        max_reference: training images measured as the input and feature signals' reference (0: none).
        review_alpha, review_volume_factor, review_input_check, review_feature_check, review_score_check: the
            review rule stored with the range (:class:`~calib_monai.review.ValidatedRange`).
        contour_alpha, contour_epsilon, contour_risk: the contours' guarantee, each in (0, 1), and ``"per_case"``
            or ``"expected"`` (:mod:`calib_monai.review.contours`, stored as ``contours.json``).
    """

    method: str = defaults.RECALIBRATION_METHOD
    voxels: str = defaults.RECALIBRATION_VOXELS
    crossfit: bool = defaults.CROSSFIT
    folds: int = defaults.CROSSFIT_FOLDS
    split: float = defaults.CALIBRATION_SPLIT
    seed: int = 0
    max_voxels: int = defaults.MAX_VOXELS
    max_slices: int = defaults.MAX_SLICES
    steps: int = defaults.LTS_STEPS
    max_reference: int = defaults.MAX_REFERENCE
    review_alpha: float = defaults.REVIEW_ALPHA
    review_volume_factor: float = defaults.REVIEW_VOLUME_FACTOR
    review_input_check: bool = defaults.REVIEW_INPUT_CHECK
    review_feature_check: bool = defaults.REVIEW_FEATURE_CHECK
    review_score_check: bool = defaults.REVIEW_SCORE_CHECK
    contour_alpha: float = defaults.CONTOUR_ALPHA
    contour_epsilon: float = defaults.CONTOUR_EPSILON
    contour_risk: str = defaults.CONTOUR_RISK

    def __post_init__(self) -> None:
        checked = {
            "method": check_option("calibration_method", self.method, METHODS),
            "voxels": check_option("calibration_voxels", self.voxels, VOXEL_CHOICES),
            "contour_risk": check_option("contour_risk", self.contour_risk, RISKS),
        }
        defaults_of = {f.name: f.default for f in fields(self)}
        for name, (key, low, high, low_open, high_open, integer, what) in _NUMBERS.items():
            try:
                checked[name] = check_number(
                    key, getattr(self, name), low, high, low_open=low_open, high_open=high_open, integer=integer,
                    hint=what,
                )  # fmt: skip
            except ValueError as err:
                raise ValueError(f"{str(err).rstrip('.')}: set --{key} e.g. {defaults_of[name]}.") from None
        factor = self.review_volume_factor
        checked["review_volume_factor"] = check_number("review_volume_factor", factor, 0)
        if 0 < checked["review_volume_factor"] < 1:
            raise ValueError(
                f"review_volume_factor must be 0 (the volume rule off) or >= 1, got {factor!r}: set "
                "--review_volume_factor 0 or e.g. 1.5."
            )
        checked |= {name: as_bool(getattr(self, name), key) for name, key in _SWITCHES.items()}
        if not (checked["review_score_check"] or checked["review_input_check"] or checked["review_feature_check"]):
            raise ValueError(
                "review_score_check, review_input_check and review_feature_check are all false: no signal would "
                "judge a case; set --review_score_check true (or another check)."
            )
        for name, value in checked.items():  # frozen: the checked values replace the given ones once
            object.__setattr__(self, name, value)

    @property
    def review(self) -> dict[str, Any]:
        """The review rule's settings as :class:`~calib_monai.review.ValidatedRange` takes them (``alpha``, ...)."""
        return {f.name.removeprefix("review_"): getattr(self, f.name) for f in fields(self) if f.name in _REVIEW}

    @property
    def contours(self) -> dict[str, Any]:
        """The contours' guarantee as :meth:`~calib_monai.review.ContourMargins.from_validation` takes it."""
        return {"alpha": self.contour_alpha, "epsilon": self.contour_epsilon, "risk": self.contour_risk}

    def record(self) -> dict[str, Any]:
        """What the manifest records as the settings that made the calibration and its range."""
        return asdict(self)


_REVIEW = {f"review_{k}" for k in ("alpha", "volume_factor", "input_check", "feature_check", "score_check")}
