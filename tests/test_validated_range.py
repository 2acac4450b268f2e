"""The review rule and its guarantee, worked by hand and checked by simulation; the split of the validation volumes;
local temperature scaling's early stopping; and what a bad validated range gives."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from calib_monai.metrics import case_quality
from calib_monai.metrics.feature_distance import MahalanobisDistance
from calib_monai.recalibration import LocalTemperatureScaling
from calib_monai.recalibration.fitting import ValidationVolume, split_volumes, volume_interval_fit
from calib_monai.recalibration.references import fixed_references
from calib_monai.review import CaseQualityd, ValidatedRange, load_validated_range, review_case
from calib_monai.review import rule as review_rule
from calib_monai.review.conformal import competition_ranks
from calib_monai.review.reasons import NO_CASE_SCORE
from calib_monai.review.signals import signal_values
from calib_monai.review.validated_range import read_validated_range


def _case(score: float) -> dict:
    return {"case_score": score, "classes": {"a": {"volume": 1.5}}}


def test_review_rule_by_hand():
    # 19 validation scores 0.60..0.96: alpha 0.05 -> k = floor(0.05 * 20) = 1, bound 1 / 20
    validated = ValidatedRange([0.60 + 0.02 * i for i in range(19)], {"a": [1.0, 2.0]}, alpha=0.05)
    assert validated.rank == 1 and validated.bound == pytest.approx(0.05) and validated.warnings == []
    ok = {"case_score": 0.61, "classes": {"a": {"volume": 9.0}}}
    assert validated.check(ok)["flag"] is False and validated.check(ok)["reasons"] == []
    verdict = validated.check(_case(0.59))
    assert verdict["flag"] is True and verdict["rank"] == 1 and verdict["k"] == 1
    assert "estimated mean DSC 0.590 is among the lowest (rank 1 of 20" in verdict["reasons"][0]
    # a tie with the lowest validation score counts against the case: 2 of the 20 at least as extreme, not flagged
    assert validated.check(_case(0.60))["flag"] is False and validated.check(_case(0.60))["rank"] == 2
    # ... also when the tie carries float noise (a served validation image measured again on a GPU: 12th digit)
    for noisy in (0.60 + 1e-12, 0.60 - 1e-12):
        assert validated.check(_case(noisy))["rank"] == 2 and validated.check(_case(noisy))["flag"] is False
    assert validated.check(_case(0.60 - 1e-6))["rank"] == 1  # a real difference is not a tie
    assert competition_ranks(np.array([1.0, 1.0 + 1e-12, 0.5, np.inf])).tolist() == [2, 2, 4, 1]
    # alpha 0.2 with 19 scores: k = 4, bound 4 / 20; 0.65 is 4th lowest of the 20 (flagged), 0.67 5th (not)
    loose = ValidatedRange(validated.scores, alpha=0.2)
    assert loose.rank == 4 and loose.bound == pytest.approx(0.2)
    assert loose.check(_case(0.65))["flag"] is True and loose.check(_case(0.67))["flag"] is False
    # the volume rule: outside [1 / 2, 2 * 2] mL with factor 2; it adds 2 / (n + 1) per class to the bound
    by_volume = ValidatedRange(validated.scores, {"a": [1.0, 2.0]}, volume_factor=2.0)
    assert by_volume.check(ok)["flag"] is True and "a volume 9 mL is outside" in by_volume.check(ok)["reasons"][0]
    assert by_volume.check(_case(0.9) | {"classes": {"a": {"volume": 3.9}}})["flag"] is False
    assert by_volume.bound == pytest.approx(1 / 20 + 2 / 20)
    with pytest.raises(ValueError, match="alpha"):
        ValidatedRange([0.5], alpha=1.5)
    # a quality straight from the probabilities: all background, so no structure is predicted: no score, and the
    # case score cannot judge it (null, never a silent no)
    prob = torch.zeros(2, 4, 4)
    prob[0], prob[1] = 0.99, 0.01
    review = review_case(case_quality(prob, class_names=["bg", "a"]), validated)["review"]
    assert review["flag"] is None and review["reasons"] == [NO_CASE_SCORE]


def test_the_combined_score_by_hand():
    # n = 4, alpha 0.2: k = 1, bound 1 / 5. Case score 0.3 against 0.5..0.8: the others' median of -score is -0.65,
    # their MAD 0.1, so the case lies 0.35 / 0.14826 = 2.36 MADs beyond; the 0.5 volume against 0.6, 0.7, 0.8 and the
    # case 0.15 / 0.14826 = 1.01: the case is the most extreme of the 5
    scores = [0.5, 0.6, 0.7, 0.8]
    verdict = ValidatedRange(scores, alpha=0.2).check(_case(0.3))
    assert verdict["flag"] is True and verdict["rank"] == 1
    assert verdict["signals"]["case_score"] == {"value": 0.3, "rank": 1, "beyond": pytest.approx(2.36)}
    # two signals: a typical score (0.75) and an image 7.6 standard deviations from the others' intensities. The
    # 0.5 volume is also most extreme by score (rank 1): the best rank alone would tie the two; on the common scale
    # the image (14.2 MADs beyond) outranks the 0.5 volume's score (3.0 MADs), so the case is flagged for its image
    two = ValidatedRange(scores, alpha=0.2, inputs=[[0.0], [1.0], [2.0], [3.0]], input_check=True)
    verdict = two.check(_case(0.75), [10.0])
    assert verdict["flag"] is True and verdict["rank"] == 1 and len(verdict["reasons"]) == 1
    assert (
        f"image unlike the validation images (image statistic 0: distance {8.5 / math.sqrt(1.25):.1f}"
        in (verdict["reasons"][0])
    )
    assert "rank 1 of 5, 14.2 MADs beyond the others" in verdict["reasons"][0]
    assert verdict["signals"]["case_score"]["rank"] == 4  # 0.5, 0.6 and 0.7 are lower
    assert two.check(_case(0.75), [1.5])["flag"] is False


def test_too_few_validation_volumes_cannot_judge():
    # n = 13 at alpha 0.05: k = floor(0.7) = 0: no flag at that alpha, and why; the case's rank is still given
    few = ValidatedRange([0.5 + 0.01 * i for i in range(13)], alpha=0.05)
    assert few.rank == 0 and few.bound == 0 and few.volumes_needed == 19
    verdict = few.check(_case(0.1))
    assert verdict["flag"] is None and verdict["rank"] == 1
    assert verdict["reasons"][0] == (
        "cannot judge at alpha = 0.05 with n = 13 validation volumes: needs at least 19 volumes (or review_alpha >= "
        "0.0714); the case is ranked 1 of 14"
    )
    assert "every case gets the flag null" in few.warnings[0] and "needs at least 19" in few.describe()
    # the user raises review_alpha: k = floor(0.1 * 14) = 1, bound 1 / 14
    raised = ValidatedRange(few.scores, alpha=0.1)
    assert raised.check(_case(0.1))["flag"] is True and raised.bound == pytest.approx(1 / 14)
    # the bundles' validation sets: Hippocampus 25 (k 1, 3.8%), ACDC 20 (k 1, 4.8%), 19 the fewest
    for n, bound in ((19, 1 / 20), (20, 1 / 21), (25, 1 / 26), (26, 1 / 27), (41, 2 / 42)):
        assert ValidatedRange([0.5] * n).bound == pytest.approx(bound)


def _feature_range(rng, n: int, alpha: float, dim: int = 6) -> tuple[ValidatedRange, np.ndarray]:
    points = rng.normal(size=(n + 1, dim))
    distance = MahalanobisDistance(max_dim=dim).fit(points[:n])
    scores, inputs = rng.uniform(size=n + 1), rng.normal(size=(n + 1, 2))
    validated = ValidatedRange(
        list(scores[:n]),
        alpha=alpha,
        inputs=inputs[:n].tolist(),
        input_check=True,
        features=distance.to_dict(),
        feature_check=True,
    )
    return validated, np.concatenate([points[n], [scores[n]], inputs[n]])


def test_the_flag_rate_of_exchangeable_cases_is_within_the_bound():
    """Simulated validation sets and a case from the same distribution, three signals (score, intensities,
    features): one rule, so the flag rate is k / (n + 1) (continuous signals: no ties), not r k / (n + 1)."""
    rng = np.random.default_rng(0)
    n, trials, flagged, shifted = 19, 600, 0, 0
    for _ in range(trials):
        validated, case = _feature_range(rng, n, 0.05)
        verdict = validated.check(_case(float(case[6])), case[7:].tolist(), case[:6])
        flagged += verdict["flag"] is True
        shifted += validated.check(_case(float(case[6])), case[7:].tolist(), case[:6] + 6.0)["flag"] is True
    spread = 3 * math.sqrt(0.05 * 0.95 / trials)
    assert validated.rank == 1 and validated.bound == pytest.approx(0.05)
    assert abs(flagged / trials - 0.05) < spread
    assert shifted / trials > 0.9  # features moved by 6 standard deviations: nearly always the most extreme


def test_the_feature_signal_left_out_or_not_comparable():
    rng = np.random.default_rng(1)
    validated, case = _feature_range(rng, 19, 0.05)
    far = validated.check(_case(float(case[6])), case[7:].tolist(), case[:6] + 50.0)
    assert far["flag"] is True and far["reasons"][0].startswith("features unlike the validation cases' (Mahalanobis")
    assert "rank 1 of 20" in far["reasons"][0]
    # no features (a TorchScript model): the signal is left out, with why; the others still judge
    none = validated.check(_case(-1.0), case[7:].tolist(), None, "a TorchScript model.ts")
    assert none["flag"] is True and none["left_out"] == ["network features left out: a TorchScript model.ts"]
    assert "features" not in none["signals"] and "estimated mean DSC" in none["reasons"][0]
    # NaN features: cannot judge, with the reason
    typical = _case(float(np.median(validated.scores))), np.mean(validated.inputs, 0).tolist()
    nan = validated.check(*typical, np.full(6, np.nan))
    assert nan["flag"] is None and "6 NaN or infinite" in nan["reasons"][0]
    # stored and read back: the same verdict
    again = ValidatedRange(
        **{k: getattr(validated, k) for k in ("scores", "alpha", "inputs", "input_check")},
        features=validated.record()["features"],
        feature_check=True,
    )
    assert again.check(_case(0.5), case[7:].tolist(), case[:6]) == validated.check(
        _case(0.5), case[7:].tolist(), case[:6]
    )


def test_what_cannot_be_judged_is_never_a_silent_no():
    # a collapsed model: every validation volume scored 0; a case at 0 is not "fine", it cannot be judged
    collapsed = ValidatedRange([0.0] * 19)
    verdict = collapsed.check(_case(0.0))
    assert verdict["flag"] is None and verdict["reasons"][0].startswith("cannot judge the case score: all 19")
    # below an all-equal range is still below it
    assert ValidatedRange([0.99] * 19).check(_case(0.5))["flag"] is True
    # no usable validation score (the model predicts nothing on any), stored as null and read back as NaN
    empty = ValidatedRange([None, float("nan"), None] * 7)
    assert (
        empty.check(_case(0.7))["flag"] is None and "none of the 21 validation" in empty.check(_case(0.7))["reasons"][0]
    )
    # a case without a score cannot be judged by it
    assert ValidatedRange([0.5 + 0.01 * i for i in range(19)]).check(_case(float("nan")))["flag"] is None
    # the input signal with one validation image, or without the case's statistics: left out, said so
    one = ValidatedRange([0.5 + 0.01 * i for i in range(19)], inputs=[[0.2, 0.1]] * 19, input_check=True)
    two = ValidatedRange(one.scores, inputs=[[0.2 + 0.01 * i, 0.1] for i in range(19)], input_check=True)
    assert "image intensities left out: no image statistics" in two.check(_case(0.9))["left_out"][0]
    assert two.check(_case(0.9))["flag"] is False
    # a NaN image: its statistics are not comparable; statistics of another length (another version): run calibrate
    assert two.check(_case(0.9), [float("nan"), 0.1])["flag"] is None
    other = two.check(_case(0.9), [0.2, 0.1, 0.3, 0.3])
    assert other["flag"] is None and "the case has 4 image statistics and the validated range 2" in other["reasons"][0]
    assert one.check(_case(0.9), [0.2, 0.1])["flag"] is False  # all-equal intensities: the others still judge
    # no range at all: null and why
    missing = review_case(_case(0.9), None, missing="no validated range at x.json")
    assert missing["review"] == {"flag": None, "reasons": ["cannot judge: no validated range at x.json"]}


def test_a_bad_validated_range_file_gives_one_line(tmp_path):
    weights, other = tmp_path / "model.pt", tmp_path / "other.pt"
    weights.write_bytes(b"weights")
    other.write_bytes(b"other weights")
    path = tmp_path / "validated_range.json"
    assert read_validated_range(path, weights) == (
        None,
        f"no validated range at {path}: run the bundle's calibrate step to get review flags",
    )
    ValidatedRange([0.5, float("nan"), 0.7], {"a": [1.0, 2.0, 3.0]}).save(path, weights)
    record = json.loads(path.read_text())
    assert record["scores"] == [0.5, None, 0.7] and record["bound"] == 0 and record["rank"] == 0
    loaded = load_validated_range(tmp_path, weights)
    assert loaded.scores[0] == 0.5 and math.isnan(loaded.scores[1])
    # measured with other weights: not applied, and why
    validated, why = read_validated_range(path, other)
    assert validated is None and "measured with other weights than" in why and "calibrate step again" in why
    for text, match in (
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "holds a list, not a validated range"),
        ('{"scores": [0.5]}', r"lacks \['volumes', 'alpha', 'volume_factor', 'info'\]"),
        (json.dumps({**record, "alpha": 2}), "alpha must be in"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match=match) as error:
            read_validated_range(path, weights)
        assert str(path) in str(error.value) and "calibrate step again" in str(error.value)
        assert "\n" not in str(error.value)


def test_the_split_of_the_validation_volumes():
    split = split_volumes(26, 0.5, seed=0)
    assert len(split.fit) == len(split.range) == 13 and sorted(split.fit + split.range) == list(range(26))
    assert split_volumes(26, 0.5, seed=0) == split and split_volumes(26, 0.5, seed=1) != split
    assert not split.in_sample and "13 volumes fit the recalibration, 13 measure the range" in split.rule
    assert split.folds == [(split.fit, split.range)] and not split.crossfit
    two = split_volumes(2, 0.5)
    assert len(two.fit) == len(two.range) == 1 and set(two.fit + two.range) == {0, 1}
    one = split_volumes(1, 0.5, crossfit=True)
    assert one.in_sample and one.fit == one.range == [0] and "1 validation volume" in one.rule
    assert split_volumes(3, 0.0).in_sample
    with pytest.raises(ValueError, match="calibration_split must be in"):
        split_volumes(4, 1.0)
    # 2-fold cross-fitting: seeded halves of 13 and 12, each scored by the fit on the other; all 25 in the range,
    # the served recalibration fitted on all 25
    cross = split_volumes(25, seed=0, crossfit=True)
    (a, b), (b2, a2) = cross.folds
    assert a == a2 and b == b2 and len(a) == 13 and len(b) == 12 and sorted(a + b) == list(range(25))
    assert cross.fit == cross.range == list(range(25)) and cross.crossfit and not cross.in_sample
    assert (
        "approximate"
        in cross.record([ValidationVolume(*[torch.zeros(1)] * 3, case=str(i)) for i in range(25)])["exchangeability"]
    )


def test_local_temperature_keeps_the_parameters_of_the_lowest_held_out_nll():
    g = torch.Generator().manual_seed(0)

    def slices(n: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = 4 * torch.randn(n, 3, size, size, generator=g)  # labels drawn from softmax(logits / 3)
        prob = torch.softmax(logits / 3, 1).movedim(1, -1).reshape(-1, 3)
        labels = torch.multinomial(prob, 1, generator=g).reshape(n, size, size)
        return logits, torch.rand(n, 1, size, size, generator=g), labels

    # groups of two in-plane sizes (whole volumes are not padded to one size)
    (za, xa, ya), (zb, xb, yb), held = slices(6, 8), slices(4, 12), slices(4, 10)
    lts = LocalTemperatureScaling(3, 1)
    start = lts.nll([held])
    lts.fit([za, zb], [xa, xb], [ya, yb], steps=60, held_out=tuple([t] for t in held), eval_every=5)
    history = lts.history
    assert history["heldout_nll_before"] == pytest.approx(start)
    assert history["heldout_nll_after"] == pytest.approx(lts.nll([held]))  # the kept parameters are the best
    assert history["heldout_nll_after"] < start and history["best_step"] > 0  # overconfident logits: T > 1 helps
    # a learning rate that wrecks the fit: the parameters kept are never worse than the start
    wrecked = LocalTemperatureScaling(3, 1).fit(za, xa, ya, steps=20, lr=50.0, held_out=held, eval_every=1)
    assert wrecked.history["heldout_nll_after"] == pytest.approx(wrecked.nll([held]))
    assert wrecked.history["heldout_nll_after"] <= wrecked.history["heldout_nll_before"]
    with pytest.raises(ValueError, match="need logits"):
        lts.fit(za, xa[:, :, :4], ya)


def test_the_volume_interval_is_widened_by_the_factor_fitted_on_validation(tmp_path):
    # three volumes, one structure each: expected 10, 20, 30 mL with half-widths 2, 2, 3 (independent voxels) and
    # true volumes 11, 24, 30: |true - expected| / half = 0.5, 2, 0; at 50% coverage the ceil(4 * 0.5) = 2nd: 0.5
    qualities = [{"classes": {"a": {"volume": e, "volume_high": h}}} for e, h in ((10, 12), (20, 22), (30, 33))]
    volumes = [(torch.tensor([1] * t + [0]), 1.0) for t in (11, 24, 30)]  # (label, voxel mL) of each
    scale, record = volume_interval_fit(qualities, volumes, coverage=0.5)
    assert scale == 0.5 and record == {"coverage": 0.5, "pairs": 3, "scale": 0.5}
    # at 95% three pairs are too few: not widened, said so
    assert volume_interval_fit(qualities, volumes)[0] is None
    assert (
        volume_interval_fit(qualities, volumes)[1]["note"] == "3 (volume, class) pairs are too few for 95%: not widened"
    )
    # served: CaseQualityd widens each case's interval by the stored factor (half-width 2.4 x 3 around 20)
    prob = torch.zeros(2, 100)
    prob[1, :40] = 0.5
    prob[0] = 1 - prob[1]
    validated = ValidatedRange([0.5 + 0.01 * i for i in range(19)], volume_interval_scale=3.0)
    stored = ValidatedRange(**{k: v for k, v in validated.record().items() if k in ("scores", "volume_interval_scale")})
    for rule in (validated, stored):
        quality = CaseQualityd("prob", rule, label_names={"0": "bg", "1": "a"})({"prob": prob})["quality"]
        organ = quality["classes"]["a"]
        # 40 voxels at p = 0.5: expected 20, standard deviation sqrt(40 * 0.25) = 3.16, half-width 1.96 * 3.16 * 3
        assert quality["volume_interval_scale"] == 3.0 and organ["volume"] == pytest.approx(20.0)
        assert organ["volume_high"] - 20 == pytest.approx(3 * 1.959964 * math.sqrt(10), rel=1e-4)
    with pytest.raises(ValueError, match="volume_interval_scale must be a finite number > 0 or null"):
        ValidatedRange([0.5], volume_interval_scale=float("inf"))


def test_fixed_references_from_training_images():
    # input statistics of 4 training images: mean (2, 20), population std (1, 10); standardised, the corners of a
    # square, whose covariance is the identity (Ledoit-Wolf shrinks nothing: S = m I), so the precision is too
    references = fixed_references([[1.0, 10.0], [3.0, 10.0], [1.0, 30.0], [3.0, 30.0]], None, None)
    reference = references["input_reference"]
    assert reference["mean"] == pytest.approx([2.0, 20.0]) and references["feature_reference"] is None
    assert reference["std"] == pytest.approx([1.0, 10.0])
    assert np.asarray(reference["precision"]) == pytest.approx(np.eye(2), abs=1e-12)
    # the input distance is then measured from that fixed reference, the intensity statistics together: an image
    # 3 and 4 spreads off is sqrt(3^2 + 4^2) = 5 away, and statistic 1 takes the larger share (16 of 25)
    validated = ValidatedRange(
        [0.5 + 0.01 * i for i in range(19)],
        inputs=[[2.0, 20.0 + 0.1 * i] for i in range(19)],
        input_check=True,
        input_reference=reference,
    )
    verdict = validated.check(_case(0.6), [2.0 + 3.0, 20.0 + 40.0])
    assert verdict["flag"] is True and verdict["signals"]["input"]["value"] == pytest.approx(5.0)
    assert verdict["reasons"][0].startswith(
        "image unlike the training images (image statistic 1 with the other intensity statistics: distance 5.0"
    )
    # without a precision (a statistic not finite on the training images) each statistic counts alone
    alone = {k: v for k, v in reference.items() if k != "precision"}
    old = ValidatedRange(validated.scores, inputs=validated.inputs, input_check=True, input_reference=alone)
    verdict = old.check(_case(0.6), [2.0 + 3.0, 20.0 + 40.0])
    assert verdict["signals"]["input"]["value"] == pytest.approx(4.0)
    assert verdict["reasons"][0].startswith("image unlike the training images (image statistic 1: distance 4.0")
    with pytest.raises(ValueError, match=r"precision has shape \(3, 3\) for 2 intensity statistics: run calibrate"):
        ValidatedRange(validated.scores, inputs=validated.inputs, input_reference={**alone, "precision": np.eye(3)})
    # features: Mahalanobis fitted on 40 training vectors; the validation cases' distances stored; a far case
    g = np.random.default_rng(0)
    training, validation = g.normal(size=(40, 5)), g.normal(size=(19, 5))
    references = fixed_references(None, list(training), list(validation))
    reference = references["feature_reference"]
    assert reference["images"] == 40 and len(reference["validation"]) == 19
    fitted = MahalanobisDistance(max_dim=16).fit(training)
    assert reference["validation"] == pytest.approx([fitted.distance(v) for v in validation])
    with_features = ValidatedRange(
        validated.scores,
        features=MahalanobisDistance(max_dim=5).fit(validation).to_dict(),
        feature_check=True,
        feature_reference=reference,
    )
    far = with_features.check(_case(0.6), None, np.full(5, 10.0))
    assert far["flag"] is True and far["reasons"][0].startswith("features unlike the training images' (Mahalanobis")
    assert far["signals"]["features"]["value"] == pytest.approx(fitted.distance(np.full(5, 10.0)))
    assert with_features.check(_case(0.6), None, validation[0])["flag"] is False
    with pytest.raises(ValueError, match="feature_reference: 3 validation distances for 19 scores"):
        ValidatedRange(validated.scores, feature_reference={**reference, "validation": [1.0, 2.0, 3.0]})


def test_a_shift_seen_by_image_and_features_says_once_that_the_estimate_is_not_vouched_for(monkeypatch):
    rng = np.random.default_rng(2)
    validated, case = _feature_range(rng, 19, 0.05)
    far = validated.check(_case(float(case[6])), case[7:].tolist(), case[:6] + 50.0)
    assert far["flag"] is True and far["reasons"][-1].endswith("; the estimated DSC is not vouched for on such a case")
    # a case flagged by its low score alone: no such note (the score itself says the case is poor)
    low = validated.check(_case(-10.0), case[7:].tolist(), case[:6])
    assert low["flag"] is True and not any("not vouched" in r for r in low["reasons"])
    # both signals infinitely far (tied as the case's largest): two reasons, the note once, after the last
    values, left_out, unknown, farthest = signal_values(validated, _case(0.9), case[7:].tolist(), case[:6], "")
    for name in ("input", "features"):
        values[name][-1] = np.inf
    monkeypatch.setattr(review_rule, "signal_values", lambda *a: (values, left_out, unknown, farthest))
    both = validated.check(_case(0.9), case[7:].tolist(), case[:6])
    assert [r.split(" (")[0] for r in both["reasons"]] == [
        "image unlike the validation images",
        "features unlike the validation cases'",
    ]
    assert [r.endswith("not vouched for on such a case") for r in both["reasons"]] == [False, True]
