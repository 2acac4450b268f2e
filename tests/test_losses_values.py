"""Hand-worked values of every loss on a 1x2x2x2 case, and equality with MONAI / torch where definitions match.

The shared tiny case: logits (B=1, C=2, 2x2) chosen so the softmax is rational,

    pixel   logits (l0, l1)   softmax (p0, p1)   label
    (0,0)   (ln 3, 0)         (3/4, 1/4)          0
    (0,1)   (0, ln 3)         (1/4, 3/4)          1
    (1,0)   (0, 0)            (1/2, 1/2)          1
    (1,1)   (ln 3, 0)         (3/4, 1/4)          1

so the target-class probabilities are p_t = 3/4, 3/4, 1/2, 1/4.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from monai.losses import FocalLoss as MonaiFocalLoss
from monai.losses import NACLLoss as MonaiNACLLoss

from calib_monai.losses import (
    CEDiceLoss,
    ECPLoss,
    FocalLoss,
    LabelSmoothingLoss,
    MbLSLoss,
    NACLLoss,
    SVLSLoss,
    svls_kernel,
)

LN3 = math.log(3.0)
LOGITS = torch.tensor([[[[LN3, 0.0], [0.0, LN3]], [[0.0, LN3], [0.0, 0.0]]]])
LABELS = torch.tensor([[[0, 1], [1, 1]]])
P_T = [3 / 4, 3 / 4, 1 / 2, 1 / 4]
P = [(3 / 4, 1 / 4), (1 / 4, 3 / 4), (1 / 2, 1 / 2), (3 / 4, 1 / 4)]  # (p0, p1) per pixel, row-major
L = [(LN3, 0.0), (0.0, LN3), (0.0, 0.0), (LN3, 0.0)]  # (l0, l1) per pixel
Y = [0, 1, 1, 1]
CE = sum(-math.log(p) for p in P_T) / 4  # (2 ln 4/3 + ln 2 + ln 4) / 4


def test_tiny_case_is_what_the_docstring_says() -> None:
    assert torch.allclose(F.softmax(LOGITS, 1)[0].permute(1, 2, 0).reshape(4, 2), torch.tensor(P), atol=1e-7)
    assert F.cross_entropy(LOGITS, LABELS).item() == pytest.approx(CE, abs=1e-6)


def test_ce_dice_hand_worked() -> None:
    # Dice per class, s = 1e-5: class 0: I = 3/4, sum p = 9/4, |y| = 1; class 1: I = 3/2, sum p = 7/4, |y| = 3
    s = 1e-5
    dice0 = 1 - (2 * 0.75 + s) / (9 / 4 + 1 + s)
    dice1 = 1 - (2 * 1.5 + s) / (7 / 4 + 3 + s)
    assert CEDiceLoss()(LOGITS, LABELS).item() == pytest.approx(CE + (dice0 + dice1) / 2, abs=1e-6)
    no_bg = CEDiceLoss(include_background=False)(LOGITS, LABELS.unsqueeze(1))
    assert no_bg.item() == pytest.approx(CE + dice1, abs=1e-6)


def test_focal_hand_worked_and_relation_to_monai() -> None:
    # mean of -(1 - p_t)^3 ln p_t
    expected = sum(-((1 - p) ** 3) * math.log(p) for p in P_T) / 4
    assert FocalLoss()(LOGITS, LABELS).item() == pytest.approx(expected, abs=1e-6)
    assert FocalLoss(gamma=0.0)(LOGITS, LABELS).item() == pytest.approx(CE, abs=1e-6)
    # MONAI's softmax focal loss with reduction="mean" also averages over the C classes
    monai_mean = MonaiFocalLoss(to_onehot_y=True, use_softmax=True, gamma=3.0)(LOGITS, LABELS.unsqueeze(1))
    assert monai_mean.item() == pytest.approx(expected / 2, abs=1e-6)
    # and MONAI's default is the sigmoid focal loss, a different quantity
    monai_sigmoid = MonaiFocalLoss(to_onehot_y=True, gamma=3.0)(LOGITS, LABELS.unsqueeze(1))
    assert abs(monai_sigmoid.item() - expected) > 1e-3 and abs(monai_sigmoid.item() - expected / 2) > 1e-3


def test_focal_random_equals_formula() -> None:
    logits = torch.randn(2, 4, 5, 3, 2, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 4, (2, 1, 5, 3, 2), generator=torch.Generator().manual_seed(1))
    log_pt = F.log_softmax(logits, 1).gather(1, labels)
    expected = (-((1 - log_pt.exp()) ** 3) * log_pt).mean()
    assert torch.allclose(FocalLoss()(logits, labels), expected, atol=1e-6)


def test_ecp_hand_worked() -> None:
    entropy = [-(a * math.log(a) + b * math.log(b)) for a, b in P]
    mean_h = sum(entropy) / 4
    # default: entropy averaged over the C = 2 classes (authors' code); "sum": Shannon entropy (Pereyra et al.)
    assert ECPLoss()(LOGITS, LABELS).item() == pytest.approx(CE - 0.1 * mean_h / 2, abs=1e-6)
    assert ECPLoss(class_reduction="sum")(LOGITS, LABELS).item() == pytest.approx(CE - 0.1 * mean_h, abs=1e-6)


def test_label_smoothing_hand_worked_and_equals_torch() -> None:
    # target (0.95, 0.05) on the label / other class
    expected = sum(-(0.95 * math.log(p[y]) + 0.05 * math.log(p[1 - y])) for p, y in zip(P, Y)) / 4
    assert LabelSmoothingLoss()(LOGITS, LABELS).item() == pytest.approx(expected, abs=1e-6)
    logits = torch.randn(2, 5, 4, 6, generator=torch.Generator().manual_seed(2))
    labels = torch.randint(0, 5, (2, 4, 6), generator=torch.Generator().manual_seed(3))
    torch_ls = F.cross_entropy(logits, labels, label_smoothing=0.3)
    assert torch.allclose(LabelSmoothingLoss(alpha=0.3)(logits, labels), torch_ls, atol=1e-6)


def test_svls_hand_worked() -> None:
    # 2x2 image, 3x3 SVLS kernel, replicate padding: each pixel's window covers itself with weight
    # 1/2 + 2e + c, its row and column neighbours with e + c each, its diagonal neighbour with c
    # (e, c: edge and corner weights). Only pixel (0,0) is class 0, so q0 per pixel is
    # (0,0): 1/2 + 2e + c, (0,1) and (1,0): e + c, (1,1): c.
    g1, g2 = math.exp(-0.5), math.exp(-1.0)
    e, c = 0.5 * g1 / (4 * g1 + 4 * g2), 0.5 * g2 / (4 * g1 + 4 * g2)
    q0 = [0.5 + 2 * e + c, e + c, e + c, c]
    expected = sum(-(q * math.log(p[0]) + (1 - q) * math.log(p[1])) for q, p in zip(q0, P)) / 4
    assert SVLSLoss()(LOGITS, LABELS).item() == pytest.approx(expected, abs=1e-6)


def test_svls_3d_and_k5_equal_direct_sum() -> None:
    """Soft target built voxel by voxel with clamped (replicate) indices, 3D k=3 and 2D k=5."""
    for spatial, k in [((3, 4, 2), 3), ((4, 6), 5)]:
        dim = len(spatial)
        gen = torch.Generator().manual_seed(k)
        logits = torch.randn(1, 3, *spatial, generator=gen)
        labels = torch.randint(0, 3, (1, *spatial), generator=gen)
        w = svls_kernel(k, dim, 1.0)
        r = k // 2
        target = torch.zeros(1, 3, *spatial)
        for centre in torch.cartesian_prod(*[torch.arange(s) for s in spatial]).reshape(-1, dim).tolist():
            for offset in torch.cartesian_prod(*[torch.arange(-r, r + 1)] * dim).reshape(-1, dim).tolist():
                src = [min(max(a + o, 0), s - 1) for a, o, s in zip(centre, offset, spatial)]
                target[(0, int(labels[(0, *src)]), *centre)] += w[tuple(o + r for o in offset)]
        expected = -(target * F.log_softmax(logits, 1)).sum(1).mean()
        assert torch.allclose(SVLSLoss(kernel_size=k)(logits, labels), expected, atol=1e-6)


def test_mbls_hand_worked() -> None:
    # distances max_j l_j - l_c: (0, ln3), (ln3, 0), (0, 0), (0, ln3): three of the eight equal ln 3
    m = 0.5
    assert MbLSLoss(margin=m)(LOGITS, LABELS).item() == pytest.approx(CE + 0.1 * 3 * (LN3 - m) / 8, abs=1e-6)
    l2 = MbLSLoss(margin=m, penalty="l2")(LOGITS, LABELS).item()
    assert l2 == pytest.approx(CE + 0.1 * 3 * (LN3 - m) ** 2 / 8, abs=1e-6)
    # distances below the margin cost nothing (the reference code's two-sided square would add 0.1 * 5 m^2 / 8)
    assert MbLSLoss(margin=10.0, penalty="l2")(LOGITS, LABELS).item() == pytest.approx(CE, abs=1e-6)


def test_nacl_hand_worked() -> None:
    # 3x3 mean prior. Every pixel's window holds the whole 2x2 image plus 5 outside voxels.
    # border="background": outside counts as class 0, tau = (1 + 5, 3) / 9 = (2/3, 1/3) everywhere.
    # border="zeros" (MONAI): outside counts for nothing, tau = (1/9, 3/9) everywhere.
    def penalty(tau, values, power=1):
        return sum(abs(v[0] - tau[0]) ** power + abs(v[1] - tau[1]) ** power for v in values) / 8

    bg, zeros = (2 / 3, 1 / 3), (1 / 9, 3 / 9)
    assert NACLLoss(2, 2)(LOGITS, LABELS).item() == pytest.approx(CE + 0.1 * penalty(bg, L), abs=1e-6)
    with_zeros = NACLLoss(2, 2, border="zeros")(LOGITS, LABELS).item()
    assert with_zeros == pytest.approx(CE + 0.1 * penalty(zeros, L), abs=1e-6)
    l2 = NACLLoss(2, 2, distance_type="l2")(LOGITS, LABELS).item()
    assert l2 == pytest.approx(CE + 0.1 * penalty(bg, L, 2), abs=1e-6)
    # the paper's sum over classes doubles the penalty of the mean (C = 2)
    summed = NACLLoss(2, 2, class_reduction="sum")(LOGITS, LABELS).item()
    assert summed == pytest.approx(CE + 0.2 * penalty(bg, L), abs=1e-6)
    # constraint on the softmax instead of the logits
    soft = NACLLoss(2, 2, space="softmax")(LOGITS, LABELS).item()
    assert soft == pytest.approx(CE + 0.1 * penalty(bg, P), abs=1e-6)
    # max prior: every window holds classes {0, 1} -> tau = (0, 1); min prior: (1, 0)
    assert NACLLoss(2, 2, kernel_ops="max")(LOGITS, LABELS).item() == pytest.approx(
        CE + 0.1 * penalty((0, 1), L), abs=1e-6
    )
    assert NACLLoss(2, 2, kernel_ops="min")(LOGITS, LABELS).item() == pytest.approx(
        CE + 0.1 * penalty((1, 0), L), abs=1e-6
    )


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("kernel_ops", ["mean", "gaussian"])
@pytest.mark.parametrize("distance_type", ["l1", "l2"])
def test_nacl_equals_monai_with_zeros_border(dim: int, kernel_ops: str, distance_type: str) -> None:
    gen = torch.Generator().manual_seed(dim)
    spatial = (9, 7) if dim == 2 else (6, 5, 4)
    logits = 2 * torch.randn(3, 4, *spatial, generator=gen)
    labels = torch.randint(0, 4, (3, *spatial), generator=gen)
    kwargs = dict(classes=4, dim=dim, kernel_ops=kernel_ops, distance_type=distance_type, alpha=0.3, sigma=1.5)
    monai_value = MonaiNACLLoss(**kwargs)(logits, labels)
    ours = NACLLoss(**kwargs, border="zeros")(logits, labels.unsqueeze(1).float())
    assert abs(ours.item() - monai_value.item()) < 1e-6
    # the default border (outside = background) differs from MONAI: the prior changes on border voxels
    assert abs(NACLLoss(**kwargs)(logits, labels).item() - monai_value.item()) > 1e-4


def test_nacl_border_difference_is_confined_to_border_voxels() -> None:
    logits = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    labels = torch.randint(0, 3, (2, 8, 8), generator=torch.Generator().manual_seed(5))
    bg = NACLLoss(3, 2, reduction="none")(logits, labels)
    zeros = NACLLoss(3, 2, border="zeros", reduction="none")(logits, labels)
    interior = (slice(None), slice(None), slice(1, -1), slice(1, -1))
    assert torch.allclose(bg[interior], zeros[interior], atol=1e-7)
    assert not torch.allclose(bg, zeros, atol=1e-4)


@pytest.mark.parametrize("gamma", [0.0, 2.0, 3.0])
def test_focal_equals_monai_softmax_focal_summed_over_classes(gamma: float) -> None:
    logits = 3 * torch.randn(2, 3, 6, 5, generator=torch.Generator().manual_seed(7))
    labels = torch.randint(0, 3, (2, 1, 6, 5), generator=torch.Generator().manual_seed(8))
    monai_map = MonaiFocalLoss(to_onehot_y=True, use_softmax=True, gamma=gamma, reduction="none")(logits, labels)
    assert torch.allclose(FocalLoss(gamma=gamma)(logits, labels), monai_map.sum(1).mean(), atol=1e-6)
