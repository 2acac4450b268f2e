"""Case quality without the label: hand-worked cases, a perfectly calibrated volume, and the device rule."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from scipy.ndimage import binary_dilation

from calib_monai.metrics import (
    case_quality,
    estimated_dice,
    fit_volume_interval_scale,
    low_confidence_fraction,
    predicted_volumes,
)
from calib_monai.metrics.case_quality import structure_band


def test_hand_worked_two_classes():
    # p(class 1) = 0.9, 0.8, 0.3, 0.1 -> prediction 1, 1, 0, 0
    # est DSC = 2 (0.9 + 0.8) / (2 + 2.1) = 3.4 / 4.1
    p1 = torch.tensor([0.9, 0.8, 0.3, 0.1])
    prob = torch.stack([1 - p1, p1])
    assert estimated_dice(prob).item() == pytest.approx(3.4 / 4.1, rel=1e-6)  # float32 inputs
    volumes = predicted_volumes(prob, voxel_volume=2.0)
    # expected count 2.1, variance 0.09 + 0.16 + 0.21 + 0.09 = 0.55
    half = 1.959963984540054 * math.sqrt(0.55)
    assert volumes["expected"].item() == pytest.approx(4.2)
    assert volumes["predicted"].item() == pytest.approx(4.0)
    assert volumes["low"].item() == pytest.approx(2 * (2.1 - half))
    assert volumes["high"].item() == pytest.approx(2 * (2.1 + half))
    # confidences 0.9, 0.8, 0.7, 0.9: of the two predicted voxels none is below 0.8, one is below 0.85
    assert low_confidence_fraction(prob, threshold=0.8).item() == 0.0
    assert low_confidence_fraction(prob, threshold=0.85).item() == 0.5


def test_classes_predicted_nowhere_and_case_score():
    # 5 voxels, 4 classes. class 1: predicted at voxel 1 only, 2 * 0.8 / (1 + 1.2); class 2: predicted nowhere but
    # given 0.4 (>= 0.1) somewhere: missed, 0; class 3: no probability at all; class 4: at most 0.05 (< 0.1) and
    # predicted nowhere: both absent, NaN as the true DSC of a class absent from label and prediction
    prob = torch.tensor(
        [
            [0.55, 0.1, 0.5, 0.5, 0.9],
            [0.1, 0.8, 0.1, 0.1, 0.1],
            [0.3, 0.1, 0.4, 0.4, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            [0.05, 0.0, 0.0, 0.0, 0.0],
        ],
        dtype=torch.float64,
    )
    est = estimated_dice(prob)
    assert est[0].item() == pytest.approx(1.6 / 2.2, abs=1e-12)
    assert est[1].item() == 0.0
    assert math.isnan(est[2].item()) and math.isnan(est[3].item())
    quality = case_quality(prob, class_names=["bg", "a", "b", "c", "d"])
    assert quality["case_score"] == pytest.approx((1.6 / 2.2 + 0.0) / 2, abs=1e-12)  # NaN classes left out
    assert set(quality["classes"]) == {"a", "b", "c", "d"}
    assert math.isnan(quality["classes"]["b"]["low_confidence_fraction"])  # predicted nowhere
    # the papers' convention: DSC 1 for a class absent from both
    papers = estimated_dice(prob, empty_class="papers")
    assert papers.tolist() == pytest.approx([1.6 / 2.2, 0.0, 1.0, 1.0], abs=1e-12)
    score = case_quality(prob, empty_class="papers")["case_score"]
    assert score == pytest.approx((1.6 / 2.2 + 0.0 + 1.0 + 1.0) / 4, abs=1e-12)


def test_one_absent_structure_does_not_halve_the_case_score():
    # a well predicted structure and a second one absent from the case (tiny probability everywhere, predicted
    # nowhere, expected on 0.001 voxel): the case score is the first structure's, as the case's mean DSC
    g = torch.Generator().manual_seed(0)
    p1 = torch.where(torch.rand(1000, generator=g) < 0.3, 0.99, 0.005).double()
    p2 = torch.full_like(p1, 1e-6)
    prob = torch.stack([1 - p1 - p2, p1, p2])
    est = estimated_dice(prob)
    assert est[0].item() > 0.95 and math.isnan(est[1].item())
    assert case_quality(prob)["case_score"] == pytest.approx(est[0].item(), abs=1e-12)


@pytest.mark.parametrize("empty_class", ["nan", "papers"])
def test_absent_structure_follows_the_true_dice_convention(empty_class):
    # the true DSC of a class absent from label and prediction (MONAI's DiceMetric through the project's
    # segmentation_metrics_per_volume) and the estimate of a class absent from probabilities and prediction agree
    from calib_monai.metrics import segmentation_metrics_per_volume

    label = torch.tensor([0, 1, 1, 0, 0, 0]).reshape(1, 1, 6, 1)
    prob = torch.tensor([[0.9, 0.1, 0.2, 1.0, 1.0, 1.0], [0.1, 0.9, 0.8, 0.0, 0.0, 0.0], [0.0] * 6])
    prob = prob.double().reshape(3, 6, 1)
    true = segmentation_metrics_per_volume(prob[None], label, empty_class=empty_class, surface_distances=False)
    est = estimated_dice(prob, empty_class=empty_class)
    assert np.isnan(true["dice"][0, 1]) == math.isnan(est[1].item())
    if empty_class == "papers":
        assert true["dice"][0, 1] == est[1].item() == 1.0


def _calibrated_volume(seed: int) -> torch.Tensor:
    """A (3, 48, 48, 16) probability volume with blobs of varying sharpness: it is the truth's distribution."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.stack(torch.meshgrid(*(torch.linspace(-1, 1, n) for n in (48, 48, 16)), indexing="ij"))
    r1 = (grid[0] + 0.3) ** 2 + grid[1] ** 2 + grid[2] ** 2
    r2 = (grid[0] - 0.4) ** 2 + (grid[1] - 0.2) ** 2 + grid[2] ** 2
    logits = torch.stack([torch.zeros_like(r1), 6 * (0.25 - r1), 4 * (0.12 - r2)])
    logits = logits + 0.8 * torch.randn(logits.shape, generator=g)
    return logits.softmax(0).double()


def test_estimate_is_the_true_dice_of_a_perfectly_calibrated_case_in_expectation():
    prob = _calibrated_volume(0)
    pred = prob.argmax(0)
    est = estimated_dice(prob, pred)
    g = torch.Generator().manual_seed(1)
    draws = 200
    dice = torch.zeros(draws, 2, dtype=torch.float64)
    counts = torch.zeros(draws, 2, dtype=torch.float64)
    flat = prob.reshape(3, -1).T
    for i in range(draws):  # labels drawn voxel by voxel from the model's own probabilities
        label = torch.multinomial(flat, 1, generator=g)[:, 0].reshape(pred.shape)
        for k in (1, 2):
            p, t = pred == k, label == k
            dice[i, k - 1] = 2 * (p & t).sum() / (p.sum() + t.sum())
            counts[i, k - 1] = t.sum()
    assert est.tolist() == pytest.approx(dice.mean(0).tolist(), abs=0.005)
    # labels drawn voxel by voxel independently: there the interval assuming independent voxels holds ~95%
    volumes = predicted_volumes(prob, pred)
    inside = ((counts >= volumes["low"]) & (counts <= volumes["high"])).double().mean(0)
    assert inside.tolist() == pytest.approx([0.95, 0.95], abs=0.04)
    assert volumes["expected"].tolist() == pytest.approx(counts.mean(0).tolist(), rel=0.01)


def test_overconfident_probabilities_overestimate():
    # the same prediction with sharper probabilities than the truth's: the estimate rises above the true DSC
    prob = _calibrated_volume(0)
    sharp = (prob.log() / 0.3).softmax(0)
    assert (estimated_dice(sharp) > estimated_dice(prob) + 0.02).all()


def test_structure_band_equals_a_cube_dilation():
    g = torch.Generator().manual_seed(3)
    a = torch.rand(12, 10, 8, generator=g) > 0.97
    b = torch.rand(12, 10, 8, generator=g) > 0.97
    for radius in (0, 1, 2):
        expected = binary_dilation((a | b).numpy(), np.ones((2 * radius + 1,) * 3)) if radius else (a | b).numpy()
        assert np.array_equal(structure_band([a, b], radius).numpy(), expected)
    two_d = structure_band([a[..., 0]], 1)
    assert np.array_equal(two_d.numpy(), binary_dilation(a[..., 0].numpy(), np.ones((3, 3))))


def test_runs_on_the_device_of_its_input():
    prob = torch.rand(3, 8, 8, 4, device="meta").softmax(0)  # any host read-back would raise on meta
    assert estimated_dice(prob).device.type == "meta"
    assert predicted_volumes(prob)["high"].device.type == "meta"
    assert low_confidence_fraction(prob).device.type == "meta"
    assert structure_band([prob[1] > 0.5], 2).device.type == "meta"


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ValueError, match="at least 2 classes"):
        estimated_dice(torch.ones(1, 4))
    with pytest.raises(ValueError, match="pred has shape"):
        estimated_dice(torch.rand(2, 4, 4).softmax(0), torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="class names"):
        case_quality(torch.rand(3, 4).softmax(0), class_names=["bg", "a"])


def _probs() -> torch.Tensor:
    return torch.rand(3, 6, 5, generator=torch.Generator().manual_seed(0)).softmax(0)


@pytest.mark.parametrize(
    ("prob", "match"),
    [
        (torch.randn(3, 6, 5) * 4, r"^prob must lie in \[0, 1\].*holds the value .*looks like logits"),
        (_probs() / 2, r"^prob must sum to 1 \(within 0\.001\) over the class dimension 0, .* sum to 0\.5"),
        (torch.cat([_probs()[:1] + 0.002, _probs()[1:]]), r"^prob must sum to 1 \(within 0\.001\).*sum to 1\.002"),
        (torch.where(torch.arange(30).reshape(6, 5) == 7, torch.nan, _probs()), r"^prob must hold finite"),
        (torch.where(torch.arange(30).reshape(6, 5) == 7, torch.inf, _probs()), r"^prob must hold finite"),
        (torch.zeros(3, 6, 5, dtype=torch.long), r"^prob must be floating-point"),
    ],
)
def test_impossible_probabilities_are_refused_in_one_line(prob, match):
    for fn in (case_quality, estimated_dice, predicted_volumes, low_confidence_fraction):
        with pytest.raises(ValueError, match=match) as info:
            fn(prob)
        assert "\n" not in str(info.value)


def test_probabilities_within_the_sum_tolerance_pass():
    prob = torch.cat([_probs()[:1] + 0.0009, _probs()[1:]])  # float32 softmax sums are ~1e-7 off; 9e-4 passes
    assert math.isfinite(case_quality(prob)["case_score"])
    half = _probs().half()  # float16: within C * eps(float16)
    assert estimated_dice(half).shape == (2,)


VOXEL_VOLUME = r"voxel_volume must be a finite number > 0 \(mL or mm\^3 of one voxel\)"
SCALE = r"volume_interval_scale must be a finite number > 0 \(1: independent voxels\)"
BAD_ARGUMENTS = [
    *(("voxel_volume", v, VOXEL_VOLUME) for v in (0, -1.5, float("nan"), float("inf"), True, "1")),
    *(("threshold", t, r"threshold must be a confidence in \[0, 1\]") for t in (-0.1, 1.5, float("nan"), None, True)),
    *(("volume_interval_scale", v, SCALE) for v in (0, -2.0, float("inf"), None)),
]
ALONE = {  # the functions that take the argument alone
    "voxel_volume": lambda v: predicted_volumes(_probs(), None, v),
    "threshold": lambda v: low_confidence_fraction(_probs(), None, v),
    "volume_interval_scale": lambda v: predicted_volumes(_probs(), volume_interval_scale=v),
}


@pytest.mark.parametrize(("argument", "value", "message"), BAD_ARGUMENTS)
def test_bad_arguments_are_refused_in_one_line(argument, value, message):
    for call in (lambda: case_quality(_probs(), **{argument: value}), lambda: ALONE[argument](value)):
        with pytest.raises(ValueError, match=rf"^{message}, got {re.escape(repr(value))}\.$"):
            call()


def test_threshold_bounds_are_allowed():
    assert case_quality(_probs(), threshold=0.0)["threshold"] == 0.0
    assert case_quality(_probs(), threshold=1)["threshold"] == 1.0


def test_empty_class_must_be_a_known_convention():
    with pytest.raises(ValueError, match=r"^empty_class must be one of \('nan', 'papers'\), got 'zero'\.$"):
        case_quality(_probs(), empty_class="zero")


def test_volume_interval_scale_widens_the_half_width():
    p1 = torch.tensor([0.9, 0.8, 0.3, 0.1], dtype=torch.float64)  # test_hand_worked_two_classes: variance 0.55
    prob = torch.stack([1 - p1, p1])
    half = 1.959963984540054 * math.sqrt(0.55)
    volumes = predicted_volumes(prob, voxel_volume=2.0, volume_interval_scale=3.0)
    assert volumes["high"].item() == pytest.approx(2 * (2.1 + 3 * half), abs=1e-12)
    assert volumes["low"].item() == 0.0  # 2.1 - 3 * 1.45 < 0: clipped
    quality = case_quality(prob, volume_interval_scale=3.0, class_names=["bg", "a"])
    assert quality["volume_interval_scale"] == 3.0
    assert quality["classes"]["a"]["volume_high"] == pytest.approx(2.1 + 3 * half, abs=1e-12)


def test_fit_volume_interval_scale_hand_worked():
    # half-widths 1 (high - expected); |true - expected| / half = 0, 2, 3, 0.5 -> sorted 0, 0.5, 2, 3
    expected, high, true = [10.0, 10, 10, 10], [11.0, 11, 11, 11], [10.0, 12, 13, 10.5]
    assert fit_volume_interval_scale(expected, high, true, coverage=0.5) == 2.0  # the ceil(5 * 0.5) = 3rd
    assert fit_volume_interval_scale(expected, high, true, coverage=0.7) == 3.0  # the ceil(5 * 0.7) = 4th
    assert fit_volume_interval_scale(expected, high, true) == math.inf  # 95% needs the ceil(5 * .95) = 5th of 4
    # pairs with no half-width or a NaN are left out
    assert fit_volume_interval_scale(expected + [5.0, float("nan")], high + [5.0, 1], true + [9.0, 1], 0.5) == 2.0
    with pytest.raises(
        ValueError, match=r"^expected, high and true must have one value per pair, got sizes \[4, 3, 4\]"
    ):
        fit_volume_interval_scale(expected, high[:3], true)
    with pytest.raises(ValueError, match=r"^coverage must be a number in \(0, 1\), got 1\.5\.$"):
        fit_volume_interval_scale(expected, high, true, 1.5)


def test_correlated_labels_break_the_independent_interval_and_a_fitted_scale_restores_it():
    # a soft disc; the label is {p > u} with one u ~ U(0, 1) per case: every voxel's marginal P(y = 1) is p (a
    # calibrated model), but the voxels move together (the boundary shifts as a whole), as real labels do
    n = 64
    yy, xx = torch.meshgrid(
        torch.linspace(-1, 1, n, dtype=torch.float64), torch.linspace(-1, 1, n, dtype=torch.float64), indexing="ij"
    )
    p1 = torch.sigmoid((0.5 - (xx**2 + yy**2).sqrt()) * 12)
    prob = torch.stack([1 - p1, p1])
    volumes = predicted_volumes(prob)
    expected, high = volumes["expected"].item(), volumes["high"].item()
    g = torch.Generator().manual_seed(0)

    def draws(count: int) -> torch.Tensor:
        return torch.stack([(p1 > u).sum().double() for u in torch.rand(count, generator=g, dtype=torch.float64)])

    fresh = draws(400)
    half = high - expected
    inside = ((fresh - expected).abs() <= half).double().mean().item()
    assert inside < 0.3  # far below 95%
    scale = fit_volume_interval_scale([expected] * 100, [high] * 100, draws(100))
    assert scale > 5
    widened = predicted_volumes(prob, volume_interval_scale=scale)
    covered = ((fresh >= widened["low"]) & (fresh <= widened["high"])).double().mean().item()
    assert covered == pytest.approx(0.95, abs=0.04)


def test_the_serving_paths_argmax_and_confidence_give_the_same_quality():
    # the serving path takes argmax and max once (ConfidenceAndSegmentationd) and hands both to case_quality
    g = torch.Generator().manual_seed(0)
    prob = torch.softmax(3 * torch.randn(4, 9, 8, 5, generator=g), dim=0)
    confidence, segmentation = prob.max(0, keepdim=True)
    taken = case_quality(prob, segmentation.to(torch.uint8), confidence=confidence, class_names=list("bcde"))
    assert taken == case_quality(prob, class_names=list("bcde"))
    # a confidence alone (no argmax given) is not trusted: the argmax is taken, the same numbers
    assert case_quality(prob, confidence=confidence * 0) == case_quality(prob)


def test_case_qualityd_reuses_only_the_argmax_and_confidence_taken_of_its_own_probabilities():
    from calib_monai.data.inference import ConfidenceAndSegmentationd
    from calib_monai.review import CaseQualityd

    g = torch.Generator().manual_seed(1)
    prob = torch.softmax(3 * torch.randn(3, 6, 5, 4, generator=g), dim=0)
    truth = case_quality(prob)
    served = CaseQualityd("pred")(ConfidenceAndSegmentationd("pred")({"pred": prob}))["quality"]
    assert {k: served[k] for k in truth} == truth
    # a segmentation and confidence of something else on the same grid (no marker, or another key's): taken again
    stale = {"pred": prob, "segmentation": torch.zeros(1, 6, 5, 4, dtype=torch.uint8), "confidence": prob[:1] * 0}
    for extra in ({}, {"confidence_of": "other"}):
        quality = CaseQualityd("pred")({**stale, **extra})["quality"]
        assert {k: quality[k] for k in truth} == truth
