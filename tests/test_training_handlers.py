"""EpochSummary and TrainingCheckpoint on real MONAI engines: best model, atomic files, exact resume."""

from __future__ import annotations

import logging

import pytest
import torch
from ignite.engine import Events
from monai.engines import SupervisedEvaluator, SupervisedTrainer
from monai.handlers import MeanDice, from_engine
from monai.networks.nets import UNet
from monai.transforms import AsDiscreted, Compose

from calib_monai.handlers import EpochSummary, TrainingCheckpoint
from calib_monai.handlers.training import save_atomically


def _items(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(n):
        image = torch.rand(1, 16, 16, generator=g)
        items.append({"image": image, "label": (image > 0.5).float()})
    return items


def _run(save_dir, epochs: int, stop_after: int | None = None, resume: bool = True):
    """Train a tiny net; a handler may stop the run after ``stop_after`` epochs, like a killed job."""
    torch.manual_seed(0)
    net = UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    post = Compose([AsDiscreted(keys=["pred", "label"], argmax=[True, False], to_onehot=2)])
    evaluator = SupervisedEvaluator(
        device="cpu",
        val_data_loader=torch.utils.data.DataLoader(_items(2, 1), batch_size=2),
        network=net,
        postprocessing=post,
        key_val_metric={"val_mean_dice": MeanDice(include_background=False, output_transform=from_engine(["pred", "label"]))},
    )
    trainer = SupervisedTrainer(
        device="cpu",
        max_epochs=epochs,
        train_data_loader=torch.utils.data.DataLoader(_items(4, 0), batch_size=2),
        network=net,
        optimizer=opt,
        loss_function=torch.nn.CrossEntropyLoss(),
        prepare_batch=lambda batch, device, non_blocking, **kw: (batch["image"], batch["label"][:, 0].long()),
    )
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run())
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: sched.step())
    checkpoint = TrainingCheckpoint(save_dir, net, opt, sched, evaluator=evaluator, resume=resume)
    checkpoint.attach(trainer)
    EpochSummary(evaluator=evaluator, optimizer=opt).attach(trainer)
    started_at = {}
    trainer.add_event_handler(Events.EPOCH_STARTED, lambda e: started_at.setdefault("epoch", e.state.epoch))
    if stop_after is not None:
        trainer.add_event_handler(Events.EPOCH_COMPLETED(once=stop_after), lambda e: e.terminate())
    trainer.run()
    return trainer, net, opt, sched, checkpoint, started_at


def test_stopped_run_resumes_at_next_epoch_with_same_state(tmp_path):
    # reference: 3 uninterrupted epochs
    ref_trainer, ref_net, ref_opt, ref_sched, _, _ = _run(tmp_path / "ref", epochs=3)
    # the same run killed after epoch 2, then started again with the same command
    _run(tmp_path / "run", epochs=3, stop_after=2)
    saved = torch.load(tmp_path / "run" / "checkpoint_latest.pt", weights_only=False)
    assert saved["trainer"]["iteration"] == 2 * saved["trainer"]["epoch_length"]  # ignite stores iterations
    trainer, net, opt, sched, checkpoint, started_at = _run(tmp_path / "run", epochs=3)
    assert started_at["epoch"] == 3  # the first epoch run after resuming is epoch 3, not 1
    assert trainer.state.epoch == 3
    assert sched.last_epoch == ref_sched.last_epoch == 3
    assert opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"])
    # same data order and same state: the resumed weights equal the uninterrupted ones
    for a, b in zip(net.state_dict().values(), ref_net.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_best_model_is_the_best_epochs_weights(tmp_path):
    trainer, net, *_ , checkpoint, _ = _run(tmp_path, epochs=3)
    assert 1 <= checkpoint.best_metric_epoch <= 3
    best = torch.load(tmp_path / "model.pt", weights_only=True)
    # model.pt is a plain state_dict (the model-zoo format), loadable into a fresh network
    fresh = UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,))
    fresh.load_state_dict(best)
    latest = torch.load(tmp_path / "checkpoint_latest.pt", weights_only=False)
    assert latest["best_metric"] == checkpoint.best_metric
    assert set(latest) >= {"network", "optimizer", "lr_scheduler", "trainer", "best_metric_epoch"}


def test_finished_run_is_not_trained_again(tmp_path, caplog):
    _run(tmp_path, epochs=2)
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        _, _, _, _, _, started_at = _run(tmp_path, epochs=2)
    assert "epoch" not in started_at
    assert "nothing left to train" in caplog.text


def test_epoch_summary_line_has_loss_metric_lr_and_time(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        _run(tmp_path, epochs=1, resume=False)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch 1/1"))
    for part in ("loss ", "val_mean_dice ", "lr 1.0e-02", "time "):
        assert part in line


def test_save_atomically_keeps_previous_file_when_save_fails(tmp_path):
    path = tmp_path / "state.pt"
    save_atomically({"a": 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError):
        save_atomically({"a": Unpicklable()}, path)
    assert torch.load(path) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]  # no temporary file left behind


def test_mode_is_checked(tmp_path):
    with pytest.raises(ValueError, match="'max' or 'min'"):
        TrainingCheckpoint(tmp_path, torch.nn.Linear(1, 1), None, mode="best")
