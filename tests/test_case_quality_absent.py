"""Absent structures at real sizes: a structure the model predicts nowhere is absent (left out of the case score, as
the true DSC leaves it out) by its largest probability, which does not grow with the volume, and a structure that is
there but missed still scores 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import ndimage

from calib_monai.data.phantoms import generate_phantom
from calib_monai.metrics import case_quality, estimated_dice
from calib_monai.metrics.case_quality import ABSENT_PROBABILITY

LEAKS = (1e-6, 1e-5, 1e-4, 1e-3)


def _two_structures(shape: tuple[int, ...], leak: float, seed: int = 0) -> torch.Tensor:
    """``(3, *shape)`` float32: class 1 predicted in a ball (p = 0.7295) and given 0.3 on a shell of as many voxels
    around it (estimated DSC 0.717 at 256 x 256 x 100); class 2 absent from the case, a leak in (0, 2 leak) at every
    voxel."""
    grid = torch.meshgrid(*(torch.arange(n, dtype=torch.float32) - n / 2 for n in shape), indexing="ij")
    radius = torch.sqrt(sum(g * g for g in grid)) / (min(shape) / 4)
    p1 = torch.where(radius < 1, 0.7295, torch.where(radius < 2 ** (1 / 3), 0.3, 0.0))
    p2 = 2 * leak * torch.rand(shape, generator=torch.Generator().manual_seed(seed))
    return torch.stack([1 - p1 - p2, p1, p2])


def test_absent_is_predicted_nowhere_and_below_the_threshold_at_every_voxel():
    # two classes, class 1 predicted nowhere: absent iff its largest probability is below 0.1, whatever its sum
    cases = (
        ([0.0] * 10, True),
        ([0.09] * 10, True),  # expected on 0.9 voxel: the size no longer decides
        ([0.049] * 10, True),
        ([0.0] * 9 + [0.1], False),
        ([0.0] * 9 + [0.3], False),  # expected on 0.3 voxel, but a 0.3 chance at one place: missed
        ([0.45] * 10, False),
    )
    for p1, absent in cases:
        p1 = torch.tensor(p1, dtype=torch.float64)
        est = estimated_dice(torch.stack([1 - p1, p1]))[0].item()
        assert math.isnan(est) if absent else est == 0.0, (p1.tolist(), est)
        papers = estimated_dice(torch.stack([1 - p1, p1]), empty_class="papers")[0].item()
        assert papers == (1.0 if absent else 0.0)
    assert ABSENT_PROBABILITY == 0.1
    # predicted somewhere: the estimate, however small its probabilities (argmax 0.34 of three classes)
    prob = torch.tensor([[0.33, 1.0], [0.34, 0.0], [0.33, 0.0]], dtype=torch.float64)
    assert estimated_dice(prob)[0].item() == pytest.approx(2 * 0.34 / (1 + 0.34), abs=1e-12)


@pytest.mark.parametrize("shape", [(32, 32, 8), (128, 128, 48), (256, 256, 100)])
@pytest.mark.parametrize("leak", LEAKS)
def test_an_absent_structure_leaves_the_case_score_at_any_size(shape, leak):
    # the leak sums to up to 6550 voxels over 256 x 256 x 100; its largest value stays 2 leak
    prob = _two_structures(shape, leak)
    present = estimated_dice(torch.stack([prob[0] + prob[2], prob[1]]))[0].item()  # the case without the class
    quality = case_quality(prob, class_names=["background", "organ", "absent organ"])
    assert math.isnan(quality["classes"]["absent organ"]["est_dice"])
    assert quality["classes"]["organ"]["est_dice"] == pytest.approx(present, abs=1e-6)
    assert quality["case_score"] == quality["classes"]["organ"]["est_dice"]
    if shape == (256, 256, 100):
        assert quality["case_score"] == pytest.approx(0.717, abs=5e-4)
    papers = case_quality(prob, empty_class="papers")
    assert papers["classes"]["class_2"]["est_dice"] == 1.0


def _phantom_probabilities(leak: float, missed: float | None = None) -> tuple[torch.Tensor, list[str]]:
    """``(5, 256, 256, 100)`` float32 softmax-like probabilities of a phantom's liver, right kidney, spleen and
    gallbladder, the gallbladder removed from the case (cholecystectomy): each present organ's smoothed mask (soft
    boundaries, partial volume), the gallbladder a leak in (0, 2 leak) per voxel. ``missed``: the spleen is there but
    given only 0.2 to ``missed`` over its voxels, below the background (predicted nowhere)."""
    label = generate_phantom(0, 0, (256, 256, 100))[1]
    label[label == 9] = 0  # generated without a gallbladder
    rng = np.random.default_rng(1)
    soft = [ndimage.gaussian_filter((label == v).astype(np.float32), 1.0) for v in (1, 2, 3)]
    if missed is not None:
        soft[2] = np.where(label == 3, rng.uniform(0.2, missed, label.shape).astype(np.float32), 0.0)
    organs = np.stack(soft)
    gallbladder = (2 * leak * rng.random(label.shape, dtype=np.float32))[None]
    organs *= (1 - gallbladder) / np.maximum(organs.sum(0, keepdims=True), 1.0)
    background = np.clip(1 - organs.sum(0, keepdims=True) - gallbladder, 0, 1)  # float32 rounding below 0
    prob = torch.from_numpy(np.concatenate([background, organs, gallbladder]))
    return prob, ["background", "liver", "right kidney", "spleen", "gallbladder"]


@pytest.mark.parametrize("leak", LEAKS)
def test_a_phantom_without_its_gallbladder_is_scored_by_its_organs(leak):
    prob, names = _phantom_probabilities(leak)
    quality = case_quality(prob, class_names=names)
    est = {name: quality["classes"][name]["est_dice"] for name in names[1:]}
    assert math.isnan(est["gallbladder"]) and all(0.5 < est[n] < 1 for n in names[1:4]), est
    assert quality["case_score"] == pytest.approx(np.mean([est[n] for n in names[1:4]]), abs=1e-12)


def test_a_missed_structure_that_is_there_still_scores_zero():
    # the spleen is predicted nowhere but given 0.2-0.45 over its voxels (a real place): missed, 0, in the case score
    prob, names = _phantom_probabilities(1e-4, missed=0.45)
    assert (prob.argmax(0) != 3).all() and 0.4 < prob[3].max() < 0.45
    quality = case_quality(prob, class_names=names)
    est = {name: quality["classes"][name]["est_dice"] for name in names[1:]}
    assert est["spleen"] == 0.0 and math.isnan(est["gallbladder"])
    assert quality["case_score"] == pytest.approx((est["liver"] + est["right kidney"]) / 3, abs=1e-12)
    # the same at its weakest: 0.2 to 0.25 everywhere in it
    weak = case_quality(_phantom_probabilities(1e-4, missed=0.25)[0], class_names=names)
    assert weak["classes"]["spleen"]["est_dice"] == 0.0
