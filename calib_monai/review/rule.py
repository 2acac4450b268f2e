"""The review rule of a validated range (:class:`ValidatedRange`), its false-flag bound and what it cannot judge; the
rule and its guarantee are stated in :mod:`calib_monai.review.validated_range`."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from calib_monai.atomic import write_json_atomically
from calib_monai.bundle.manifest import file_sha256
from calib_monai.defaults import REVIEW_ALPHA, REVIEW_SCORE_CHECK, REVIEW_VOLUME_FACTOR
from calib_monai.metrics.feature_distance import feature_distance_from_dict
from calib_monai.review.conformal import (
    at_least,
    combined_scores,
    competition_ranks,
    draw_bound,
    flag_rank,
    subject_maxima,
)
from calib_monai.review.input_signal import InputSignal
from calib_monai.review.reasons import NOT_VOUCHED, describe_rule, missing_scores, review_reason
from calib_monai.review.signals import MIN_INPUT_IMAGES, score_problem, signal_values

__all__ = ["STORED_FIELDS", "ValidatedRange", "write_measured"]

DRAW_CONFIDENCE = 0.9  # the share of validation draws draw_bound holds for


def _number(value: Any) -> float:  # a stored null is NaN
    return float("nan") if value is None else float(value)


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


@dataclass
class ValidatedRange:
    """The validation cases' case scores (NaN: no structure predicted), per-class expected volumes (mL), image
    statistics and network features, and the flag rule's settings. Built from them once, for the signals to read:
    ``subject_of`` (each volume's subject index), ``input_signal`` (:class:`InputSignal`), ``feature_distance`` and
    ``reference_distance`` (the fitted ``features`` and ``feature_reference`` distances, or None)."""

    scores: list[float]
    volumes: dict[str, list[float]] = field(default_factory=dict)
    alpha: float = REVIEW_ALPHA
    volume_factor: float = REVIEW_VOLUME_FACTOR
    info: dict[str, Any] = field(default_factory=dict)  # weights, calibration, split: what it was measured on
    inputs: list[list[float]] = field(default_factory=list)  # input_statistics of each validation image
    input_check: bool = False
    features: dict[str, Any] | None = None  # MahalanobisDistance.to_dict() of the validation features
    feature_check: bool = False
    input_names: list[str] = field(default_factory=list)  # input_statistic_names of the inputs ([]: unnamed)
    volume_interval_scale: float | None = None  # fit_volume_interval_scale on the scored volumes (None: not fitted)
    input_reference: dict[str, Any] | None = None  # {"mean", "std", "images"} of the training images' statistics
    # {"distance": MahalanobisDistance.to_dict() fitted on training images' features, "validation": the n distances}
    feature_reference: dict[str, Any] | None = None
    scored_on: str = "network grid"  # the grid of the scores and volumes: the network's, as a served case's
    subjects: list[str] = field(default_factory=list)  # each volume's subject (patient); []: each its own
    score_check: bool = REVIEW_SCORE_CHECK  # whether the lowest case score is one of the flag's signals
    # the cross-fitted fold that scored each volume ([]: one recalibration scored them all and serves): a case is
    # compared with volume i as fold score_folds[i] scores it (signals.CASE_SCORE_OFFSETS)
    score_folds: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < float(self.alpha) < 1:
            raise ValueError(
                f"validated range alpha must be in (0, 1), got {self.alpha}: set review_alpha to e.g. 0.05"
            )
        if float(self.volume_factor) != 0 and float(self.volume_factor) < 1:
            raise ValueError(
                f"validated range volume_factor must be 0 (off) or >= 1, got {self.volume_factor}: set "
                "review_volume_factor to 0 or e.g. 1.5"
            )
        self.alpha, self.volume_factor = float(self.alpha), float(self.volume_factor)
        if self.scored_on != "network grid":  # an earlier calibrate's "input grid"
            raise ValueError(
                f"validated range scored_on is {self.scored_on!r}; a served case is scored on the 'network grid'"
            )
        self.input_check, self.feature_check = bool(self.input_check), bool(self.feature_check)
        self.score_check = bool(self.score_check)
        if not (self.score_check or self.input_check or self.feature_check):
            raise ValueError("validated range: no signal judges a case: turn on review_score_check or another check")
        reference = self.input_reference
        if reference is not None and not (
            len(reference.get("mean", [])) == len(reference.get("std", [])) == len((self.inputs or [[]])[0])
        ):
            raise ValueError(
                f"validated range input_reference has {len(reference.get('mean', []))} means and "
                f"{len(reference.get('std', []))} standard deviations for {len((self.inputs or [[]])[0])} image "
                "statistics: run calibrate again"
            )
        self.reference_distance = None
        if self.feature_reference is not None:
            validation = self.feature_reference.get("validation", [])
            if len(validation) != len(self.scores) or "distance" not in self.feature_reference:
                raise ValueError(
                    f"validated range feature_reference: {len(validation)} validation distances for "
                    f"{len(self.scores)} scores: run calibrate again"
                )
            self.reference_distance = feature_distance_from_dict(self.feature_reference["distance"])
        scale = self.volume_interval_scale
        if scale is not None and not (math.isfinite(float(scale)) and float(scale) > 0):
            raise ValueError(
                f"validated range volume_interval_scale must be a finite number > 0 or null, got {scale}: run "
                "calibrate again"
            )
        self.scores = [_number(s) for s in self.scores]
        if not isinstance(self.subjects, (list, tuple)):
            raise ValueError(
                f"validated range subjects must be a list of one name per validation volume, got "
                f"{type(self.subjects).__name__} {self.subjects!r:.40}: run calibrate again"
            )
        self.subjects = [str(s) for s in self.subjects]
        self.score_folds = [int(j) for j in self.score_folds]
        if self.score_folds and (len(self.score_folds) != len(self.scores) or min(self.score_folds) < 0):
            raise ValueError(
                f"validated range score_folds: {len(self.score_folds)} fold indices (lowest {min(self.score_folds)}) "
                f"for {len(self.scores)} scores: each validation volume needs its fold, from 0; run calibrate again"
            )
        if self.subjects:
            self._one_per_volume(len(self.subjects), "subjects")
        # the exchangeable units: each volume's subject index (volumes of one patient are not exchangeable cases)
        names = self.subjects or [str(i) for i in range(len(self.scores))]
        self.subject_of = np.unique(names, return_inverse=True)[1].reshape(-1) if names else np.zeros(0, int)
        self.inputs = [[_number(v) for v in f] for f in self.inputs]
        self.input_signal = InputSignal(self.inputs, self.input_names, self.input_reference)  # fixed: built once
        if self.input_check and self.inputs:
            self._one_per_volume(len(self.inputs), "image statistics (inputs)")
        self.feature_distance = feature_distance_from_dict(self.features) if self.features else None
        if self.feature_distance is not None:
            self._one_per_volume(len(self.feature_distance.reference), "volumes' features")

    def _one_per_volume(self, count: int, what: str) -> None:
        if count != len(self.scores):
            raise ValueError(
                f"validated range: {count} {what} for {len(self.scores)} scores: each validation volume needs one; run "
                "calibrate again"
            )

    @classmethod
    def from_qualities(cls, qualities: Sequence[Mapping[str, Any]], **settings: Any) -> ValidatedRange:
        """From the :func:`~calib_monai.metrics.case_quality` dicts of the validation volumes; ``settings`` that name
        a field of the range (``alpha``, ``inputs``, ``features``, ...) set it, the others go to ``info``."""
        if not qualities:
            raise ValueError("a validated range needs at least one validation volume")
        names = list(qualities[0]["classes"])
        volumes = {name: [float(q["classes"][name]["volume"]) for q in qualities] for name in names}
        info = {k: settings.pop(k) for k in [k for k in settings if k not in STORED_FIELDS]}
        return cls([float(q["case_score"]) for q in qualities], volumes, info=info, **settings)

    # ---- the rule and its guarantee ---------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.scores)

    @property
    def m(self) -> int:
        """The number of validation subjects (patients): the exchangeable units the guarantee counts."""
        return int(self.subject_of.max()) + 1 if self.n else 0

    @property
    def counted_as(self) -> str:
        """What the guarantee counts, in words: ``m = 5 validation subjects (10 volumes)`` or ``n = 10 ...``."""
        if self.m < self.n:
            return f"m = {self.m} validation subjects ({self.n} volumes)"
        return f"n = {self.n} validation volumes"

    @property
    def signals(self) -> list[str]:
        """The signals the combined rule ranks (a case may leave one out, with the reason)."""
        chosen = (("case_score", self.score_check), ("input", self.input_check), ("features", self.feature_check))
        return [name for name, on in chosen if on]

    @property
    def rank(self) -> int:
        """``k = floor(alpha (m + 1))``: the flag's rank among the ``m + 1`` subjects (0: it cannot flag)."""
        return flag_rank(self.alpha, self.m)

    @property
    def bound(self) -> float:
        """The false-flag bound ``k / (m + 1)`` (plus ``2 / (m + 1)`` per class with the volume rule on)."""
        bound = self.rank / (self.m + 1)
        if self.volume_factor:
            bound += 2 * len(self.volumes) / (self.m + 1)
        return min(1.0, bound)

    @property
    def draw_bound(self) -> float | None:
        """The rate at which ordinary cases are flagged stays below this for 90% of validation draws: the 0.9 quantile
        of ``Beta(k, m + 1 - k)``, the law of that rate given the draw (training-conditional validity, Vovk 2012,
        "Conditional validity of inductive conformal predictors"); ``bound`` is its mean. None when ``k = 0``."""
        return draw_bound(self.rank, self.m, DRAW_CONFIDENCE) if self.rank else None

    @property
    def volumes_needed(self) -> int:
        """The fewest validation subjects with ``k >= 1`` at this alpha: ``ceil(1 / alpha - 1)``."""
        return math.ceil(1 / self.alpha - 1 - 1e-9)

    @property
    def too_few_reason(self) -> str:
        """Why the rule cannot flag at this alpha with these validation subjects, and what it needs."""
        unit = "subjects" if self.m < self.n else "volumes"
        needs = f"needs at least {self.volumes_needed} {unit} (or review_alpha >= {1 / (self.m + 1):.3g})"
        if len(self.info.get("site_volumes") or []) == self.n:  # a fine-tune measured on its held-out labels alone
            needs += (
                "; the bundle's own validation images were not on this machine at Train: put them where its "
                "models/datalist.json says, then Train again"
            )
        return f"cannot judge at alpha = {self.alpha:g} with {self.counted_as}: {needs}"

    @property
    def warnings(self) -> list[str]:
        out = []
        if self.rank == 0:
            out.append(self.too_few_reason + "; every case gets the flag null with its rank")
        elif self.bound > self.alpha:
            out.append(f"the volume rule raises the false-flag bound to {self.bound:.1%}, above alpha {self.alpha:g}")
        if self.input_check and len(self.inputs) < MIN_INPUT_IMAGES:
            out.append(f"the input signal is left out: {len(self.inputs)} validation image(s), it needs 2")
        if self.feature_check and self.feature_distance is None:
            why = self.info.get("features_left_out", "no validation features stored")
            out.append(f"the feature signal is left out: {why}")
        missing = sum(1 for s in self.scores if s != s) if self.score_check else 0  # only a counted score matters
        if 0 < missing < self.n:
            out.append(missing_scores(missing, self.n))
        return out

    def check(
        self,
        quality: Mapping[str, Any],
        image_statistics: Sequence[float] | None = None,
        features: Any = None,
        features_missing: str = "",
    ) -> dict[str, Any]:
        """The review verdict of one case (``image_statistics`` of its image, ``features`` its pooled network
        features): ``{"flag": True, False or None (cannot judge), "reasons", "rank" (the case's combined rank among
        the n + 1, ties counted against it), "k", "signals" (each signal's value, rank among the n + 1 and
        ``beyond``: its standardised distance beyond the others), "left_out", "validation_volumes", "bound",
        "alpha"}``."""
        values, left_out, unknown, farthest = signal_values(self, quality, image_statistics, features, features_missing)
        if not values and not unknown:  # the case score is off and the case left every other signal out
            unknown.append("cannot judge: no signal measured the case (" + "; ".join(left_out) + ")")
        ranks = {name: competition_ranks(a) for name, a in values.items()}
        z, combined = combined_scores(values, self.n + 1)
        # the case's rank among the m + 1 subjects, each validation subject by its most extreme volume (ties, within
        # float noise, against the case); with one volume per subject, its rank among the n + 1
        most = subject_maxima(combined[:-1], self.subject_of, self.m)
        case_rank, k = 1 + int(at_least(most, combined[-1]).sum()), self.rank
        signals = {
            name: {
                "value": _finite_or_none(float(-values[name][-1] if name == "case_score" else values[name][-1])),
                "rank": int(ranks[name][-1]),
                "beyond": _finite_or_none(round(float(z[name][-1]), 2)),
            }
            for name in values
        }
        reasons = []
        if k >= 1 and values and case_rank <= k:
            shifted = [name for name in z if z[name][-1] == combined[-1]]
            reasons += [review_reason(self, name, signals[name], farthest) for name in shifted]
            if {"input", "features"} & set(shifted):  # once, after the signals that saw the shift
                reasons[-1] += NOT_VOUCHED
        elif k >= 1 and self.score_check and score_problem(self.scores) not in ("", *unknown):
            unknown.append(score_problem(self.scores))
        if self.volume_factor:
            for name, volumes in self.volumes.items():
                volume = float(quality["classes"].get(name, {}).get("volume", float("nan")))
                low, high = min(volumes) / self.volume_factor, max(volumes) * self.volume_factor
                if volume == volume and not low <= volume <= high:
                    reasons.append(f"{name} volume {volume:.3g} mL is outside the validated {low:.3g}-{high:.3g} mL")
        if k == 0 and not reasons:
            unknown.append(f"{self.too_few_reason}; the case is ranked {case_rank} of {self.m + 1}")
        flag = True if reasons else (None if unknown else False)
        reasons += unknown  # after a flag's reasons; alone when the case cannot be judged
        if flag is not False:
            reasons += [w for w in self.warnings if w not in reasons and not w.startswith("cannot judge at")]
        return {
            "flag": flag,
            "reasons": reasons,
            "rank": case_rank,
            "k": k,
            "signals": signals,
            "left_out": left_out,
            "validation_volumes": self.n,
            "validation_subjects": self.m,
            "bound": self.bound,
            "alpha": self.alpha,
        }

    # ---- storage -----------------------------------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """The JSON record (NaN as null)."""
        stored = {name: getattr(self, name) for name in STORED_FIELDS}
        return {
            **stored,
            "scores": [None if s != s else s for s in self.scores],
            "inputs": [[None if v != v else v for v in f] for f in self.inputs],
            "rule": self.describe(),
            "signals": self.signals,
            "rank": self.rank,
            "bound": self.bound,
            "bound_within_alpha": self.bound <= self.alpha,
            "draw_bound": self.draw_bound,
            "warnings": self.warnings,
        }

    def save(
        self,
        path: str | os.PathLike,
        weights: str | os.PathLike,
        weights_sha256: str | None = None,
        calibration_sha256: str | None = None,
    ) -> Path:
        """Write the range to ``path`` (:func:`write_measured`)."""
        return write_measured(path, self.record(), weights, weights_sha256, calibration_sha256)

    def describe(self) -> str:
        return describe_rule(self)


def write_measured(
    path: str | os.PathLike,
    record: Mapping[str, Any],
    weights: str | os.PathLike,
    weights_sha256: str | None = None,
    calibration_sha256: str | None = None,
) -> Path:
    """Write ``record`` (of what was measured on the validation volumes: the range, the contours) to ``path``
    atomically, with the SHA-256 of ``weights`` (``weights_sha256``: of the bytes it was measured with, default the
    file's) and of the recalibration it was measured with (None: none)."""
    sha = weights_sha256 or file_sha256(weights)
    record = {**record, "weights": Path(weights).name, "weights_sha256": sha}
    return write_json_atomically(Path(path), {**record, "calibration_sha256": calibration_sha256})


#: what :meth:`ValidatedRange.save` writes and ``read_validated_range`` needs, beside the derived rule and bounds
STORED_FIELDS = tuple(f.name for f in fields(ValidatedRange))
