"""The training handlers on real MONAI engines, composed as the bundles compose them (EpochSummary, ValidationHistory,
ModelSelection, EpochSnapshots, TrainingCheckpoint): best model, atomic files, exact resume; DDP networks saved
unwrapped. The readers of model.pt for every file layout: ``test_weight_files.py``; the runtime switches:
``test_runtime_switches.py``."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from ignite.engine import Engine, Events
from monai.engines import SupervisedEvaluator, SupervisedTrainer
from monai.handlers import MeanDice, from_engine
from monai.networks.nets import UNet
from monai.transforms import AsDiscreted, Compose

from calib_monai.atomic import save_atomically
from calib_monai.bundle import (
    finalize_distributed,
)
from calib_monai.handlers import (
    EpochSnapshots,
    EpochSummary,
    ModelSelection,
    TrainingCheckpoint,
    ValidationHistory,
    select_epoch,
)


def _attach(trainer, save_dir, network, opt, sched=None, evaluator=None, resume=True, keep_every_epoch=False, **rule):
    """The handlers in the bundles' order: history, selection, snapshots, then the checkpoint that keeps their state."""
    history = ValidationHistory(save_dir, evaluator)
    selection = ModelSelection(save_dir, network, evaluator, **rule)
    history.attach(trainer)
    selection.attach(trainer)
    if keep_every_epoch:
        EpochSnapshots(save_dir, network).attach(trainer)
    checkpoint = TrainingCheckpoint(
        save_dir, network, opt, sched, extra={"selection": selection, "history": history}, resume=resume
    )
    checkpoint.attach(trainer)
    return checkpoint, selection


def _items(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(n):
        image = torch.rand(1, 16, 16, generator=g)
        items.append({"image": image, "label": (image > 0.5).float()})
    return items


def _train_loader(shuffle: bool):
    if not shuffle:
        return torch.utils.data.DataLoader(_items(4, 0), batch_size=2)
    from monai.data import DataLoader, Dataset
    from monai.transforms import RandFlipd

    flip = RandFlipd(keys=["image", "label"], prob=0.5, spatial_axis=0)
    return DataLoader(Dataset(_items(6, 0), transform=flip), batch_size=2, shuffle=True)


def _run(
    save_dir,
    epochs: int,
    stop_after: int | None = None,
    resume: bool = True,
    ddp: bool = False,
    shuffle: bool = False,
    metric_name: str = "val_mean_dice",
):
    """Train a tiny net; a handler may stop the run after ``stop_after`` epochs, like a killed job. ``ddp``: the
    trainer and the checkpoint get the network wrapped in DistributedDataParallel, the evaluator the plain one, as
    in multi_gpu_train.json (needs a process group). ``shuffle``: shuffled batches of randomly flipped items (MONAI's
    DataLoader and a ``RandFlipd``), drawn from the torch and NumPy generators, as a bundle seeds them."""
    torch.manual_seed(0)
    np.random.seed(0)
    net = UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,))
    trained = torch.nn.parallel.DistributedDataParallel(net) if ddp else net
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    post = Compose([AsDiscreted(keys=["pred", "label"], argmax=[True, False], to_onehot=2)])
    evaluator = SupervisedEvaluator(
        device="cpu",
        val_data_loader=torch.utils.data.DataLoader(_items(2, 1), batch_size=2),
        network=net,
        postprocessing=post,
        key_val_metric={
            "val_mean_dice": MeanDice(include_background=False, output_transform=from_engine(["pred", "label"]))
        },
    )
    trainer = SupervisedTrainer(
        device="cpu",
        max_epochs=epochs,
        train_data_loader=_train_loader(shuffle),
        network=trained,
        optimizer=opt,
        loss_function=torch.nn.CrossEntropyLoss(),
        prepare_batch=lambda batch, device, non_blocking, **kw: (batch["image"], batch["label"][:, 0].long()),
    )
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run())
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: sched.step())
    _, selection = _attach(trainer, save_dir, trained, opt, sched, evaluator, resume=resume, metric_name=metric_name)
    EpochSummary(evaluator=evaluator, optimizer=opt).attach(trainer)
    started_at = {}
    trainer.add_event_handler(Events.EPOCH_STARTED, lambda e: started_at.setdefault("epoch", e.state.epoch))
    if stop_after is not None:
        trainer.add_event_handler(Events.EPOCH_COMPLETED(once=stop_after), lambda e: e.terminate())
    trainer.run()
    return trainer, net, opt, sched, selection, started_at


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


def test_resumed_run_with_shuffling_and_augmentation_equals_the_uninterrupted_one_exactly(tmp_path):
    """The checkpoint holds the random-number state: a run stopped after epoch 2 and started again (a new process
    seeds its generators afresh, like ``_run``) shuffles and flips epoch 3 as the uninterrupted run did."""
    _, ref_net, *_ = _run(tmp_path / "ref", epochs=4, shuffle=True)
    _run(tmp_path / "run", epochs=4, stop_after=2, shuffle=True)
    saved = torch.load(tmp_path / "run" / "checkpoint_latest.pt", weights_only=True)  # safe loading suffices
    assert set(saved["rng"]) >= {"torch", "numpy", "python", "samplers", "transforms"} and saved["rng"]["transforms"]
    _, net, *_ = _run(tmp_path / "run", epochs=4, shuffle=True)
    for (name, a), b in zip(net.state_dict().items(), ref_net.state_dict().values()):
        assert torch.equal(a, b), name
    assert json.loads((tmp_path / "run" / "validation_history.json").read_text()) == json.loads(
        (tmp_path / "ref" / "validation_history.json").read_text()
    )


def test_a_selection_metric_the_validation_does_not_compute_is_an_error(tmp_path):
    """``--selection_metric val_dic`` trained to the end, wrote no model.pt and said nothing."""
    with pytest.raises(
        ValueError,
        match=r"selection_metric 'val_dic' is not a metric of the validation \(did you "
        r"mean 'val_mean_dice'\?\): it computes \['val_mean_dice'\]",
    ):
        _run(tmp_path, epochs=2, metric_name="val_dic")
    assert not (tmp_path / "model.pt").exists()


def test_an_unreadable_latest_checkpoint_names_the_file_and_how_to_start_over(tmp_path):
    _run(tmp_path, epochs=1)
    latest = tmp_path / "checkpoint_latest.pt"
    latest.write_bytes(latest.read_bytes()[:2000])  # cut off, as by a full disk or an interrupted copy
    with pytest.raises(ValueError) as err:
        _run(tmp_path, epochs=2)
    message = str(err.value)
    assert message.startswith(f"{latest} cannot be read as a training checkpoint: the file is cut off")
    assert f"delete {latest} to start the run over" in message and "weights_only" not in message


def test_best_model_is_the_best_epochs_weights(tmp_path):
    trainer, net, *_, checkpoint, _ = _run(tmp_path, epochs=3)
    assert 1 <= checkpoint.best_metric_epoch <= 3
    best = torch.load(tmp_path / "model.pt", weights_only=True)
    # model.pt is a plain state_dict (the model-zoo format), loadable into a fresh network
    fresh = UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,))
    fresh.load_state_dict(best)
    latest = torch.load(tmp_path / "checkpoint_latest.pt", weights_only=False)
    assert latest["selection"]["best_metric"] == checkpoint.best_metric
    assert set(latest) >= {"network", "optimizer", "lr_scheduler", "trainer", "selection", "history"}
    assert latest["selection"]["best_metric_epoch"] == checkpoint.best_metric_epoch


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


def _select(
    save_dir, dice, ece, bounds, stop_after=None, metric_name="val_mean_dice", mode="max", keep_every_epoch=False
):
    """A trainer whose evaluator reports the given val_mean_dice / val_ece at each epoch; each epoch's network has
    its epoch number as weight, so model.pt tells which epoch was selected."""
    net = torch.nn.Linear(1, 1, bias=False)
    evaluator = Engine(lambda e, b: None)

    @evaluator.on(Events.COMPLETED)
    def _metrics(engine):
        epoch = trainer.state.epoch
        engine.state.metrics.update(
            val_mean_dice=dice[epoch - 1], val_ece=ece[epoch - 1], val_nll=1.0 - dice[epoch - 1] + ece[epoch - 1]
        )

    def step(engine, batch):
        with torch.no_grad():
            net.weight.fill_(engine.state.epoch)

    trainer = Engine(step)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run([0]))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    _attach(
        trainer,
        save_dir,
        net,
        opt,
        evaluator=evaluator,
        keep_every_epoch=keep_every_epoch,
        bounds=bounds,
        metric_name=metric_name,
        mode=mode,
    )
    if stop_after is not None:
        trainer.add_event_handler(Events.EPOCH_COMPLETED(once=stop_after), lambda e: e.terminate())
    trainer.run([0], max_epochs=len(dice))
    return int(torch.load(save_dir / "model.pt", weights_only=True)["weight"].item())


def test_selection_with_an_ece_bound_takes_the_best_dice_within_it(tmp_path, caplog):
    dice, ece = [0.5, 0.7, 0.6, 0.9], [0.2, 0.04, 0.03, 0.2]
    assert _select(tmp_path / "dsc", dice, ece, {}) == 4  # the papers' rule: best DSC
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        assert _select(tmp_path / "bound", dice, ece, {"val_ece": 0.05}) == 2  # best DSC among ECE <= 0.05
    assert "no epoch within {'val_ece': 0.05} yet" in caplog.text  # epoch 1 was kept only until epoch 2
    assert _select(tmp_path / "none", dice, [0.3] * 4, {"val_ece": 0.05}) == 4  # none within: best DSC regardless
    # a run stopped after epoch 3 and resumed keeps epoch 2 (within the bound) against epoch 4 (outside it)
    _select(tmp_path / "resumed", dice, ece, {"val_ece": 0.05}, stop_after=3)
    assert _select(tmp_path / "resumed", dice, ece, {"val_ece": 0.05}) == 2
    with pytest.raises(KeyError, match="val_tace"):
        _select(tmp_path / "bad", dice, ece, {"val_tace": 0.5})


@pytest.mark.parametrize(
    "rule",
    [
        {"metric_name": "val_mean_dice", "mode": "max", "bounds": {}},
        {"metric_name": "val_mean_dice", "mode": "max", "bounds": {"val_ece": 0.05}},
        {"metric_name": "val_mean_dice", "mode": "max", "bounds": {"val_ece": 0.01}},  # no epoch within it
        {"metric_name": "val_nll", "mode": "min", "bounds": {}},
    ],
)
def test_select_epoch_on_the_history_picks_what_the_handler_saved(tmp_path, rule):
    """Any rule applied after training to validation_history.json (select_epoch) gives the epoch the handler would
    have saved as model.pt with that rule, and keep_every_epoch keeps that epoch's weights."""
    dice, ece = [0.5, 0.7, 0.6, 0.9, 0.9], [0.2, 0.04, 0.03, 0.2, 0.1]
    # the run is stopped after epoch 3 and resumed: the history survives the restart
    _select(tmp_path / "run", dice, ece, {}, stop_after=3, keep_every_epoch=True)
    _select(tmp_path / "run", dice, ece, {}, keep_every_epoch=True)
    history = json.loads((tmp_path / "run" / "validation_history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5]
    assert [h["val_ece"] for h in history] == pytest.approx(ece)
    chosen = select_epoch(history, rule["metric_name"], rule["mode"], rule["bounds"])
    # worked out by hand: best DSC 4 (earliest of the tie 4/5); within ECE <= 0.05: 2; none within 0.01: best
    # DSC regardless, 4; lowest NLL = 1 - dice + ece: epoch 5 (0.2)
    expected = {(): 4, ("val_ece", 0.05): 2, ("val_ece", 0.01): 4}.get(tuple(*rule["bounds"].items()), 4)
    expected = 5 if rule["metric_name"] == "val_nll" else expected
    assert chosen == expected
    assert _select(tmp_path / "online", dice, ece, **rule) == chosen  # the handler with that rule saves this epoch
    kept = torch.load(tmp_path / "run" / f"epoch_{chosen}.pt", weights_only=True)["weight"].item()
    assert kept == chosen


def test_select_epoch_without_a_finite_metric_is_minus_one():
    assert select_epoch([{"epoch": 1, "val_mean_dice": float("nan")}]) == -1
    with pytest.raises(ValueError, match="'max' or 'min'"):
        select_epoch([], mode="best")


def test_mode_is_checked(tmp_path):
    with pytest.raises(ValueError, match="'max' or 'min'"):
        ModelSelection(tmp_path, torch.nn.Linear(1, 1), None, mode="best")


def test_a_checkpoint_without_the_handlers_state_is_refused_naming_what_it_lacks(tmp_path):
    """A file lacking the ``selection`` and ``history`` entries is not this training's checkpoint: start over."""
    _run(tmp_path, epochs=3, stop_after=2)
    latest = torch.load(tmp_path / "checkpoint_latest.pt", weights_only=True)
    torch.save(
        {k: v for k, v in latest.items() if k not in ("selection", "history")}, tmp_path / "checkpoint_latest.pt"
    )
    with pytest.raises(ValueError, match=r"lacks \['selection', 'history'\]\): delete .*checkpoint_latest.pt"):
        _run(tmp_path, epochs=3)


@pytest.mark.parametrize("key", ["settings", "rng"])
def test_a_checkpoint_of_an_older_layout_is_refused_in_one_line(tmp_path, key):
    """A checkpoint_latest.pt without the settings or the random-number state save_latest writes: one line naming
    the file, what it lacks and how to start over."""
    _run(tmp_path, epochs=3, stop_after=2)
    latest = tmp_path / "checkpoint_latest.pt"
    torch.save({k: v for k, v in torch.load(latest, weights_only=True).items() if k != key}, latest)
    with pytest.raises(ValueError) as error:
        _run(tmp_path, epochs=3)
    message = str(error.value)
    assert message.startswith(f"{latest} lacks ['{key}'] (written by an older calib_monai): delete {latest}")
    assert "\n" not in message


# ---- DDP-wrapped networks and module.-prefixed checkpoints -----------------------------------------------------------
@pytest.fixture
def one_rank_group(tmp_path):
    """A single-process gloo group, so that a network can be wrapped in DistributedDataParallel here."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        finalize_distributed()  # also resets ignite's cached context, which later tests would otherwise still see


def test_ddp_network_is_saved_unwrapped_and_resumes(tmp_path, one_rank_group):
    """model.pt and checkpoint_latest.pt of a DDP network hold the plain network's keys; a DDP run resumes from them
    to the same weights as an uninterrupted one."""
    *_, ref_net, _, _, _, _ = _run(tmp_path / "ref", epochs=3, ddp=True)
    tmp_path = tmp_path / "run"
    _run(tmp_path, epochs=3, stop_after=2, ddp=True)
    best = torch.load(tmp_path / "model.pt", weights_only=True)
    latest = torch.load(tmp_path / "checkpoint_latest.pt", weights_only=False)
    for state in (best, latest["network"]):
        assert state and not any(k.startswith("module.") for k in state)
    UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,)).load_state_dict(best)
    trainer, net, *_, started_at = _run(tmp_path, epochs=3, ddp=True)
    assert started_at["epoch"] == 3 and trainer.state.epoch == 3
    for a, b in zip(net.state_dict().values(), ref_net.state_dict().values()):
        torch.testing.assert_close(a, b)
