"""Flip agreement: hand-worked pairwise Dice, 1 for flip-equivariant functions, below 1 for one that is not, the
NaN convention for absent classes, and the number of forward passes."""

from __future__ import annotations

import math

import pytest
import torch

from calib_monai.metrics.agreement import IN_PLANE_FLIPS, flip_agreement, pairwise_dice


def one_hot_probs(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(labels, num_classes).movedim(-1, 0).float()


def test_pairwise_dice_hand_worked():
    # three 1D maps of 4 voxels, classes 0..2
    a = torch.tensor([1, 1, 0, 0])
    b = torch.tensor([1, 0, 0, 0])
    c = torch.tensor([0, 0, 0, 0])
    dice, disagreement = pairwise_dice(torch.stack([a, b, c]), num_classes=3)
    # class 1: (a,b) 2*1/(2+1) = 2/3, (a,c) 0/(2+0) = 0, (b,c) 0/(1+0) = 0 -> 2/9
    # class 2: absent from all three -> NaN; differing voxels: (a,b) 1/4, (a,c) 2/4, (b,c) 1/4 -> 1/3
    assert dice[0].item() == pytest.approx(2 / 9)
    assert math.isnan(dice[1].item())
    assert disagreement.item() == pytest.approx(1 / 3)
    # a pair where both maps lack the class is left out: (a, a, c) class 1: (a,a) 1, (a,c) 0, (a,c) 0 -> 1/3
    dice, _ = pairwise_dice(torch.stack([a, a, c]), num_classes=2)
    assert dice[0].item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="labels: need at least 2"):
        pairwise_dice(a[None], 2)


def test_flip_equivariant_function_agrees_fully():
    torch.manual_seed(0)
    image = torch.rand(1, 12, 10, 5)
    calls = []

    def probs(x):  # pointwise thresholds: commutes with every flip
        calls.append(tuple(x.shape))
        return torch.cat([(x < 0.3).float(), (x >= 0.3).float() * (x < 0.7), (x >= 0.7).float()])

    result = flip_agreement(probs, image)
    assert result.dice == (1.0, 1.0) and result.mean_dice == 1.0 and result.disagreement == 0.0
    assert result.passes == len(calls) == len(IN_PLANE_FLIPS) == 4
    # a 3x3 mean filter in-plane against a constant 0.5 is flip-equivariant (symmetric kernel, zero padding)
    conv = torch.nn.Conv2d(1, 2, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(torch.stack([torch.zeros(1, 3, 3), torch.full((1, 3, 3), 1 / 9)]))
        conv.bias.copy_(torch.tensor([0.5, 0.0]))
        result = flip_agreement(lambda x: conv(x.movedim(-1, 0)).movedim(0, -1), image)
    assert result.mean_dice == 1.0 and result.disagreement == 0.0


def test_non_equivariant_function_agrees_less():
    image = torch.zeros(1, 8, 6)

    def probs(x):  # foreground on the first 3 rows, wherever the image is: not flip-equivariant along axis 0
        fg = torch.zeros(x.shape[1:])
        fg[:3] = 1
        return torch.stack([1 - fg, fg])

    result = flip_agreement(probs, image)
    # flipped back, the passes with axis 0 flipped label rows 5..7: rows 0..2 vs 5..7 share nothing
    # pairs: (id, f1) 0, (id, f0) 0, (id, f01) 0 ... passes id and f1 agree (1), f0 and f01 agree (1): 2 of 6 pairs
    assert result.dice[0] == pytest.approx(2 / 6)
    # disagreeing pairs label 6 rows of 8 differently: 4 pairs x 6/8 / 6 pairs
    assert result.disagreement == pytest.approx(4 * 0.75 / 6)
    assert 0 < result.mean_dice < 1


def test_absent_class_is_nan_and_excluded_from_the_mean():
    image = torch.rand(1, 6, 6, 3)
    result = flip_agreement(lambda x: one_hot_probs(torch.zeros(x.shape[1:], dtype=torch.long), 3), image)
    assert all(math.isnan(v) for v in result.dice) and math.isnan(result.mean_dice)
    assert result.passes == 4


def test_bad_arguments():
    image = torch.rand(1, 6, 6)
    with pytest.raises(ValueError, match="flips: axes \\(2,\\) are not spatial axes"):
        flip_agreement(lambda x: x, image, flips=[(), (2,)])
    with pytest.raises(ValueError, match="flips: need at least 2"):
        flip_agreement(lambda x: x, image, flips=[()])
    with pytest.raises(ValueError, match="probs: returned shape"):
        flip_agreement(lambda x: x[:, :3], image)
