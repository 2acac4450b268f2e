"""Input handling shared by every loss: label layouts, dtypes, MetaTensor, and the ValueErrors for bad input."""

from __future__ import annotations

import pytest
import torch
from monai.data import MetaTensor

from calib_monai.losses import (
    CEDiceLoss,
    ECPLoss,
    FocalLoss,
    HardL1ACELoss,
    LabelSmoothingLoss,
    MbLSLoss,
    NACLLoss,
    SoftL1ACELoss,
    SVLSLoss,
)

C = 3


def all_losses(dim: int = 2):
    return [
        CEDiceLoss(),
        FocalLoss(),
        ECPLoss(),
        LabelSmoothingLoss(),
        SVLSLoss(),
        MbLSLoss(margin=0.5),
        NACLLoss(classes=C, dim=dim),
        NACLLoss(classes=C, dim=dim, kernel_ops="mode", border="zeros"),
        HardL1ACELoss(num_bins=5),
        SoftL1ACELoss(num_bins=5),
    ]


LOSS_IDS = ["cedice", "focal", "ecp", "ls", "svls", "mbls", "nacl", "nacl-mode", "hard-l1-ace", "soft-l1-ace"]
#: losses with a per-voxel ``reduction="none"`` map (the L1 ACE losses are one value per batch: bins need voxels)
PER_VOXEL = ["focal", "ecp", "ls", "svls", "mbls", "nacl", "nacl-mode"]


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("index", range(len(LOSS_IDS)), ids=LOSS_IDS)
def test_label_layouts_dtypes_and_metatensor_agree(dim: int, index: int) -> None:
    """(B,1,...) int, (B,...) int, float-holding-integers and MetaTensor labels all give the same loss."""
    loss = all_losses(dim)[index]
    gen = torch.Generator().manual_seed(index)
    spatial = (5, 6) if dim == 2 else (4, 5, 3)
    logits = torch.randn(2, C, *spatial, generator=gen)
    labels = torch.randint(0, C, (2, *spatial), generator=gen)
    reference = loss(logits, labels)
    assert torch.isfinite(reference)
    for other in (
        labels.unsqueeze(1),
        labels.unsqueeze(1).float(),
        labels.to(torch.int32),
        MetaTensor(labels.unsqueeze(1).float()),
    ):
        assert torch.allclose(loss(logits, other), reference, atol=1e-6, rtol=0)
    assert torch.allclose(loss(MetaTensor(logits), labels), reference, atol=1e-6, rtol=0)


@pytest.mark.parametrize("index", range(len(LOSS_IDS)), ids=LOSS_IDS)
def test_gradients_flow_and_are_finite(index: int) -> None:
    loss = all_losses(2)[index]
    gen = torch.Generator().manual_seed(10 + index)
    logits = (3 * torch.randn(2, C, 6, 5, generator=gen)).requires_grad_(True)
    labels = torch.randint(0, C, (2, 1, 6, 5), generator=gen).float()
    value = loss(MetaTensor(logits), MetaTensor(labels))
    value.backward()
    assert logits.grad is not None
    assert torch.isfinite(logits.grad).all()
    assert logits.grad.abs().sum() > 0


@pytest.mark.parametrize("index", range(len(LOSS_IDS)), ids=LOSS_IDS)
def test_gradients_3d(index: int) -> None:
    loss = all_losses(3)[index]
    logits = torch.randn(1, C, 4, 3, 5, requires_grad=True)
    labels = torch.randint(0, C, (1, 4, 3, 5))
    loss(logits, labels).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("index", range(len(LOSS_IDS)), ids=LOSS_IDS)
@pytest.mark.parametrize(
    "logits_shape, labels_shape, label_fill, nonfinite, expected",
    [
        ((2, C, 4), (2, 4), 0, None, r"got shape \(2, 3, 4\)"),  # wrong rank of logits
        ((2, C, 4, 4, 4, 4), (2, 4, 4, 4, 4), 0, None, r"got shape \(2, 3, 4, 4, 4, 4\)"),
        ((2, C, 4, 4), (2, C, 4, 4), 0, None, r"got shape \(2, 3, 4, 4\).*one-hot"),  # one-hot labels
        ((2, C, 4, 4), (2, 4, 5), 0, None, r"\(2, 4, 4\).*got shape \(2, 4, 5\)"),  # spatial mismatch
        ((2, C, 4, 4), (2, 4), 0, None, r"got shape \(2, 4\)"),  # wrong rank of labels
        ((2, C, 4, 4), (2, 4, 4), 3, None, r"\[0, 3\).*got values in \[0, 3\]"),  # label == C
        ((2, C, 4, 4), (2, 4, 4), -1, None, r"\[0, 3\).*got values in \[-1, 1\]"),  # negative label
        ((2, C, 4, 4), (2, 4, 4), 0.5, None, r"integer.*0\.5"),  # non-integer float label
        ((2, C, 4, 4), (2, 4, 4), 0, float("nan"), r"finite.*nan"),
        ((2, C, 4, 4), (2, 4, 4), 0, float("inf"), r"finite.*inf"),
    ],
)
def test_bad_input_raises_value_error_naming_what_was_seen(
    index, logits_shape, labels_shape, label_fill, nonfinite, expected
) -> None:
    loss = all_losses(2)[index]
    logits = torch.randn(*logits_shape)
    if nonfinite is not None:
        logits[0, 1, 0, 0] = nonfinite
    labels = torch.randint(0, 2, labels_shape).float()
    if label_fill != 0:
        labels.view(-1)[0] = label_fill
    with pytest.raises(ValueError, match=expected):
        loss(logits, labels)


def test_nacl_checks_classes_and_dim() -> None:
    with pytest.raises(ValueError, match=r"must have 3 channels.*got 4 channels"):
        NACLLoss(classes=3, dim=2)(torch.randn(1, 4, 5, 5), torch.zeros(1, 5, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"2 spatial dims.*got shape \(1, 3, 5, 5, 5\)"):
        NACLLoss(classes=3, dim=2)(torch.randn(1, 3, 5, 5, 5), torch.zeros(1, 5, 5, 5, dtype=torch.long))


def test_integer_logits_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"floating point.*torch.int64"):
        FocalLoss()(torch.zeros(1, 2, 3, 3, dtype=torch.long), torch.zeros(1, 3, 3, dtype=torch.long))


@pytest.mark.parametrize(
    "factory, expected",
    [
        (lambda: NACLLoss(3, 2, kernel_ops="gauss"), r"kernel_ops.*'gauss'"),
        (lambda: NACLLoss(3, 2, border="reflect"), r"border.*'reflect'"),
        (lambda: NACLLoss(3, 2, space="probs"), r"space.*'probs'"),
        (lambda: NACLLoss(3, 2, class_reduction="max"), r"class_reduction.*'max'"),
        (lambda: NACLLoss(3, 2, distance_type="l3"), r"distance_type.*'l3'"),
        (lambda: NACLLoss(3, 4), r"dim must be 2 or 3, got 4"),
        (lambda: NACLLoss(1, 2), r"classes.*got 1"),
        (lambda: NACLLoss(3, 2, kernel_size=4), r"odd.*got 4"),
        (lambda: NACLLoss(3, 2, kernel_ops="svls", kernel_size=1), r">= 3, got 1"),
        (lambda: SVLSLoss(kernel_size=2), r"odd.*got 2"),
        (lambda: SVLSLoss(sigma=0.0), r"sigma.*got 0.0"),
        (lambda: MbLSLoss(penalty="l3"), r"penalty.*'l3'"),
        (lambda: ECPLoss(class_reduction="median"), r"class_reduction.*'median'"),
        (lambda: LabelSmoothingLoss(alpha=1.5), r"alpha.*1.5"),
        (lambda: FocalLoss(gamma=-1.0), r"gamma.*-1.0"),
        (lambda: FocalLoss(reduction="avg"), r"reduction.*'avg'"),
        (lambda: CEDiceLoss(reduction="none"), r"reduction.*'none'"),
    ],
)
def test_bad_arguments_raise_value_error(factory, expected) -> None:
    with pytest.raises(ValueError, match=expected):
        factory()


@pytest.mark.parametrize("name", PER_VOXEL)
def test_reductions_are_consistent(name: str) -> None:
    """reduction="none" gives a (B,1,*spatial) map whose mean/sum are the "mean"/"sum" values."""
    base = all_losses(2)[LOSS_IDS.index(name)]
    logits = torch.randn(2, C, 4, 5)
    labels = torch.randint(0, C, (2, 4, 5))
    base.reduction = "none"
    per_voxel = base(logits, labels)
    assert per_voxel.shape == (2, 1, 4, 5)
    base.reduction = "sum"
    assert torch.allclose(base(logits, labels), per_voxel.sum(), atol=1e-5)
    base.reduction = "mean"
    assert torch.allclose(base(logits, labels), per_voxel.mean(), atol=1e-6)


# ------------------------------------------------------------------------------------------- constructor arguments
BAD_ARGUMENTS = [
    (lambda: NACLLoss(classes=C, dim=2, alpha=-1.0), "alpha", -1.0),
    (lambda: NACLLoss(classes=C, dim=2, alpha=float("nan")), "alpha", "nan"),
    (lambda: NACLLoss(classes=C, dim=2, alpha="0.1"), "alpha", "'0.1'"),  # a string, not a number
    (lambda: MbLSLoss(margin=-5.0), "margin", -5.0),
    (lambda: MbLSLoss(alpha=float("inf")), "alpha", "inf"),
    (lambda: ECPLoss(alpha=-1.0), "alpha", -1.0),
    (lambda: FocalLoss(gamma=-2.0), "gamma", -2.0),
    (lambda: LabelSmoothingLoss(alpha=1.5), "alpha", 1.5),
    (lambda: CEDiceLoss(lambda_dice=-1.0), "lambda_dice", -1.0),
]


@pytest.mark.parametrize("make, name, value", BAD_ARGUMENTS)
def test_out_of_range_arguments_are_refused_naming_them(make, name, value) -> None:
    """A negative or NaN weight used to build a loss that trained with a reversed or NaN penalty."""
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number.*got {value}") as err:
        make()
    assert "\n" not in str(err.value)


def test_crac_tau_alm_must_lie_in_0_1() -> None:
    from calib_monai.losses import CRaCLoss

    for tau in (5.0, 0.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match=r"^tau_alm must be a finite number > 0 and <= 1"):
            CRaCLoss(classes=C, tau_alm=tau)
    assert CRaCLoss(classes=C, tau_alm=1.0).tau_alm == 1.0  # the bound itself is allowed


@pytest.mark.parametrize("index", range(len(LOSS_IDS)), ids=LOSS_IDS)
def test_an_empty_batch_is_a_clear_error(index: int) -> None:
    loss = all_losses()[index]
    with pytest.raises(ValueError, match=r"logits are empty \(shape \(0, 3, 8, 8\)\)"):
        loss(torch.zeros(0, C, 8, 8), torch.zeros(0, 1, 8, 8))
