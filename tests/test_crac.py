"""CRaC: PHR axioms, regions, the loss and the ALM outer step on hand-worked cases."""

from __future__ import annotations

import math

import pytest
import torch

from calib_monai.losses.crac import CRaCLoss, phr, phr_derivative
from calib_monai.losses.priors import boundary_mask

# a 1x3 image, two classes, labels [0, 0, 1]; with the image padded by background, 3x3 windows give
#   pixel 0: nine 0s            -> inner,    tau = (1, 0)
#   pixel 1: eight 0s and one 1 -> boundary, tau = (8/9, 1/9)
#   pixel 2: eight 0s and one 1 -> boundary, tau = (8/9, 1/9)
LABELS = torch.tensor([[[0, 0, 1]]])
ZERO_LOGITS = torch.zeros(1, 2, 1, 3)


def test_phr_axioms():
    z = torch.linspace(-3, 3, 61, dtype=torch.float64)
    lam, rho = torch.tensor(0.7, dtype=torch.float64), torch.tensor(0.4, dtype=torch.float64)
    # P'(0) = lambda and P' >= 0
    assert phr_derivative(torch.zeros((), dtype=torch.float64), rho, lam) == lam
    assert (phr_derivative(z, rho, lam) >= 0).all()
    # phr_derivative is the derivative of phr (autograd), including across the switch lam + rho z = 0
    zg = z.clone().requires_grad_(True)
    phr(zg, rho, lam).sum().backward()
    torch.testing.assert_close(zg.grad, phr_derivative(z, rho, lam))
    # P is continuous where the two branches meet: z* = -lam / rho
    z_star = -lam / rho
    left, right = phr(z_star - 1e-9, rho, lam), phr(z_star + 1e-9, rho, lam)
    assert float(left) == pytest.approx(float(right), abs=1e-7)
    # as rho grows, P' -> infinity for a violated constraint (z > 0) and -> 0 for a satisfied one (z < 0)
    rhos = torch.tensor([1.0, 1e2, 1e4, 1e6], dtype=torch.float64)
    violated = phr_derivative(torch.tensor(0.5, dtype=torch.float64), rhos, lam)
    satisfied = phr_derivative(torch.tensor(-0.5, dtype=torch.float64), rhos, lam)
    assert (violated.diff() > 0).all() and violated[-1] > 1e5
    assert satisfied[-1] == 0 and (satisfied.diff() <= 0).all()


def test_regions_on_a_hand_drawn_label_map():
    labels = torch.zeros(1, 7, 7, dtype=torch.int64)
    labels[0, 2:5, 2:5] = 1  # a 3x3 square
    # boundary: every pixel whose 3x3 window touches both the square and the background
    expected = torch.tensor(
        [
            [0, 0, 0, 0, 0, 0, 0],
            [0, 1, 1, 1, 1, 1, 0],
            [0, 1, 1, 1, 1, 1, 0],
            [0, 1, 1, 0, 1, 1, 0],
            [0, 1, 1, 1, 1, 1, 0],
            [0, 1, 1, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 0, 0],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(boundary_mask(labels, 3)[0, 0], expected)
    # a foreground pixel on the image border sees the background outside it
    full = torch.ones(1, 3, 3, dtype=torch.int64)
    assert boundary_mask(full, 3)[0, 0].tolist() == [[True, True, True], [True, False, True], [True, True, True]]
    # 3D: one voxel of class 2 inside class 1: its 3x3x3 neighbourhood is boundary, a voxel two away is inner
    vol = torch.ones(1, 7, 7, 7, dtype=torch.int64)
    vol[0, 3, 3, 3] = 2
    mask3d = boundary_mask(vol, 3)[0, 0]
    assert mask3d[2:5, 2:5, 2:5].all()
    assert not mask3d[1, 1, 1] and not mask3d[3, 3, 1]
    assert int(mask3d[1:6, 1:6, 1:6].sum()) == 27  # only the 27 voxels around the odd one, away from the border


def test_loss_value_hand_worked():
    loss = CRaCLoss(classes=2, dim=2, lambda_init=0.5, rho_init=0.1)
    # CE of zero logits: log 2. Penalty P(h) = 0.5 h + 0.05 h^2 with h = tau (logits 0):
    #   pixel 0: 0.55 and 0; pixels 1, 2: 0.5*8/9 + 0.05*64/81 = 0.4839506 and 0.5/9 + 0.05/81 = 0.0561728
    #   mean over 3 pixels x 2 classes = (0.55 + 2 * 0.5401234) / 6 = 0.2717078
    expected = math.log(2) + (0.55 + 2 * (0.5 * 8 / 9 + 0.05 * 64 / 81 + 0.5 / 9 + 0.05 / 81)) / 6
    assert float(loss(ZERO_LOGITS, LABELS.unsqueeze(1))) == pytest.approx(expected, rel=1e-6)
    # the authors' inner margin m = 5: pixel 0 is pulled towards logits (5, 0): P = 0.5*5 + 0.05*25 = 3.75
    margin = CRaCLoss(classes=2, dim=2, lambda_init=0.5, rho_init=0.1, inner_margin=5.0)
    expected_m = math.log(2) + (3.75 + 2 * (0.5 * 8 / 9 + 0.05 * 64 / 81 + 0.5 / 9 + 0.05 / 81)) / 6
    assert float(margin(ZERO_LOGITS, LABELS)) == pytest.approx(expected_m, rel=1e-6)


@pytest.mark.parametrize(
    "average, expected",
    [
        # P'(h) = 0.5 + 0.1 h. inner: k0 0.6 (1 pixel), k1 0.5; boundary: k0 0.5 + 0.1*8/9, k1 0.5 + 0.1/9 (2 pixels)
        ("region", [[0.6, 0.5 + 0.1 * 8 / 9], [0.5, 0.5 + 0.1 / 9]]),
        # the authors' code divides each region's sum by all 3 validation pixels
        ("all", [[0.6 / 3, 2 * (0.5 + 0.1 * 8 / 9) / 3], [0.5 / 3, 2 * (0.5 + 0.1 / 9) / 3]]),
    ],
)
def test_outer_update_hand_worked(average, expected):
    loss = CRaCLoss(classes=2, dim=2, lambda_init=0.5, rho_init=0.1, multiplier_average=average)
    stats = loss.validation_statistics(ZERO_LOGITS, LABELS)
    assert stats[2].tolist() == [[1, 2], [1, 2]]  # pixel counts per (class, region)
    result = loss.outer_update(stats, epoch=1)
    torch.testing.assert_close(loss.lambdas, torch.tensor(expected, dtype=torch.float64))
    # mean constraint per (k, r): inner h = (1, 0), boundary h = (8/9, 1/9)
    torch.testing.assert_close(result["constraint"], torch.tensor([[1.0, 8 / 9], [0.0, 1 / 9]], dtype=torch.float64))


def test_lambda_rises_on_a_violated_constraint_and_is_clamped():
    loss = CRaCLoss(classes=2, dim=2)  # lambda 1e-6
    far = torch.full((1, 2, 1, 3), 20.0)  # logits far from tau: h ~ 19-20
    loss.outer_update(loss.validation_statistics(far, LABELS), epoch=1)
    assert (loss.lambdas > 1.0).all()  # 1e-6 + 0.1 * ~19.5
    satisfied = CRaCLoss(classes=2, dim=2)
    tau_logits = torch.tensor([[[[1.0, 8 / 9, 8 / 9]], [[0.0, 1 / 9, 1 / 9]]]])
    satisfied.outer_update(satisfied.validation_statistics(tau_logits, LABELS), epoch=1)
    torch.testing.assert_close(satisfied.lambdas, torch.full((2, 2), 1e-6, dtype=torch.float64))  # floor 1e-6


def test_rho_grows_only_under_the_rule():
    loss = CRaCLoss(classes=2, dim=2, rho_interval=10)
    # the rho rule reads only the mean constraint (stats[1] / stats[2]), so the statistics can be computed once
    big = loss.validation_statistics(torch.full((1, 2, 1, 3), 10.0), LABELS)
    small = loss.validation_statistics(torch.full((1, 2, 1, 3), 2.0), LABELS)
    for epoch in range(1, 10):  # constraints do not improve, but no check before epoch 10
        loss.outer_update(big, epoch)
    torch.testing.assert_close(loss.rhos, torch.full((2, 2), 0.1, dtype=torch.float64))
    loss.outer_update(big, 10)  # no improvement at a check: rho * 1.2
    torch.testing.assert_close(loss.rhos, torch.full((2, 2), 0.12, dtype=torch.float64))
    for epoch in range(11, 20):
        loss.outer_update(big, epoch)
    loss.outer_update(small, 20)  # h fell below 0.9 x its previous value: unchanged
    torch.testing.assert_close(loss.rhos, torch.full((2, 2), 0.12, dtype=torch.float64))
    for epoch in range(21, 300):  # never improving again: rho grows every 10 epochs, up to rho_max = 10
        loss.outer_update(small, epoch)
    torch.testing.assert_close(loss.rhos, torch.full((2, 2), 10.0, dtype=torch.float64))


def test_multipliers_round_trip_through_state_dict():
    loss = CRaCLoss(classes=3, dim=2)
    logits = torch.randn(2, 3, 8, 8)
    labels = torch.zeros(2, 1, 8, 8, dtype=torch.int64)
    labels[:, :, 1:6, 1:6], labels[:, :, 4:8, 3:8] = 1, 2  # inner and boundary pixels of every class
    for epoch in range(1, 12):
        loss.outer_update(loss.validation_statistics(logits * epoch, labels), epoch)
    restored = CRaCLoss(classes=3, dim=2)
    restored.load_state_dict(loss.state_dict())
    for name in ("lambdas", "rhos", "previous_constraint", "outer_steps"):
        torch.testing.assert_close(getattr(restored, name), getattr(loss, name), rtol=0, atol=0, equal_nan=False)
    assert float(restored(logits, labels)) == float(loss(logits, labels))


def test_bad_arguments_name_what_was_wrong():
    with pytest.raises(ValueError, match="multiplier_average"):
        CRaCLoss(classes=2, multiplier_average="pixels")
    with pytest.raises(ValueError, match="rho_init"):
        CRaCLoss(classes=2, rho_init=20.0)
    with pytest.raises(ValueError, match="channels|classes|C"):
        CRaCLoss(classes=3)(torch.zeros(1, 2, 4, 4), torch.zeros(1, 4, 4))
