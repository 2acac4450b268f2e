"""Device-true losses, ALM handler and export wrapper, checked without a GPU.

Tensors on the ``meta`` device carry shapes and devices but no values: an operation that mixes a meta tensor with a
CPU tensor (a buffer nobody moved, a constant built on the CPU) raises, and so does anything that reads a value back
to the host (``.item()``, ``bool()``, ``int()``), the per-step stall a GPU training step must not have. A loss that
runs forward and backward on meta inputs therefore follows its input's device and syncs nothing. The
``CUDA`` tests at the end run only where a GPU is present.
"""

from __future__ import annotations

import pytest
import torch
from ignite.engine import Engine

import calib_monai.losses as L
from calib_monai.export import SegmentationWithConfidence
from calib_monai.handlers import ALMUpdateHandler
from calib_monai.losses._inputs import value_checks_due
from calib_monai.networks import backbone

LOSSES = {
    "ce_dice": lambda c, d: L.CEDiceLoss(),
    "crac": lambda c, d: L.CRaCLoss(classes=c, dim=d),
    "crac_margin": lambda c, d: L.CRaCLoss(classes=c, dim=d, inner_margin=5.0),
    "crac_tolerance": lambda c, d: L.CRaCLoss.preset("tolerance", classes=c, dim=d),
    "ecp": lambda c, d: L.ECPLoss(),
    "focal": lambda c, d: L.FocalLoss(),
    "hard_l1_ace": lambda c, d: L.HardL1ACELoss(),
    "hard_l1_ace_term": lambda c, d: L.HardL1ACELoss(lambda_dice=0, lambda_ce=0, empty_classes="exclude"),
    "label_smoothing": lambda c, d: L.LabelSmoothingLoss(),
    "mbls": lambda c, d: L.MbLSLoss(),
    "nacl_mean": lambda c, d: L.NACLLoss(classes=c, dim=d),
    "nacl_gaussian": lambda c, d: L.NACLLoss(classes=c, dim=d, kernel_ops="gaussian"),
    "nacl_svls_l2_softmax": lambda c, d: L.NACLLoss(
        classes=c, dim=d, kernel_ops="svls", distance_type="l2", space="softmax"
    ),
    "nacl_mode": lambda c, d: L.NACLLoss(classes=c, dim=d, kernel_ops="mode"),
    "soft_l1_ace": lambda c, d: L.SoftL1ACELoss(),
    "soft_l1_ace_no_background": lambda c, d: L.SoftL1ACELoss(include_background=False),
    "svls": lambda c, d: L.SVLSLoss(),
}


def _inputs(device: str, dim: int = 2, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    spatial = (8, 8) if dim == 2 else (6, 6, 4)
    logits = torch.randn(2, classes, *spatial, device=device, requires_grad=True)
    labels = torch.randint(0, classes, (2, 1, *spatial), device=device)
    return logits, labels


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("dim", [2, 3])
def test_every_loss_trains_on_the_inputs_device_without_reading_values_back(name, dim):
    loss = LOSSES[name](3, dim)
    logits, labels = _inputs("meta", dim)
    value = loss(logits, labels)
    value.backward()
    assert value.device.type == "meta" and value.ndim == 0
    assert logits.grad is not None and logits.grad.device.type == "meta"
    # every buffer (CRaC's multipliers) followed the input, although nobody moved the loss
    assert all(b.device.type == "meta" for b in loss.buffers())


def test_crac_multipliers_follow_the_logits_and_keep_their_values():
    loss = L.CRaCLoss(classes=3, dim=2, lambda_init=0.25)
    logits, labels = _inputs("cpu")
    loss(logits.double(), labels)  # CPU -> CPU: nothing moves
    assert loss.lambdas.device.type == "cpu" and float(loss.lambdas[0, 0]) == 0.25
    loss(*_inputs("meta"))
    assert {b.device.type for b in loss.buffers()} == {"meta"}
    assert loss.lambdas.dtype == torch.float64  # moved, not cast


def test_value_checks_run_once_per_loss_off_the_cpu_and_always_on_it():
    first, second = L.FocalLoss(), L.FocalLoss()
    cuda = torch.device("cuda", 0)
    assert value_checks_due(first, cuda) and not value_checks_due(first, cuda)
    assert value_checks_due(second, cuda)  # per loss instance
    assert value_checks_due(first, torch.device("cuda", 1))  # and per device
    assert value_checks_due(first, torch.device("cpu")) and value_checks_due(first, torch.device("cpu"))
    assert not value_checks_due(L.FocalLoss(), torch.device("meta"))  # no values to check


def test_cpu_inputs_are_still_checked_on_every_call():
    loss = L.NACLLoss(classes=3, dim=2)
    logits, labels = _inputs("cpu")
    loss(logits, labels)
    bad = logits.detach().clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="logits must be finite"):
        loss(bad, labels)
    with pytest.raises(ValueError, match=r"label values must lie in \[0, 3\)"):
        loss(logits, labels + 3)


def test_alm_handler_sums_validation_statistics_on_the_logits_device():
    loss = L.CRaCLoss(classes=3, dim=2)
    evaluator = Engine(lambda engine, batch: batch)
    handler = ALMUpdateHandler(loss, evaluator=evaluator)
    handler.attach(Engine(lambda engine, batch: None))
    handler._reset(evaluator)
    logits = torch.randn(3, 8, 8, 4, device="meta")  # a volume (C, H, W, D) for a 2D loss
    label = torch.zeros(1, 8, 8, 4, device="meta")
    evaluator.state.output = [{"logits": logits, "label": label}]
    handler._add_evaluator_output(evaluator)
    assert handler._stats.device.type == "meta" and handler._stats.shape == (4, 3, 2)
    result = loss.outer_update(handler._stats, epoch=1)
    assert all(v.device.type == "meta" for v in result.values())


def test_segmentation_with_confidence_runs_where_its_network_is():
    net = backbone("unet", spatial_dims=2, in_channels=1, out_channels=3, img_size=(32, 32)).to("meta")
    segmentation, confidence = SegmentationWithConfidence(net).eval()(torch.rand(1, 1, 32, 32, 3, device="meta"))
    assert segmentation.device.type == confidence.device.type == "meta"
    assert segmentation.shape == confidence.shape == (1, 1, 32, 32, 3)


cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (the meta tests above cover CPU CI)"
)


@cuda
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_on_cuda_a_loss_step_after_the_first_never_synchronises(name):
    loss = LOSSES[name](3, 2)
    loss(*_inputs("cuda")).backward()  # first call: the value checks run once
    logits, labels = _inputs("cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss(logits, labels).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
