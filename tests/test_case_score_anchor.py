"""The case score's level from labelled cases (``calib_monai.review.anchor``): the lower bound from the validation
subjects' errors, re-anchoring from the site's labels, and the labels recorded in ``site.json`` and served."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import t

from calib_monai.review import CaseQualityd, SiteMartingale, SiteMonitor, SiteMonitord, ValidatedRange
from calib_monai.review.anchor import CaseScoreAnchor, anchor_quality, conformal_upper_error
from calib_monai.review.site_labels import delivered_dice, record_site_label

SCORES = [0.99] * 19


def _range(errors, subjects=(), site_volumes=()) -> ValidatedRange:
    info = {"case_score_error": {"per_volume": list(errors)}}
    if site_volumes:
        info["site_volumes"] = list(site_volumes)
    return ValidatedRange([0.8] * len(errors), {}, info=info, subjects=list(subjects))


def test_the_conformal_error_is_the_k_th_smallest_and_none_when_too_few():
    # m = 9, alpha 0.1: k = ceil(10 * 0.9) = 9, the largest; m = 8: k = 9 > 8, no bound; m = 19: k = 18
    assert conformal_upper_error(list(range(9)), 0.1) == 8
    assert conformal_upper_error(list(range(8)), 0.1) is None
    assert conformal_upper_error(list(range(19)), 0.1) == 17
    assert conformal_upper_error([*range(9), math.nan], 0.1) == 8  # a volume without a score is left out


def test_each_subject_counts_with_its_most_optimistic_volume_and_site_volumes_are_site_labels():
    errors = [0.1, -0.2, 0.05, 0.3, None, 0.0]
    validated = _range(errors, subjects=["a", "a", "b", "c", "c", "d"], site_volumes=[5])
    anchor = CaseScoreAnchor.from_range(validated, site_errors=[0.04])
    assert sorted(anchor.subject_errors) == [0.05, 0.1, 0.3]  # a: max(0.1, -0.2); c: 0.3 (None left out); d: site
    assert anchor.site_errors == (0.0, 0.04)
    assert anchor.anchored and anchor.offset == pytest.approx(-0.02)


def test_without_site_labels_the_bound_is_the_score_minus_the_conformal_error():
    anchor = CaseScoreAnchor.from_range(_range([i / 100 for i in range(9)]))
    answer = anchor.answer(0.8)
    # the level: 0.8 minus the mean error 0.04; the bound stays 0.8 minus e_(9) = 0.08
    assert answer["case_score"] == pytest.approx(0.76) and answer["case_score_low"] == pytest.approx(0.72)
    assert answer["offset"] == pytest.approx(-0.04) and answer["raw_case_score"] == 0.8
    assert answer["from"] == "9 validation subjects; level: minus the validation volumes' mean error (+0.040)"
    assert answer["coverage"] == pytest.approx(0.9)
    few = CaseScoreAnchor.from_range(_range([0.0] * 8)).answer(0.8)
    assert few["case_score_low"] is None and "it needs the errors of 9 labelled validation subjects" in few["from"]
    assert CaseScoreAnchor.from_range(ValidatedRange(SCORES, {})).answer(0.8)["case_score_low"] is None


def test_the_level_is_the_validation_volumes_mean_error_until_site_labels_replace_it():
    # volumes (subject): 0.1 (a), -0.2 (a), 0.05 (b), 0.3 (c), None (c), 0.0 (d, a site volume): the level is the
    # mean of the four scored validation volumes, 0.0625, every volume counted (the bound counts subjects' largest)
    validated = _range([0.1, -0.2, 0.05, 0.3, None, 0.0], subjects=["a", "a", "b", "c", "c", "d"], site_volumes=[5])
    alone = CaseScoreAnchor.from_range(validated)
    assert alone.validation_error == pytest.approx(0.0625) and not alone.anchored
    assert alone.answer(0.5)["case_score"] == pytest.approx(0.4375)
    assert alone.answer(0.03)["case_score"] == 0.0  # clipped to [0, 1]
    anchored = CaseScoreAnchor.from_range(validated, site_errors=[0.1])  # with the site volume: 2 site labels
    assert anchored.offset == pytest.approx(-0.05) and anchored.answer(0.5)["case_score"] == pytest.approx(0.45)
    assert CaseScoreAnchor.from_range(_range([math.nan, None])).answer(0.5)["case_score"] == 0.5  # nothing measured


def test_two_site_labels_shift_the_level_and_widen_the_bound_by_the_t_margin():
    subject = tuple(i / 100 for i in range(9))  # upper error 0.08, mean 0.04: spread 0.04
    anchor = CaseScoreAnchor(subject, (0.1, 0.14), 0.1)
    answer = anchor.answer(0.8)
    level = t.ppf(0.9, 1) * np.std([0.1, 0.14], ddof=1) / math.sqrt(2)  # 3.078 * 0.0283 / 1.414 = 0.0616
    assert answer["case_score"] == pytest.approx(0.68) and answer["offset"] == pytest.approx(-0.12)
    assert answer["case_score_low"] == pytest.approx(0.68 - 0.04 - level)
    assert "2 site labels" in answer["from"] and "assumes the site moves the level" in answer["from"]
    one = CaseScoreAnchor(subject, (0.1,), 0.1).answer(0.8)  # one label does not re-anchor
    assert one["case_score"] == 0.8 and one["offset"] == 0.0
    assert one["from"].endswith("not re-anchored: 1 site label(s), it needs 2")
    many = CaseScoreAnchor(subject, tuple([0.1] * 8 + [0.2]), 0.1).answer(0.8)  # 9 site labels: their own bound
    # the conformal bound on the site errors alone: the raw score minus their largest (k = 9 of 9)
    assert many["from"] == "9 site labels" and many["case_score_low"] == pytest.approx(0.8 - 0.2)


def test_the_bound_holds_the_truth_at_its_coverage_and_the_level_is_unbiased_over_simulated_draws():
    # errors i.i.d.; m = 19 subjects: k = 18, P(new error <= e_(18)) = 18 / 20 = 0.9 exactly
    rng = np.random.default_rng(0)
    held, level = [], []
    for _ in range(4000):
        errors = rng.normal(0.02, 0.05, size=20)
        anchor = CaseScoreAnchor(tuple(errors[:19]), (), 0.1, float(errors[:19].mean()))
        truth = 0.8 - errors[19]
        held.append(truth >= anchor.answer(0.8)["case_score_low"])
        level.append(anchor.answer(0.8)["case_score"] - truth)
    assert 0.88 <= np.mean(held) <= 0.92
    assert abs(np.mean(level)) < 0.003  # the raw score is 0.02 too high on average; the level is not


def test_re_anchoring_keeps_the_raw_score_and_is_not_applied_twice():
    anchor = CaseScoreAnchor((), (0.1, 0.1), 0.1)
    once = anchor_quality({"case_score": 0.8}, anchor)
    twice = anchor_quality(once, anchor)
    assert once["case_score"] == pytest.approx(0.7) and twice["case_score"] == pytest.approx(0.7)
    assert twice["level"]["raw_case_score"] == 0.8


# ----------------------------------------------------------------------------- labels in site.json, served by hand


def _item(value: float, score: float) -> dict:
    quality = {"case_score": score, "review": {"flag": False, "reasons": [], "rank": 1, "signals": {}}}
    quality["review"]["signals"] = {"case_score": {"value": score, "rank": 1}}
    source = {"weights_sha256": "a" * 64, "validated_range_sha256": "b" * 64}
    quality["source"] = dict(source)  # RecordSourced puts it there in the bundles' chain
    return {"image": torch.full((1, 4, 4, 2), value), "quality": quality, "calib_monai_source": source}


def test_site_labels_re_anchor_the_next_answers_and_after_the_alarm_the_rule_judges_again(tmp_path):
    transform = SiteMonitord("quality", tmp_path, CaseQualityd("pred", ValidatedRange(SCORES, {})))
    needed = SiteMartingale(19, ("case_score",)).fewest_cases()
    for i in range(needed):
        out = transform(_item(float(i), 0.9))
    assert out["quality"]["site"]["alarm"] and out["quality"]["review"]["flag"] is True
    served = out["quality"]
    record_site_label(tmp_path, "case_0", served, truth=0.7)  # 0.9 served, 0.7 true
    record_site_label(tmp_path, "case_1", served, truth=0.8)
    record_site_label(tmp_path, "case_1", served, truth=0.6)  # labelled again: replaced
    after = transform(_item(100.0, 0.9))["quality"]
    assert after["site"]["labels"] == 2 and after["level"]["offset"] == pytest.approx(-0.25)  # -mean(0.2, 0.3)
    assert after["case_score"] == pytest.approx(0.65) and after["level"]["raw_case_score"] == 0.9
    assert (
        after["review"]["flag"] is False and "re-anchored from 2 site labels (-0.250)" in after["review"]["reasons"][-1]
    )
    assert after["source"]["site_alarm"] is True  # the alarm still says so


def test_a_label_of_another_model_or_without_a_stream_is_refused_in_one_line(tmp_path):
    served = _item(0.0, 0.9)["quality"]
    with pytest.raises(ValueError, match="does not exist: serve the site's cases"):
        record_site_label(tmp_path, "case_0", served, truth=0.7)
    SiteMonitor(tmp_path, "c" * 64, "b" * 64, 19, ("case_score",)).observe("h", 1, {"case_score": 1})
    with pytest.raises(ValueError, match="was served by weights aaaaaaaaaaaa .* records weights cccccccccccc"):
        record_site_label(tmp_path, "case_0", served, truth=0.7)
    with pytest.raises(ValueError, match="true mean DSC must"):
        SiteMonitor(tmp_path, "c" * 64, "b" * 64, 19, ("case_score",)).label("case_0", 0.9, 1.5)


def test_the_delivered_dice_leaves_an_absent_structure_out():
    segmentation = np.array([[0, 1, 1, 2]])
    label = np.array([[0, 1, 0, 0]])  # class 1: 2 * 1 / (2 + 1); class 2 absent from the label: left out
    assert delivered_dice(segmentation, label, 3) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="not one grid"):
        delivered_dice(segmentation, label[:, :3], 3)


def test_a_fine_tune_range_of_held_out_labels_alone_says_what_it_lacks():
    alone = _range([0.1, 0.2], site_volumes=[0, 1])
    assert "the bundle's own validation images were not on this machine at Train" in alone.too_few_reason
    assert "were not on this machine" not in _range([0.1, 0.2], site_volumes=[1]).too_few_reason


def test_after_train_the_alarm_flags_until_the_new_weights_are_re_anchored(tmp_path):
    # the site alarmed under weights a; Train publishes weights c with 1, then 2 held-out site labels in its range
    first = SiteMonitord("quality", tmp_path, CaseQualityd("pred", ValidatedRange(SCORES, {})))
    for i in range(SiteMartingale(19, ("case_score",)).fewest_cases()):
        first(_item(float(i), 0.9))

    def trained_item(value: float) -> dict:
        item = _item(value, 0.9)
        item["calib_monai_source"] = {**item["calib_monai_source"], "weights_sha256": "c" * 64}
        item["quality"]["source"] = dict(item["calib_monai_source"])
        return item

    one_label = CaseQualityd("pred", _range([0.05] * 19, site_volumes=[0]))
    served = SiteMonitord("quality", tmp_path, one_label)(trained_item(100.0))["quality"]
    assert served["site"]["alarm"] and served["site"]["cases"] == 1 and served["review"]["flag"] is True
    assert "raised under weights aaaaaaaaaaaa" in served["review"]["reasons"][0]
    two_labels = CaseQualityd("pred", _range([0.05] * 19, site_volumes=[0, 1]))
    served = SiteMonitord("quality", tmp_path, two_labels)(trained_item(101.0))["quality"]
    assert served["site"]["alarm"] and served["review"]["flag"] is False  # judged case by case again
    assert "re-anchored from 2 site labels" in served["review"]["reasons"][-1]
