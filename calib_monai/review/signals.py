"""The nonconformities a :class:`~calib_monai.review.rule.ValidatedRange` ranks a case by (case score, image
statistics, network features), why a signal is left out or the case cannot be judged, and the flag's bar."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .conformal import combined_scores, subject_maxima
from .reasons import NO_CASE_SCORE

__all__ = ["CASE_SCORE_OFFSETS", "MIN_INPUT_IMAGES", "score_problem", "signal_bar", "signal_values"]

MIN_INPUT_IMAGES = 2  # the input signal measures each image against the others: their standard deviation needs 2
# the case's t_full - t_j per cross-fitted fold j (CalibrateLogitsd puts them in the item, CaseQualityd in the quality)
CASE_SCORE_OFFSETS = "case_score_offsets"


def signal_values(
    rule: Any, quality: Mapping[str, Any], image_statistics: Sequence[float] | None, features: Any, missing: str
) -> tuple[dict[str, np.ndarray], list[str], list[str], str]:
    """The ``n + 1`` nonconformities (larger: more extreme; the case last) of each signal that judges; the
    reasons of the signals left out; the reasons the case cannot be judged; the case's farthest image statistic."""
    values, left_out, unknown, farthest = {}, [], [], ""
    if rule.score_check:
        case_score = quality["case_score"]  # NaN or null: no structure found
        scores = np.array([*rule.scores, np.nan if case_score is None else case_score], dtype=np.float64)
        offsets = quality.get(CASE_SCORE_OFFSETS)
        if rule.score_folds and (offsets is None or len(offsets) != max(rule.score_folds) + 1):
            unknown.append(_no_offsets(rule, offsets))
        elif np.isnan(scores[:-1]).all():
            unknown.append(score_problem(rule.scores))  # nothing to rank the case against
        else:
            if rule.score_folds:  # volume i against the case as its fold j(i) scored it: s_i vs t_full - offset_j(i)
                scores[:-1] += np.nan_to_num(np.asarray(offsets, dtype=np.float64))[rule.score_folds]
            # a volume without a case score (validation or the case) ranks below every other: one rule for all
            # n + 1 keeps the combined score symmetric, so the bound k / (m + 1) holds as stated
            values["case_score"] = np.where(np.isnan(scores), -np.inf, -scores)
            if np.isnan(scores[-1]):
                unknown.append(NO_CASE_SCORE)
    if rule.input_check:
        measured = rule.input_signal
        if len(rule.inputs) < MIN_INPUT_IMAGES or not measured.intensities_finite():
            left_out.append("image intensities left out: the range holds fewer than 2 usable validation images")
        elif image_statistics is None:
            left_out.append("image intensities left out: no image statistics were given with the case")
        else:
            stats, problem, note = measured.comparable(image_statistics)
            if problem:
                unknown.append(problem)
            else:
                left_out += [note] if note else []
                values["input"], farthest = measured.distances(stats)
    if rule.feature_check:
        if rule.feature_distance is None:
            left_out.append(f"network features left out: {rule.info.get('features_left_out', 'none stored')}")
        elif features is None:
            left_out.append(f"network features left out: {missing or 'none were captured for the case'}")
        else:
            vector = np.asarray(features, dtype=np.float64).reshape(-1)
            if vector.size != len(rule.feature_distance.mean) or not np.isfinite(vector).all():
                bad = int((~np.isfinite(vector)).sum())
                unknown.append(
                    f"cannot judge: the network features ({vector.size} values, {bad} NaN or infinite) are "
                    f"not comparable with the validation cases' ({len(rule.feature_distance.mean)})"
                )
            elif rule.reference_distance is not None:  # one fixed function of the training features
                validation = np.asarray(rule.feature_reference["validation"], dtype=np.float64)
                values["features"] = np.append(validation, rule.reference_distance.distance(vector))
            else:
                values["features"] = rule.feature_distance.conformal_distances(vector)
    return values, left_out, unknown, farthest


def _no_offsets(rule: Any, offsets: Any) -> str:
    folds = max(rule.score_folds) + 1
    given = "none" if offsets is None else len(offsets)
    return (
        f"cannot judge the case score: the validated range was scored by {folds} cross-fitted recalibrations and the "
        f"case's {CASE_SCORE_OFFSETS} under them are {given}; serve it through CalibrateLogitsd with the stored "
        "calibration.pt (or run the bundle's calibrate step again)"
    )


def score_problem(scores: Sequence[float]) -> str:
    """Why the validation volumes' case ``scores`` cannot tell cases apart ("" when they can)."""
    finite = [s for s in scores if s == s]
    if not finite:
        return (
            f"cannot judge the case score: none of the {len(scores)} validation volumes has one (the model predicts "
            "no structure on any of them); check the model and run calibrate again"
        )
    if len(scores) > 1 and len(finite) == len(scores) and max(finite) == min(finite):
        return (
            f"cannot judge the case score: all {len(scores)} validation volumes scored exactly {finite[0]:.3f} (a "
            "collapsed model?); check the model and run calibrate again"
        )
    return ""


def signal_bar(rule: Any) -> dict[str, Any] | None:
    """What a case must lie beyond to be flagged: the ``k``-th most extreme validation subject, each validation volume
    measured against the others and a typical case (each signal's validation median): ``{"signal", "volume",
    "volumes", "subject", "z", "largest": {signal: its largest z}}``, None when it cannot flag."""
    if rule.rank < 1:
        return None
    finite = [s for s in rule.scores if s == s]
    typical = {"case_score": float(np.median(finite)) if finite else float("nan"), "classes": {}}
    if rule.score_folds:  # a typical case scored alike by every fold
        typical[CASE_SCORE_OFFSETS] = [0.0] * (max(rule.score_folds) + 1)
    inputs = list(np.median(np.asarray(rule.inputs, dtype=np.float64), 0)) if rule.inputs else None
    features = np.asarray(rule.features["mean"], dtype=np.float64) if rule.features else None
    values = signal_values(rule, typical, inputs, features, "")[0]
    if not values:
        return None
    z, combined = combined_scores(values, rule.n + 1)
    z, combined = {name: v[:-1] for name, v in z.items()}, combined[:-1]  # the validation volumes, not the typical case
    most = subject_maxima(combined, rule.subject_of, rule.m)
    subject = int(np.argsort(-most, kind="stable")[rule.rank - 1])
    volume = max(np.flatnonzero(rule.subject_of == subject), key=lambda i: combined[i])
    return {
        "signal": next(name for name in z if z[name][volume] == combined[volume]),
        "volume": int(volume),  # in the range's order, the validation list's
        "volumes": rule.n,
        "subject": rule.subjects[volume] if rule.subjects else None,
        "z": _rounded(combined[volume]),
        "largest": {name: _rounded(np.max(v)) for name, v in z.items()},
    }


def _rounded(value: float) -> float | None:  # JSON has no infinity: a distance past any float, or nothing measured
    return round(float(value), 2) if np.isfinite(value) else None
