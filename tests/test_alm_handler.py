"""ALMUpdateHandler on real engines (the validation the trainer runs each epoch): one process, and two gloo DDP
processes that must agree."""

from __future__ import annotations

import json
import logging

import ignite.distributed as idist
import pytest
import torch
from ignite.engine import Engine
from monai.engines import SupervisedEvaluator
from monai.inferers import SliceInferer
from monai.networks.nets import UNet
from monai.transforms import Activationsd, AsDiscreted, Compose, CopyItemsd

from calib_monai.handlers import ALMUpdateHandler
from calib_monai.losses.crac import CRaCLoss
from conftest import free_port


def _volumes(n: int = 4) -> list[dict]:
    """Small labelled volumes (1, 16, 16, 4): blocks of classes 1 and 2 in background, shifted per volume."""
    items = []
    for i in range(n):
        label = torch.zeros(1, 16, 16, 4, dtype=torch.int64)
        label[:, 2 + i : 9 + i, 3:10, :] = 1
        label[:, 8:14, 6 + i : 12 + i, 1:] = 2
        image = label.float() / 2 + 0.1 * torch.randn(label.shape, generator=torch.Generator().manual_seed(i))
        items.append({"image": image, "label": label})
    return items


def _network() -> torch.nn.Module:
    torch.manual_seed(0)
    return UNet(spatial_dims=2, in_channels=1, out_channels=3, channels=(4, 8), strides=(2,))


def _evaluator(net, items) -> SupervisedEvaluator:
    """The bundles' validation: whole volumes through a SliceInferer, raw logits kept, then softmax and one-hot."""
    loader = torch.utils.data.DataLoader(items, batch_size=1)
    post = Compose(
        [
            CopyItemsd(keys="pred", names="logits"),
            Activationsd(keys="pred", softmax=True),
            AsDiscreted(keys=["pred", "label"], argmax=[True, False], to_onehot=3),
        ]
    )
    return SupervisedEvaluator(
        device="cpu",
        val_data_loader=loader,
        network=net,
        inferer=SliceInferer(roi_size=(16, 16), spatial_dim=2),
        postprocessing=post,
    )


def _handler(loss, net, items, **kwargs):
    """A handler attached to a trainer, after one validation run: calling it runs the outer step."""
    evaluator = _evaluator(net, items)
    handler = ALMUpdateHandler(loss, evaluator, **kwargs)
    handler.attach(Engine(lambda e, b: None))
    was_training = net.training
    evaluator.run()
    net.train(was_training)  # the evaluator leaves the network in eval mode; training would switch it back
    return handler


def _slice_statistics(loss, net, items) -> torch.Tensor:
    """The volumes' statistics from their axial slices fed to the loss directly."""
    with torch.no_grad():
        was_training = net.training
        net.eval()
        stats = torch.zeros(4, 3, 2, dtype=torch.float64)
        for item in items:
            slices = item["image"].movedim(-1, 0)  # (D, 1, H, W)
            stats += loss.validation_statistics(net(slices), item["label"].movedim(-1, 0))
        net.train(was_training)
    return stats


def _single_process_lambdas() -> tuple[torch.Tensor, torch.Tensor]:
    loss = CRaCLoss(classes=3, dim=2)
    handler = _handler(loss, _network(), _volumes())
    engine = Engine(lambda e, b: None)
    engine.state.epoch = 1
    handler(engine)
    return loss.lambdas.clone(), loss.rhos.clone()


def test_outer_step_on_volumes_changes_lambda_and_logs(caplog, tmp_path):
    net = _network()
    net.train()
    loss = CRaCLoss(classes=3, dim=2)
    handler = _handler(loss, net, _volumes(), save_dir=tmp_path)
    engine = Engine(lambda e, b: None)
    engine.state.epoch = 1
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        handler(engine)
    assert (loss.lambdas > 1e-6).all()  # an untrained network violates every constraint
    assert net.training  # the train/eval mode is given back
    assert "ALM outer step 1 (epoch 1)" in caplog.text and "2/boundary lambda" in caplog.text
    assert engine.state.metrics["alm_lambda_1_inner"] == float(loss.lambdas[1, 0])
    # the volumes' statistics equal those of their axial slices fed to the loss directly: the same outer step
    direct = CRaCLoss(classes=3, dim=2)
    direct.outer_update(_slice_statistics(direct, net, _volumes()), 1)
    torch.testing.assert_close(loss.lambdas, direct.lambdas)
    # the record of the step, as the studies read it
    record = json.loads((tmp_path / "alm_history.json").read_text())
    assert [r["epoch"] for r in record] == [1] and record[0]["step"] == 1
    assert record[0]["classes"]["1"]["inner"]["lambda"] == float(loss.lambdas[1, 0])


def test_outer_step_reports_the_satisfied_fraction_and_lets_lambda_fall(caplog):
    # every logit of the untrained network lies within 100 of its prior: all constraints hold, lambda falls
    loss = CRaCLoss.preset("tolerance", classes=3, dim=2, tolerance=100.0, lambda_init=0.5, rho_init=0.1)
    handler = _handler(loss, _network(), _volumes())
    engine = Engine(lambda e, b: None)
    engine.state.epoch = 1
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        handler(engine)
    torch.testing.assert_close(loss.lambdas, torch.full((3, 2), 1e-6, dtype=torch.float64))
    assert "0/inner lambda 1e-06 rho 0.1 h" in caplog.text and "satisfied 1;" in caplog.text
    for k in range(3):
        for region in ("inner", "boundary"):
            assert engine.state.metrics[f"alm_satisfied_{k}_{region}"] == 1.0
    # the paper's h >= 0 with tolerance 0: almost no logit equals its prior exactly, lambda rises
    paper = CRaCLoss(classes=3, dim=2, lambda_init=0.5)
    _handler(paper, _network(), _volumes())(engine)
    assert (paper.lambdas > 0.5).all()
    assert all(engine.state.metrics[f"alm_satisfied_{k}_inner"] == 0.0 for k in range(3))


def _ddp_worker(local_rank: int, out_dir: str) -> None:
    rank, world = idist.get_rank(), idist.get_world_size()
    loss = CRaCLoss(classes=3, dim=2)
    items = _volumes()[rank::world]  # each rank sees half of the validation set
    handler = _handler(loss, _network(), items)
    engine = Engine(lambda e, b: None)
    engine.state.epoch = 1
    handler(engine)
    torch.save({"lambdas": loss.lambdas, "rhos": loss.rhos}, f"{out_dir}/rank{rank}.pt")


def test_two_gloo_processes_end_with_equal_multipliers(tmp_path):
    with idist.Parallel(backend="gloo", nproc_per_node=2, master_port=free_port()) as parallel:
        parallel.run(_ddp_worker, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert torch.equal(ranks[0]["lambdas"], ranks[1]["lambdas"])
    assert torch.equal(ranks[0]["rhos"], ranks[1]["rhos"])
    # and the all-reduced result is the single-process result over the whole validation set
    lambdas, _ = _single_process_lambdas()
    torch.testing.assert_close(ranks[0]["lambdas"], lambdas)


def test_evaluator_mode_equals_its_own_validation_pass_and_skips_epochs_without_validation():
    net = _network()
    evaluator = _evaluator(net, _volumes())
    from_evaluator, direct = CRaCLoss(classes=3, dim=2), CRaCLoss(classes=3, dim=2)
    handler = ALMUpdateHandler(from_evaluator, evaluator=evaluator)
    trainer = Engine(lambda e, b: None)
    handler.attach(trainer)  # hooks the evaluator too: constructing a handler changes no engine
    trainer.state.epoch = 1
    handler(trainer)  # no validation has run: nothing to update from
    assert int(from_evaluator.outer_steps) == 0
    evaluator.run()
    handler(trainer)
    direct.outer_update(_slice_statistics(direct, net, _volumes()), 1)
    torch.testing.assert_close(from_evaluator.lambdas, direct.lambdas)
    assert int(from_evaluator.outer_steps) == 1


def test_needs_the_evaluator_and_a_crac_loss():
    with pytest.raises(ValueError, match="needs evaluator"):
        ALMUpdateHandler(CRaCLoss(classes=3, dim=2), None)
    with pytest.raises(ValueError, match="needs a CRaCLoss"):
        ALMUpdateHandler(torch.nn.CrossEntropyLoss(), None)
