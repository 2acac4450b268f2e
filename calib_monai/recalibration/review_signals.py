"""The nonconformities a :class:`~calib_monai.recalibration.review_rule.ValidatedRange` ranks a case by: per signal
(case score, image statistics, network features) the ``n + 1`` values of the validation volumes and the case, and why
a signal is left out or the case cannot be judged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["FEATURE_DIM", "MIN_INPUT_IMAGES", "signal_values"]

MIN_INPUT_IMAGES = 2  # the input signal measures each image against the others: their standard deviation needs 2
FEATURE_DIM = 16  # principal components of the augmented features the feature signal measures in


def signal_values(
    rule: Any, quality: Mapping[str, Any], image_statistics: Sequence[float] | None, features: Any, missing: str
) -> tuple[dict[str, np.ndarray], list[str], list[str], str]:
    """The ``n + 1`` nonconformities (larger: more extreme; the case last) of each signal that judges; the
    reasons of the signals left out; the reasons the case cannot be judged; the case's farthest image statistic."""
    values = {}
    if rule.score_check:
        values["case_score"] = -np.array([*rule.scores, float(quality["case_score"])], dtype=np.float64)
        values["case_score"][np.isnan(values["case_score"])] = np.inf  # no case score: the most extreme
    left_out, unknown, farthest = [], [], ""
    if rule.input_check:
        measured = rule._input_signal
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
        if rule._distance is None:
            left_out.append(f"network features left out: {rule.info.get('features_left_out', 'none stored')}")
        elif features is None:
            left_out.append(f"network features left out: {missing or 'none were captured for the case'}")
        else:
            vector = np.asarray(features, dtype=np.float64).reshape(-1)
            if vector.size != len(rule._distance.mean) or not np.isfinite(vector).all():
                bad = int((~np.isfinite(vector)).sum())
                unknown.append(
                    f"cannot judge: the network features ({vector.size} values, {bad} NaN or infinite) are "
                    f"not comparable with the validation cases' ({len(rule._distance.mean)})"
                )
            elif rule._reference_distance is not None:  # one fixed function of the training features
                validation = np.asarray(rule.feature_reference["validation"], dtype=np.float64)
                values["features"] = np.append(validation, rule._reference_distance.distance(vector))
            else:
                values["features"] = rule._distance.conformal_distances(vector, conformal_dim=FEATURE_DIM)
    return values, left_out, unknown, farthest
