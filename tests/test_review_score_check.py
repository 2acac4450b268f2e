"""``review_score_check``: whether the lowest case score is one of the review flag's signals. An ordinary but hard
validation volume (a low case score, far below the others) sets the combined rule's threshold for every signal; with
the case score left out of the flag, a shifted image is judged against the other validation images only."""

from __future__ import annotations

import json

import pytest

from calib_monai.review import ValidatedRange
from calib_monai.review.reasons import describe_bar, missing_scores
from calib_monai.review.signals import signal_bar
from calib_monai.review.validated_range import read_validated_range

NAMES = ["mean intensity"]


def _range(score_check: bool) -> ValidatedRange:
    # 19 validation volumes (alpha 0.05: k = 1, bound 1 / 20): case scores 0.800..0.817 and one hard volume at 0.30;
    # mean intensities 0.0..1.8 in steps of 0.1 (no training reference: each measured against the other 18)
    scores = [0.80 + 0.001 * i for i in range(18)] + [0.30]
    inputs = [[0.1 * i] for i in range(19)]
    return ValidatedRange(scores, inputs=inputs, input_check=True, input_names=NAMES, score_check=score_check)


def _case(mean_intensity: float, score: float = 0.81) -> tuple[dict, list[float]]:
    return {"case_score": score, "classes": {"a": {"volume": 1.0}}}, [mean_intensity]


def test_a_hard_validation_volume_sets_the_bar_only_while_the_case_score_is_a_signal():
    # the image 5.0 lies (5.0 - 0.9) / 0.548 = 7.5 standard deviations from the 19 validation images (mean 0.9,
    # population std sqrt(0.3)): 22 MADs beyond the other distances, while the hard volume's case score lies 86 MADs
    # below the others' (a spread of a few thousandths): with the case score a signal, the case must beat 86 and is
    # not flagged; without it, the bar is the largest validation image's (2 MADs), and it is.
    with_score, without = _range(True), _range(False)
    quality, image = _case(5.0)
    assert with_score.check(quality, image)["flag"] is False
    verdict = without.check(quality, image)
    assert verdict["flag"] is True and verdict["rank"] == 1
    assert verdict["reasons"][0].startswith("image unlike the validation images (mean intensity: distance 7.5")
    assert "case_score" not in verdict["signals"] and without.signals == ["input"]
    # an ordinary image is not flagged either way, and a case scored far below every validation volume is flagged
    # only where the case score is a signal (the flag then names it)
    assert without.check(*_case(0.95))["flag"] is False and with_score.check(*_case(0.95))["flag"] is False
    low = _case(0.95, score=0.10)
    assert without.check(*low)["flag"] is False
    assert with_score.check(*low)["reasons"][0].startswith("estimated mean DSC 0.100 is among the lowest (rank 1")
    assert "lowest case score" not in without.describe() and "lowest case score" in with_score.describe()


def test_the_setting_is_stored_and_a_range_without_it_is_refused(tmp_path):
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"weights")
    path = _range(False).save(tmp_path / "validated_range.json", weights)
    record = json.loads(path.read_text())
    assert record["score_check"] is False and record["signals"] == ["input"]
    assert read_validated_range(path, weights)[0].score_check is False
    del record["score_check"]  # an older layout: refused, naming the file, the field and the fix
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"lacks \['score_check'\] .*run the bundle's calibrate step again$") as error:
        read_validated_range(path, weights)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_no_signal_at_all_is_refused_and_a_case_no_signal_measures_is_not_judged():
    with pytest.raises(ValueError, match="no signal judges a case: turn on review_score_check or another check"):
        ValidatedRange([0.8] * 19, score_check=False)
    verdict = _range(False).check(_case(0.5)[0])  # no image statistics given: the input signal leaves it out
    assert verdict["flag"] is None
    assert verdict["reasons"][0].startswith("cannot judge: no signal measured the case (image intensities left out")


def test_the_bar_names_the_signal_and_volume_that_set_it():
    # with the case score counted, the hard volume (the 19th, index 18) sets the bar some 86 MADs out, and the words
    # say how to let the image judge without it; without the case score, the most extreme image does: an end of the
    # evenly spaced 0.0..1.8, under 2 MADs beyond the other images' distances
    bar = signal_bar(_range(True))
    assert bar["signal"] == "case_score" and bar["volume"] == 18 and bar["subject"] is None and bar["z"] > 80
    assert 1 < bar["largest"]["input"] < 2
    words = describe_bar(bar, _range(True).signals)
    assert words.startswith("the flag's bar is validation volume 19 of 19 (in the validation list's order) by its ")
    assert "by its case score, 8" in words  # some 86 MADs
    assert words.endswith(
        "--review_score_check false lets the image and the features judge without it (docs/results/score_check)"
    )
    bar = signal_bar(_range(False))
    assert (
        bar["signal"] == "input"
        and bar["volume"] in (0, 18)
        and bar["z"] == signal_bar(_range(True))["largest"]["input"]
    )
    assert "case_score" not in bar["largest"] and "review_score_check" not in describe_bar(bar, ["input"])
    assert signal_bar(ValidatedRange([0.8] * 5)) is None  # 5 volumes at alpha 0.05: k = 0, no bar


def test_a_missing_case_score_is_warned_about_only_while_it_is_counted():
    # 2 of 19 validation volumes predicted no structure (NaN): a gap in the counted signal, nothing to warn about
    # when the flag judges by the image alone
    scores = [0.80 + 0.001 * i for i in range(17)] + [float("nan")] * 2
    inputs = [[0.1 * i] for i in range(19)]
    kwargs = {"inputs": inputs, "input_check": True, "input_names": NAMES}
    counted = ValidatedRange(scores, **kwargs).warnings
    assert counted == [missing_scores(2, 19)] and counted[0].startswith("2 of 19 validation volumes have no case score")
    assert ValidatedRange(scores, score_check=False, **kwargs).warnings == []
