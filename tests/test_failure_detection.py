"""Risk-coverage curve, AURC, AUGRC and the random-to-oracle gap on orderings worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calib_monai.metrics import augrc, aurc, failure_detection_summary, quality_agreement, risk_coverage_curve

RISK = [0.0, 0.2, 0.4, 0.6]


def test_perfect_ordering():
    confidence = [0.9, 0.8, 0.7, 0.6]  # the least risky case is the most confident
    curve = risk_coverage_curve(confidence, RISK)
    assert curve["coverage"].tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert curve["risk"].tolist() == pytest.approx([0.3, 0.2, 0.1, 0.0, 0.0])
    # trapezoids: .25 (.3 + .2) / 2 + .25 (.2 + .1) / 2 + .25 (.1 + 0) / 2 + 0 = .1125
    assert aurc(confidence, RISK) == pytest.approx(0.1125)
    # generalized risk: accepted risk / 4 = .3, .15, .05, 0, 0 -> .05625 + .025 + .00625 = .0875
    assert augrc(confidence, RISK) == pytest.approx(0.0875)
    summary = failure_detection_summary(confidence, RISK)
    assert summary["aurc_random"] == pytest.approx(0.3)  # the mean risk
    assert summary["aurc_oracle"] == pytest.approx(0.1125)
    assert summary["aurc_gap_closed"] == pytest.approx(1.0)


def test_reversed_ordering_is_worse_than_random():
    confidence = [0.6, 0.7, 0.8, 0.9]  # the riskiest case is the most confident
    # selective risks .3, .4, .5, .6, .6 -> .0875 + .1125 + .1375 + .15 = .4875
    assert aurc(confidence, RISK) == pytest.approx(0.4875)
    # gap closed: (.3 - .4875) / (.3 - .1125) = -1
    assert failure_detection_summary(confidence, RISK)["aurc_gap_closed"] == pytest.approx(-1.0)


def test_ties_enter_together_and_a_constant_score_is_random():
    curve = risk_coverage_curve([0.5, 0.9, 0.5, 0.1], RISK)
    # thresholds 0.9 (1 case), 0.5 (3 cases), 0.1 (4 cases)
    assert curve["coverage"].tolist() == [1.0, 0.75, 0.25, 0.0]
    assert curve["risk"].tolist() == pytest.approx([0.3, 0.2, 0.2, 0.2])
    summary = failure_detection_summary([0.7] * 4, RISK)
    assert summary["aurc"] == pytest.approx(0.3) and summary["aurc_gap_closed"] == pytest.approx(0.0)


def test_random_orders_average_to_the_mean_risk():
    rng = np.random.default_rng(0)
    risk = rng.random(20)
    values = [aurc(rng.permutation(20), risk) for _ in range(4000)]
    assert np.mean(values) == pytest.approx(risk.mean(), abs=0.005)


def test_nan_cases_are_left_out_and_shapes_are_checked():
    assert aurc([0.9, np.nan, 0.8, 0.7, 0.6], [0.0, 0.5, 0.2, 0.4, 0.6]) == pytest.approx(0.1125)
    assert math.isnan(aurc([], []))
    with pytest.raises(ValueError, match="one value per case"):
        aurc([0.1, 0.2], [0.3])


def test_agreement_by_hand():
    estimated, true = [0.9, 0.8, 0.5, 0.6], [0.85, 0.80, 0.40, 0.70]
    out = quality_agreement(estimated, true)
    assert out["mae"] == pytest.approx((0.05 + 0 + 0.1 + 0.1) / 4)
    assert out["bias"] == pytest.approx((0.05 + 0 + 0.1 - 0.1) / 4)
    # ranks 4, 3, 1, 2 against 4, 3, 1, 2: Spearman 1
    assert out["spearman"] == pytest.approx(1.0) and out["cases"] == 4
    assert out["pearson"] == pytest.approx(np.corrcoef(estimated, true)[0, 1])
    assert math.isnan(quality_agreement([0.5, 0.5, 0.5], [0.1, 0.2, 0.3])["spearman"])
