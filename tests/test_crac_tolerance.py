"""CRaC with a tolerance (g = |tau - l| - eps <= 0), the named presets and the satisfied-pixel statistics."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from calib_monai.losses.crac import PRESETS, CRaCLoss, phr_derivative
from calib_monai.losses.priors import boundary_mask, class_proportion_prior
from conftest import REPO_ROOT

# as in test_crac.py: a 1x3 image, labels [0, 0, 1]; pixel 0 inner, tau = (1, 0); pixels 1, 2 boundary,
# tau = (8/9, 1/9)
LABELS = torch.tensor([[[0, 0, 1]]])
TAU_LOGITS = torch.tensor([[[[1.0, 8 / 9, 8 / 9]], [[0.0, 1 / 9, 1 / 9]]]], dtype=torch.float64)
F64 = dict(dtype=torch.float64)


def _todays_loss(loss: CRaCLoss, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The forward pass before the tolerance existed, written out: CE + mean(lam h + rho h^2 / 2)."""
    tau = class_proportion_prior(labels, loss.classes, 3, "mean", "background", dtype=logits.dtype)
    boundary = boundary_mask(labels, 3, "background")
    if loss.inner_margin != 1.0:
        tau = torch.where(boundary, tau, loss.inner_margin * tau)
    h = (tau - logits).abs()
    shape = (1, loss.classes, 1, 1)
    lam, rho = (
        torch.where(boundary, t[:, 1].to(logits.dtype).reshape(shape), t[:, 0].to(logits.dtype).reshape(shape))
        for t in (loss.lambdas, loss.rhos)
    )
    return F.cross_entropy(logits, labels) + (lam * h + 0.5 * rho * h * h).mean()


def _todays_lambdas(loss: CRaCLoss, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The outer update before the tolerance existed: clamp(mean over the region of lam + rho h, 1e-6, 1e6)."""
    h, boundary = loss.constraints(logits.double(), labels)
    out = torch.empty(loss.classes, 2, **F64)
    for r, mask in enumerate((~boundary, boundary)):
        grad = loss.lambdas[:, r].reshape(1, -1, 1, 1) + loss.rhos[:, r].reshape(1, -1, 1, 1) * h
        out[:, r] = ((grad * mask).sum(dim=(0, 2, 3)) / mask.sum()).clamp(1e-6, 1e6)
    return out


def test_satisfied_pixel_sits_on_the_inactive_branch_with_zero_derivative():
    eps, lam, rho = 0.5, 0.2, 1.0
    loss = CRaCLoss(classes=2, dim=2, lambda_init=lam, rho_init=rho, tolerance=eps)
    # logits tau + 0.1 everywhere: h = 0.1 < eps - lam / rho = 0.3, so g = -0.4 and lam + rho g = -0.2 < 0
    logits = (TAU_LOGITS + 0.1).requires_grad_(True)
    value = loss(logits, LABELS)
    # every one of the 6 terms is -lam^2 / (2 rho) = -0.02; CE of the logits is added as usual
    ce = F.cross_entropy(logits.detach(), LABELS)
    assert float(value.detach()) == pytest.approx(float(ce) - lam * lam / (2 * rho), rel=1e-12)
    # no gradient from the penalty: the gradient is CE's alone
    value.backward()
    ce_logits = logits.detach().clone().requires_grad_(True)
    F.cross_entropy(ce_logits, LABELS).backward()
    torch.testing.assert_close(logits.grad, ce_logits.grad)
    # P'(g) = 0 at every pixel: the statistics' P' sum is 0, and every pixel counts as satisfied
    stats = loss.validation_statistics(logits.detach(), LABELS)
    assert stats[0].abs().max() == 0
    torch.testing.assert_close(stats[3], stats[2])
    assert (
        float(phr_derivative(torch.tensor(0.1 - eps, **F64), torch.tensor(rho, **F64), torch.tensor(lam, **F64))) == 0
    )


def test_penalty_between_eps_minus_lam_over_rho_and_eps_is_on_the_active_branch():
    eps, lam, rho = 0.5, 0.2, 1.0
    loss = CRaCLoss(classes=2, dim=2, lambda_init=lam, rho_init=rho, tolerance=eps)
    logits = TAU_LOGITS + 0.4  # h = 0.4: g = -0.1, lam + rho g = 0.1 >= 0: P = lam g + rho g^2 / 2 = -0.015
    ce = F.cross_entropy(logits, LABELS)
    assert float(loss(logits, LABELS)) == pytest.approx(float(ce) + (-0.02 + 0.005), rel=1e-12)


def test_outer_update_lowers_lambda_where_constraints_hold_and_raises_it_where_violated():
    eps, lam, rho = 0.5, 0.2, 1.0
    # all hold (h = 0.3 < eps): P'(g) = max(0.2 - 0.2, 0) = 0 -> the floor lambda_min
    holds = CRaCLoss(classes=2, dim=2, lambda_init=lam, rho_init=rho, tolerance=eps)
    result = holds.outer_update(holds.validation_statistics(TAU_LOGITS + 0.3, LABELS), epoch=1)
    torch.testing.assert_close(holds.lambdas, torch.full((2, 2), 1e-6, **F64))
    torch.testing.assert_close(result["satisfied"], torch.ones(2, 2, **F64))
    # all hold with a smaller margin (h = 0.45): P' = 0.2 - 0.05 = 0.15 < 0.2, lambda falls but not to 0
    near = CRaCLoss(classes=2, dim=2, lambda_init=lam, rho_init=rho, tolerance=eps)
    near.outer_update(near.validation_statistics(TAU_LOGITS + 0.45, LABELS), epoch=1)
    torch.testing.assert_close(near.lambdas, torch.full((2, 2), 0.15, **F64))
    # all violated (h = 1): P' = 0.2 + 0.5 = 0.7 > 0.2
    violated = CRaCLoss(classes=2, dim=2, lambda_init=lam, rho_init=rho, tolerance=eps)
    result = violated.outer_update(violated.validation_statistics(TAU_LOGITS + 1.0, LABELS), epoch=1)
    torch.testing.assert_close(violated.lambdas, torch.full((2, 2), 0.7, **F64))
    torch.testing.assert_close(result["satisfied"], torch.zeros(2, 2, **F64))
    # without a tolerance the same "satisfied" logits raise lambda: P'(h) = 0.2 + 0.3 > 0.2
    paper = CRaCLoss(classes=2, dim=2, lambda_init=lam, rho_init=rho)
    paper.outer_update(paper.validation_statistics(TAU_LOGITS + 0.3, LABELS), epoch=1)
    torch.testing.assert_close(paper.lambdas, torch.full((2, 2), 0.5, **F64))


def test_tolerance_zero_gives_todays_loss_and_multipliers_exactly():
    torch.manual_seed(0)
    labels = torch.zeros(2, 1, 9, 9, dtype=torch.int64)
    labels[:, :, 1:6, 1:6], labels[:, :, 4:9, 3:9] = 1, 2
    for margin in (1.0, 5.0):
        loss = CRaCLoss(classes=3, dim=2, inner_margin=margin, lambda_init=0.3, rho_init=0.2, tolerance=0.0)
        for epoch in range(1, 4):
            logits = 3 * torch.randn(2, 3, 9, 9)
            assert torch.equal(loss(logits, labels), _todays_loss(loss, logits, labels[:, 0]))
            expected = _todays_lambdas(loss, logits, labels[:, 0])
            loss.outer_update(loss.validation_statistics(logits, labels), epoch)
            torch.testing.assert_close(loss.lambdas, expected, rtol=1e-15, atol=0)


def test_presets_give_the_documented_settings():
    paper, authors, tol = (CRaCLoss.preset(name, classes=3, dim=2) for name in ("paper", "authors", "tolerance"))
    default = CRaCLoss(classes=3, dim=2)
    attrs = (
        "inner_margin",
        "multiplier_average",
        "tolerance",
        "rho_init",
        "clamp_per_pixel",
        "lambda_min",
        "lambda_max",
    )
    for attr in attrs:
        assert getattr(paper, attr) == getattr(default, attr)  # "paper" is today's defaults
    assert (paper.inner_margin, paper.multiplier_average, paper.tolerance) == (1.0, "region", 0.0)
    assert (authors.inner_margin, authors.multiplier_average, authors.tolerance) == (5.0, "all_padded", 0.0)
    assert authors.rho_init == 1.0 and float(authors.rhos.min()) == 1.0 and authors.clamp_per_pixel
    assert (authors.lambda_min, authors.lambda_max) == (1e-6, 1e6)
    assert (tol.inner_margin, tol.multiplier_average, tol.tolerance, tol.rho_init) == (1.0, "region", 2.0, 1.0)
    assert set(PRESETS) == {"paper", "authors", "tolerance"}
    # the bundles train the "tolerance" preset, every option of it written in their configs
    loss_config = json.loads((REPO_ROOT / "bundles" / "crac_hpc" / "configs" / "train.json").read_text())["loss"]
    assert {k: loss_config[k] for k in PRESETS["tolerance"]} == PRESETS["tolerance"]
    assert CRaCLoss.preset("tolerance", classes=3, dim=3, tolerance=0.25).tolerance == 0.25  # overrides win
    assert CRaCLoss.preset("paper", classes=4, dim=3).lambdas.shape == (4, 2)
    with pytest.raises(ValueError, match="preset"):
        CRaCLoss.preset("nacl", classes=3)
    with pytest.raises(ValueError, match="tolerance"):
        CRaCLoss(classes=2, tolerance=-0.1)
    with pytest.raises(ValueError, match="lambda_min"):
        CRaCLoss(classes=2, lambda_min=2.0, lambda_max=1.0)


def test_authors_outer_update_clamps_per_pixel_and_pads_with_the_other_regions_lambda():
    lam, rho = 0.5, 0.1
    loss = CRaCLoss(
        classes=2,
        dim=2,
        lambda_init=lam,
        rho_init=rho,
        multiplier_average="all_padded",
        clamp_per_pixel=True,
        lambda_min=0.55,
        lambda_max=0.58,
    )
    loss.outer_update(loss.validation_statistics(torch.zeros(1, 2, 1, 3), LABELS), epoch=1)
    # h (logits 0) = tau: P' = 0.5 + 0.1 tau, clamped per pixel to [0.55, 0.58]; other region's pixels: clamp(0.5)
    clamp = lambda v: min(max(v, 0.55), 0.58)  # noqa: E731
    inner = [(clamp(0.6) + 2 * clamp(0.5)) / 3, (clamp(0.5) + 2 * clamp(0.5)) / 3]
    boundary = [(2 * clamp(0.5 + 0.1 * 8 / 9) + clamp(0.5)) / 3, (2 * clamp(0.5 + 0.1 / 9) + clamp(0.5)) / 3]
    torch.testing.assert_close(loss.lambdas, torch.tensor([[inner[0], boundary[0]], [inner[1], boundary[1]]], **F64))


@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_satisfied_fraction_equals_a_brute_force_count(eps):
    torch.manual_seed(1)
    labels = torch.zeros(2, 1, 7, 7, dtype=torch.int64)
    labels[:, :, 2:6, 1:5] = 1
    logits = class_proportion_prior(labels[:, 0], 2, 3, "mean", "background", dtype=torch.float64)
    logits = logits + torch.randn(logits.shape, **F64) * 0.3
    logits[0, :, 0, 0] = torch.tensor([1.0, 0.0], **F64)  # a pixel exactly on tau: satisfied even with eps = 0
    loss = CRaCLoss(classes=2, dim=2, tolerance=eps)
    stats = loss.validation_statistics(logits, labels)
    tau = class_proportion_prior(labels[:, 0], 2, 3, "mean", "background", dtype=torch.float64)
    boundary = boundary_mask(labels[:, 0], 3, "background")
    count = torch.zeros(2, 2, **F64)
    pixels = torch.zeros(2, 2, **F64)
    for b in range(2):
        for k in range(2):
            for y in range(7):
                for x in range(7):
                    r = int(boundary[b, 0, y, x])
                    pixels[k, r] += 1
                    count[k, r] += float(abs(tau[b, k, y, x] - logits[b, k, y, x])) <= eps
    torch.testing.assert_close(stats[3], count, rtol=0, atol=0)
    assert (count > 0).any()
    result = loss.outer_update(stats, epoch=1)
    torch.testing.assert_close(result["satisfied"], count / pixels)
