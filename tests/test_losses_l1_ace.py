"""HardL1ACELoss and SoftL1ACELoss: hand-worked values, the metric they optimise, gradients, soft -> hard, the
authors' code, bad arguments.

The tiny case of ``test_losses_values.py`` (B=1, C=2, 2x2), with 2 bins (0, .5] (.5, 1] (hard) or centres .25 and
.75 (soft):

    pixel   softmax (p0, p1)   label
    (0,0)   (3/4, 1/4)          0
    (0,1)   (1/4, 3/4)          1
    (1,0)   (1/2, 1/2)          1
    (1,1)   (3/4, 1/4)          1

``tests/data/l1_ace_reference.json`` holds seeded float32 inputs and what the authors' losses
(github.com/cai4cai/Average-Calibration-Losses, commit 5ad8418, ``src/losses/hardl1ace.py`` and ``softl1ace.py``)
return on them, values and gradients, computed once outside this repository (the file says how); their code is not
part of this repository.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from calib_monai.losses import CEDiceLoss, HardL1ACELoss, SoftL1ACELoss
from calib_monai.metrics import ml1ace, segmentation_calibration

LN3 = math.log(3.0)
LOGITS = torch.tensor([[[[LN3, 0.0], [0.0, LN3]], [[0.0, LN3], [0.0, 0.0]]]], dtype=torch.float64)
LABELS = torch.tensor([[[0, 1], [1, 1]]])
REFERENCE = json.loads((Path(__file__).parent / "data" / "l1_ace_reference.json").read_text())


def term_only(cls, **kw):
    """The mL1-ACE term alone (no Dice, no CE)."""
    return cls(lambda_dice=0.0, lambda_ce=0.0, **kw)


# ---------------------------------------------------------------------------------------------- hand-worked values

# hard, 2 bins; p = 1/2 is on the edge and goes to the lower bin
# class 0: bin 0 {1/4, 1/2; no hit} |3/8 - 0| = 3/8; bin 1 {3/4 hit, 3/4} |3/4 - 1/2| = 1/4   -> (3/8 + 1/4) / 2 = 5/16
# class 1: bin 0 {1/4, 1/2 hit, 1/4 hit} |1/3 - 2/3| = 1/3; bin 1 {3/4 hit} |3/4 - 1| = 1/4 -> (1/3 + 1/4) / 2 = 7/24
HARD_TINY = (5 / 16 + 7 / 24) / 2  # 29/96; CECE weights bins by voxels: (5/16 + (3 * 1/3 + 1/4) / 4) / 2 = 5/16
# soft, centres 1/4 and 3/4: 1/4 and 3/4 sit on a centre (weight 1), 1/2 halfway (1/2 to each bin)
# class 0: bin 0 {1/4: 1, 1/2: 1/2}: count 3/2, mean p (1/4 + 1/4) / (3/2) = 1/3, no hit -> 1/3
#          bin 1 {3/4 hit: 1, 1/2: 1/2, 3/4: 1}: count 5/2, mean p 7/4 / (5/2) = 7/10, hits 1 / (5/2) = 2/5 -> 3/10
# class 1: bin 0 {1/4: 1, 1/2 hit: 1/2, 1/4 hit: 1}: mean p 3/4 / (5/2) = 3/10, hits 3/2 / (5/2) = 3/5 -> 3/10
#          bin 1 {3/4 hit: 1, 1/2 hit: 1/2}: mean p 1 / (3/2) = 2/3, hits 1 -> 1/3
SOFT_TINY = (1 / 3 + 3 / 10) / 2  # both classes: 19/60


def test_hard_hand_worked_term_and_total():
    assert term_only(HardL1ACELoss, num_bins=2)(LOGITS, LABELS).item() == pytest.approx(29 / 96, abs=1e-12)
    assert HARD_TINY == pytest.approx(29 / 96)
    # the total: CE + Dice (squared probabilities, smooth_nr 0, smooth_dr 1e-5) + mL1-ACE, all weights 1
    ce = (2 * math.log(4 / 3) + math.log(2) + math.log(4)) / 4
    dice0 = 1 - 2 * (3 / 4) / (23 / 16 + 1 + 1e-5)  # sum p0^2 = (9 + 1 + 4 + 9) / 16, one voxel of class 0
    dice1 = 1 - 2 * (3 / 2) / (15 / 16 + 3 + 1e-5)  # sum p1^2 = (1 + 9 + 4 + 1) / 16, three voxels of class 1
    expected = ce + (dice0 + dice1) / 2 + HARD_TINY
    assert HardL1ACELoss(num_bins=2)(LOGITS, LABELS).item() == pytest.approx(expected, abs=1e-12)
    paper_dice_ce = CEDiceLoss(smooth_nr=0.0, squared_pred=True)(LOGITS, LABELS).item()
    assert paper_dice_ce == pytest.approx(ce + (dice0 + dice1) / 2, abs=1e-12)
    # the weights scale the terms
    weighted = HardL1ACELoss(num_bins=2, lambda_ace=0.5, lambda_dice=2.0, lambda_ce=0.25)(LOGITS, LABELS).item()
    assert weighted == pytest.approx(0.25 * ce + 2.0 * (dice0 + dice1) / 2 + 0.5 * HARD_TINY, abs=1e-12)


def test_soft_hand_worked():
    assert term_only(SoftL1ACELoss, num_bins=2)(LOGITS, LABELS).item() == pytest.approx(SOFT_TINY, abs=1e-12)
    # with empty_weight above 3/2 only the bins of summed weight 5/2 count: class 0 bin 1, class 1 bin 0
    strict = term_only(SoftL1ACELoss, num_bins=2, empty_weight=2.0)(LOGITS, LABELS).item()
    assert strict == pytest.approx((3 / 10 + 3 / 10) / 2, abs=1e-12)


def test_empty_classes_hand_worked():
    # image A: the tiny case; image B: the same logits, every label 0 (class 1 absent)
    # B: class 0 bin 0 {1/4, 1/2; all hits} |3/8 - 1| = 5/8, bin 1 {3/4, 3/4} 1/4 -> 7/16
    #    class 1 bin 0 {1/4, 1/2, 1/4; no hit} 1/3, bin 1 {3/4} 3/4 -> 13/24
    logits, labels = LOGITS.repeat(2, 1, 1, 1), torch.stack([LABELS[0], torch.zeros_like(LABELS[0])])
    a0, a1, b0, b1 = 5 / 16, 7 / 24, 7 / 16, 13 / 24
    expected = {
        # the authors' ignore_empty_classes=True: B's class 1 counts as 0 in the mean over the 4 (image, class) pairs
        ("zero", True): (a0 + a1 + b0) / 4,
        ("exclude", True): (a0 + a1 + b0) / 3,
        ("include", True): (a0 + a1 + b0 + b1) / 4,
        ("zero", False): a1 / 2,
        ("exclude", False): a1,
        ("include", False): (a1 + b1) / 2,
    }
    for (mode, background), value in expected.items():
        loss = term_only(HardL1ACELoss, num_bins=2, empty_classes=mode, include_background=background)
        assert loss(logits, labels).item() == pytest.approx(value, abs=1e-12), (mode, background)
    ace, present = term_only(HardL1ACELoss, num_bins=2).per_image_class(logits, labels)
    torch.testing.assert_close(ace, torch.tensor([[a0, a1], [b0, b1]], dtype=torch.float64))
    assert present.tolist() == [[True, True], [True, False]]


def test_a_batch_with_no_foreground_and_no_background_class_is_zero_not_nan():
    loss = term_only(SoftL1ACELoss, include_background=False, empty_classes="exclude")
    logits = torch.randn(2, 3, 4, 4, requires_grad=True)
    value = loss(logits, torch.zeros(2, 4, 4, dtype=torch.long))
    value.backward()
    assert value.item() == 0.0 and torch.isfinite(logits.grad).all()


# ---------------------------------------------------------------------------------------- the metric it optimises


def _random(seed: int, shape=(3, 4, 9, 7), dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(shape, generator=gen, dtype=dtype)
    labels = torch.randint(0, shape[1], (shape[0], 1, *shape[2:]), generator=gen)
    return logits, labels


@pytest.mark.parametrize("num_bins", [15, 20])
@pytest.mark.parametrize("include_background", [True, False])
@pytest.mark.parametrize("shape", [(3, 4, 9, 7), (2, 3, 6, 5, 4)])
def test_hard_term_equals_the_ml1ace_metric_of_each_image(num_bins, include_background, shape):
    logits, labels = _random(num_bins + len(shape), shape)
    labels[0][labels[0] == 2] = 1  # class 2 absent from image 0
    probs = torch.softmax(logits, dim=1)
    kw = {"num_bins": num_bins, "include_background": include_background}
    # every class scored, as the metric does: the mean over images of the per-image metric on all voxels
    term = term_only(HardL1ACELoss, empty_classes="include", **kw)(logits, labels)
    metric = segmentation_calibration(probs, labels, "ml1ace", num_bins, "all", "mean", include_background)
    assert term.item() == pytest.approx(metric, rel=1e-12, abs=1e-15)
    # each image alone, whatever the empty-class rule, when all its classes are present
    for b in range(1, shape[0]):
        for mode in ("zero", "exclude"):
            value = term_only(HardL1ACELoss, empty_classes=mode, **kw)(logits[b : b + 1], labels[b : b + 1])
            single = ml1ace(probs[b : b + 1], labels[b : b + 1], num_bins, "all", include_background)
            assert value.item() == pytest.approx(single, rel=1e-12, abs=1e-15)
    # float32 logits: the same up to float32 sums
    term32 = term_only(HardL1ACELoss, empty_classes="include", **kw)(logits.float(), labels)
    assert term32.item() == pytest.approx(metric, abs=1e-6)


# ------------------------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("cls", [HardL1ACELoss, SoftL1ACELoss])
def test_gradients_reach_the_logits_and_match_finite_differences(cls):
    logits, labels = _random(7, (2, 3, 5, 4))
    logits.requires_grad_(True)
    for loss in (term_only(cls, num_bins=5), cls(num_bins=5)):
        loss(logits, labels).backward()
        assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
        logits.grad = None
    # analytic = numerical derivative (random values sit away from the bin edges, centres and |.| kinks)
    assert torch.autograd.gradcheck(lambda x: term_only(cls, num_bins=5)(x, labels), (logits,), eps=1e-7)


def test_soft_gradient_flows_through_the_bin_assignment():
    class FrozenAssignment(SoftL1ACELoss):
        def memberships(self, p):
            return [(index, weight.detach()) for index, weight in super().memberships(p)]

    logits, labels = _random(8, (2, 3, 6, 5))
    grads = []
    for cls in (SoftL1ACELoss, FrozenAssignment):
        x = logits.clone().requires_grad_(True)
        term = term_only(cls)(x, labels)
        term.backward()
        grads.append((term.item(), x.grad))
    assert grads[0][0] == grads[1][0]  # same value ...
    assert (grads[0][1] - grads[1][1]).abs().max() > 1e-3  # ... but the weights' own derivative is part of the gradient


def test_hard_gradient_is_the_gradient_of_the_bin_means_only():
    # inside one bin assignment the hard loss is smooth: a step small enough to keep every bin gives the same
    # first-order change as the gradient predicts
    logits, labels = _random(9, (1, 3, 6, 5))
    x = logits.clone().requires_grad_(True)
    loss = term_only(HardL1ACELoss)
    value = loss(x, labels)
    (grad,) = torch.autograd.grad(value, x)
    step = 1e-7 * torch.randn_like(logits)
    assert (loss(logits + step, labels) - value).item() == pytest.approx((grad * step).sum().item(), rel=1e-4)


# ------------------------------------------------------------------------------------------------------- soft -> hard


def test_soft_equals_hard_when_every_probability_is_on_a_bin_centre_and_tends_to_it():
    # two classes, M = 20: centres (2b + 1) / 40; p1 on centres, p0 = 1 - p1 on centres too
    gen = torch.Generator().manual_seed(10)
    centres = (2 * torch.randint(0, 20, (2, 1, 8, 6), generator=gen) + 1).double() / 40
    labels = torch.randint(0, 2, (2, 8, 6), generator=gen)
    noise = torch.rand(centres.shape, generator=gen, dtype=torch.float64) - 0.5

    def gap(delta: float) -> float:
        p1 = centres + delta * noise / 20  # within delta / 40 of the centre
        logits = torch.cat([torch.log1p(-p1), torch.log(p1)], dim=1)
        soft, hard = term_only(SoftL1ACELoss)(logits, labels), term_only(HardL1ACELoss)(logits, labels)
        return abs(soft.item() - hard.item())

    assert gap(0.0) < 1e-12
    gaps = [gap(d) for d in (0.5, 0.05, 0.005, 0.0005)]
    # the gap shrinks with the distance to the centres (here about linearly: 0.04 at 0.5, 7e-5 at 0.0005)
    assert gaps[0] > 1e-2 and all(b < a for a, b in zip(gaps, gaps[1:])) and gaps[-1] < 2e-4


# ------------------------------------------------------------------------------------------- the authors' code


def _ours(kind: str, settings: dict):
    kw = {"num_bins": settings.get("num_bins", 20), "include_background": settings.get("include_background", True)}
    cls = HardL1ACELoss if kind.startswith("hard") else SoftL1ACELoss
    if kind.endswith("dice_ce"):  # the authors' *andDiceCELoss with weights 0.33
        return cls(lambda_ace=0.33, lambda_dice=0.33, lambda_ce=0.33, **kw)
    if kind == "soft_empty_weight_0.5":
        return term_only(cls, empty_weight=0.5, **kw)
    return term_only(cls, empty_classes=kind.split("_")[1], **kw)


KINDS = (
    "hard_zero",
    "hard_include",
    "soft_zero",
    "soft_include",
    "soft_empty_weight_0.5",
    "hard_dice_ce",
    "soft_dice_ce",
)


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=[c["name"] for c in REFERENCE["cases"]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_to_the_authors_code_on_the_same_inputs(case, dtype):
    logits = torch.tensor(case["logits"], dtype=dtype).view(case["logits_shape"])
    labels = torch.tensor(case["labels"]).view(case["labels_shape"])
    for kind in KINDS:
        expected = case[kind]
        x = logits.clone().requires_grad_(True)
        value = _ours(kind, case["settings"])(x, labels)
        # their float32 arithmetic, and their bin edges / centres scaled by (1 + eps32): see the class docstrings
        assert value.item() == pytest.approx(expected["value"], abs=3e-7), kind
        if "grad" in expected:
            value.backward()
            reference = torch.tensor(expected["grad"], dtype=torch.float64).view(logits.shape)
            torch.testing.assert_close(x.grad.double(), reference, rtol=0, atol=5e-6, msg=kind)


# ---------------------------------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "factory, expected",
    [
        (lambda: HardL1ACELoss(num_bins=0), r"num_bins must be an integer >= 1, got 0"),
        (lambda: SoftL1ACELoss(num_bins=2.5), r"num_bins must be an integer >= 1, got 2.5"),
        (lambda: HardL1ACELoss(num_bins=True), r"num_bins must be an integer >= 1, got True"),
        (lambda: HardL1ACELoss(lambda_ace=-0.1), r"lambda_ace must be a finite number >= 0, got -0.1"),
        (lambda: SoftL1ACELoss(lambda_ace=float("nan")), r"lambda_ace must be a finite number >= 0, got nan"),
        (lambda: HardL1ACELoss(lambda_dice=float("inf")), r"lambda_dice must be a finite number >= 0, got inf"),
        (lambda: SoftL1ACELoss(lambda_ce="1"), r"lambda_ce must be a finite number >= 0, got '1'"),
        (lambda: SoftL1ACELoss(empty_weight=-0.01), r"empty_weight must be a finite number >= 0, got -0.01"),
        (lambda: HardL1ACELoss(empty_classes="ignore"), r"empty_classes must be one of .*'ignore'"),
        (lambda: HardL1ACELoss(lambda_ace=0, lambda_dice=0, lambda_ce=0), r"all 0: at least one must be > 0"),
    ],
)
def test_bad_arguments_raise_value_error(factory, expected):
    with pytest.raises(ValueError, match=expected):
        factory()


def test_zero_ace_weight_is_the_paper_dice_ce():
    logits, labels = _random(11, (2, 3, 5, 4))
    dice_ce = CEDiceLoss(smooth_nr=0.0, squared_pred=True)(logits, labels)
    assert HardL1ACELoss(lambda_ace=0.0)(logits, labels).item() == pytest.approx(dice_ce.item(), abs=1e-12)
