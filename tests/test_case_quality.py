"""Case quality without the label: hand-worked cases, a perfectly calibrated volume, and the device rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.ndimage import binary_dilation

from calib_monai.metrics import case_quality, estimated_dice, low_confidence_fraction, predicted_volumes
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


def test_absent_class_and_case_score():
    # class 2 predicted nowhere but given probability: its estimate is 0; class 3 given none at all: NaN
    prob = torch.tensor([[0.6, 0.1, 0.7], [0.3, 0.8, 0.2], [0.1, 0.1, 0.1], [0.0, 0.0, 0.0]])
    est = estimated_dice(prob)
    assert est[1].item() == 0.0 and math.isnan(est[2].item())
    # class 1: predicted at voxel 1 only, 2 * 0.8 / (1 + 1.3)
    assert est[0].item() == pytest.approx(1.6 / 2.3)
    quality = case_quality(prob, class_names=["bg", "a", "b", "c"])
    assert quality["case_score"] == pytest.approx((1.6 / 2.3 + 0.0) / 2)  # NaN classes left out
    assert set(quality["classes"]) == {"a", "b", "c"}
    assert math.isnan(quality["classes"]["b"]["low_confidence_fraction"])  # predicted nowhere


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
    # the 95% volume interval holds the drawn volume about 95% of the time
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
