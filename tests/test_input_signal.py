"""The input signal's joint distance: the intensity statistics measured together against the training images'
(Mahalanobis, Ledoit-Wolf), each geometry statistic alone, and what the reason names."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calib_monai.recalibration import ValidatedRange
from calib_monai.recalibration.references import fixed_references, intensity_precision

NAMES = ["mean intensity", "intensity spread", "field of view along axis 0"]


def _training(count=60, seed=0):
    # the mean and the spread of an image move together (r about 0.95); the field of view is one protocol's, 100 mm
    g = np.random.default_rng(seed)
    mean = g.normal(0.3, 0.05, count)
    spread = 0.5 * mean + g.normal(0.0, 0.008, count)
    return np.stack([mean, spread, np.full(count, math.log(100.0)) + g.normal(0, 0.01, count)], 1)


def _range(training):
    references = fixed_references(training.tolist(), None, None, input_names=NAMES)
    validation = _training(25, seed=1)
    return ValidatedRange(
        [0.8 + 0.001 * i for i in range(25)],
        inputs=validation.tolist(),
        input_check=True,
        input_names=NAMES,
        input_reference=references["input_reference"],
    )


def test_the_precision_covers_the_intensities_only():
    training = _training()
    precision = intensity_precision(training, NAMES)
    assert precision.shape == (2, 2)
    # unnamed columns: all of them
    assert intensity_precision(training, []).shape == (3, 3)
    # a NaN intensity statistic: no joint distance
    spoiled = training.copy()
    spoiled[3, 0] = math.nan
    assert intensity_precision(spoiled, NAMES) is None


def test_a_joint_move_is_flagged_where_each_statistic_alone_is_ordinary():
    training = _training()
    validated = _range(training)
    mean, std = training.mean(0), training.std(0)
    # the mean up 2 spreads and the spread down 2: each within the others', together far off their line
    case = [mean[0] + 2 * std[0], mean[1] - 2 * std[1], mean[2]]
    verdict = validated.check({"case_score": 0.81, "classes": {}}, case)
    assert verdict["flag"] is True and verdict["signals"]["input"]["value"] > 8
    assert "with the other intensity statistics: distance" in verdict["reasons"][0]
    # along their line (both up 2 spreads) it is ordinary
    along = [mean[0] + 2 * std[0], mean[1] + 2 * std[1], mean[2]]
    assert validated.check({"case_score": 0.81, "classes": {}}, along)["flag"] is False


def test_the_geometry_counts_alone_and_in_mm():
    validated = _range(_training())
    mean = _training().mean(0)
    verdict = validated.check({"case_score": 0.81, "classes": {}}, [mean[0], mean[1], math.log(180.0)])
    assert verdict["flag"] is True
    assert verdict["reasons"][0].startswith("image unlike the training images (field of view along axis 0 180 mm")
    # an image without a geometry: the intensities alone, and the reason says what was left out
    unknown = validated.check({"case_score": 0.81, "classes": {}}, [mean[0], mean[1], math.nan])
    assert unknown["flag"] is False and unknown["left_out"][0].startswith("image geometry left out")
    assert verdict["signals"]["input"]["value"] == pytest.approx(
        abs(math.log(180.0) - _training()[:, 2].mean()) / max(_training()[:, 2].std(), math.log(1.1))
    )
