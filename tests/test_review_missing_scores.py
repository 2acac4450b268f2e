"""A validation volume without a case score (no structure predicted) in a validated range: the case score ranks it
below every case, the same rule for all n + 1, so it neither keeps a low-scoring case from being flagged nor loosens
the false-flag bound; a case without a case score cannot be judged by it (null with the reason, never a silent no)."""

from __future__ import annotations

import numpy as np
import pytest

from calib_monai.review import ValidatedRange
from calib_monai.review.reasons import NO_CASE_SCORE, missing_scores
from calib_monai.review.signals import score_problem

NAN = float("nan")
NAMES = ["mean intensity"]
# 19 validation volumes (alpha 0.05: k = 1, bound 1 / 20), one of them without a case score
SCORES = [0.70 + 0.01 * i for i in range(18)] + [NAN]


def _case(score: float) -> dict:
    return {"case_score": score, "classes": {"a": {"volume": 1.0}}}


def test_one_missing_validation_score_leaves_a_very_low_case_flagged():
    validated = ValidatedRange(SCORES)
    assert validated.rank == 1 and validated.bound == pytest.approx(1 / 20) and validated.m == 19
    verdict = validated.check(_case(0.01))
    assert verdict["flag"] is True and verdict["rank"] == 1 and verdict["k"] == 1
    assert verdict["reasons"][0].startswith("estimated mean DSC 0.010 is among the lowest (rank 1 of 20")
    assert verdict["reasons"][1] == missing_scores(1, 19) == validated.warnings[0]
    # below every validation score is enough; an ordinary case is a real no
    assert validated.check(_case(0.69))["flag"] is True
    assert validated.check(_case(0.80)) | {"signals": None} == {
        "flag": False,
        "reasons": [],
        "rank": 12,  # 0.70..0.80 at least as low (the tie counted against it), the missing score below it
        "k": 1,
        "signals": None,
        "left_out": [],
        "validation_volumes": 19,
        "validation_subjects": 19,
        "bound": pytest.approx(1 / 20),
        "alpha": 0.05,
    }


def test_a_missing_score_in_a_subject_with_two_frames():
    # 19 patients of two frames each (m = 19, k = 1): one frame without a score, its subject counted by the other
    scores = [0.70 + 0.01 * (i // 2) for i in range(38)]
    scores[7] = NAN
    subjects = [f"patient{i // 2:02d}" for i in range(38)]
    validated = ValidatedRange(scores, subjects=subjects)
    assert validated.m == 19 and validated.rank == 1
    assert validated.check(_case(0.01))["flag"] is True
    assert validated.check(_case(0.75))["flag"] is False


def test_a_case_without_a_score_cannot_be_judged_by_it():
    validated = ValidatedRange(SCORES)
    verdict = validated.check(_case(NAN))
    assert verdict["flag"] is None and verdict["reasons"] == [NO_CASE_SCORE, missing_scores(1, 19)]
    assert verdict["signals"]["case_score"]["value"] is None
    assert ValidatedRange(SCORES).check({"case_score": None, "classes": {}})["flag"] is None  # null read back
    # with the image as a signal: a shifted image is flagged, a typical one still cannot be judged
    inputs = [[0.1 * i] for i in range(19)]
    both = ValidatedRange(SCORES, inputs=inputs, input_check=True, input_names=NAMES)
    shifted = both.check(_case(NAN), [9.0])
    assert shifted["flag"] is True and shifted["reasons"][0].startswith("image unlike the validation images")
    assert NO_CASE_SCORE in shifted["reasons"]
    typical = both.check(_case(NAN), [0.9])
    assert typical["flag"] is None and typical["reasons"][0] == NO_CASE_SCORE


def test_no_validation_score_at_all_leaves_the_image_to_judge():
    # the case score has nothing to rank against (null with why), the image still flags a shifted case
    scores = [NAN] * 19
    validated = ValidatedRange(scores, inputs=[[0.1 * i] for i in range(19)], input_check=True, input_names=NAMES)
    shifted = validated.check(_case(0.8), [9.0])
    assert shifted["flag"] is True and score_problem(scores) in shifted["reasons"]
    typical = validated.check(_case(0.8), [0.9])
    assert typical["flag"] is None and typical["reasons"] == [score_problem(scores)]
    assert ValidatedRange(scores).check(_case(0.01))["reasons"] == [score_problem(scores)]


def test_the_bound_holds_and_the_rule_flags_when_scores_go_missing():
    # exchangeable cases, a quarter without a case score: flagged at most 1 / 20 of the time, and about that often
    # (ranked above every case, a missing validation score would leave nothing flagged in all but 0.4% of draws)
    rng = np.random.default_rng(0)
    draws, flagged, unjudged = 3000, 0, 0
    for _ in range(draws):
        scores = np.where(rng.random(20) < 0.25, np.nan, rng.uniform(0.5, 0.9, 20))
        verdict = ValidatedRange(scores[:19].tolist()).check(_case(float(scores[19])))
        flagged += verdict["flag"] is True
        unjudged += verdict["flag"] is None
    assert 0.035 < flagged / draws < 1 / 20 + 0.012, flagged / draws
    assert unjudged / draws == pytest.approx(0.25, abs=0.03)  # the cases without a score, said so
