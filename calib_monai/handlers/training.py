"""Ignite handlers for a bundle's training run: a one-line epoch summary, and checkpoints that resume.

Both attach to the trainer *after* MONAI's ``ValidationHandler`` (bundle configs list them after it), so on
``EPOCH_COMPLETED`` the evaluator has already run and its metrics are in ``evaluator.state.metrics``.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint

from calib_monai.bundle import load_network_weights, read_weights_file, unwrap_network, weights_state_dict

from .rng import capture_rng_state, restore_rng_state

__all__ = ["EpochSummary", "NetworkWeightsLoader", "TrainingCheckpoint", "check_selection_metric", "save_atomically",
           "select_epoch"]


def save_atomically(obj: Any, path: str | os.PathLike, write: Any = torch.save) -> None:
    """``write(obj, tmp)`` (``torch.save`` by default) to a temporary file in the target folder, then rename it over
    ``path``.

    A run killed mid-write leaves the previous file intact instead of a truncated one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_json(data: Any, path: str) -> None:
    Path(path).write_text(json.dumps(data, indent=1))


def _nearest(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_selection_metric(metric_name: str, metrics: Any) -> None:
    """A ValueError naming ``metric_name`` when the validation does not compute it (``metrics``: its metric names)."""
    if metric_name not in metrics:
        raise ValueError(f"selection_metric {metric_name!r} is not a metric of the validation{_nearest(metric_name, metrics)}"
                         f": it computes {sorted(metrics)}; pass --selection_metric <one of them>")  # fmt: skip


def _within_bounds(metrics: dict[str, Any], bounds: dict[str, float]) -> bool:
    missing = [name for name in bounds if name not in metrics]
    if missing:
        raise KeyError(f"selection bounds name {missing}, which the evaluator does not compute; its metrics are "
                       f"{sorted(metrics)}")  # fmt: skip
    return all(float(metrics[name]) <= bound for name, bound in bounds.items())


def _better(value: float, within: bool, best: float, best_within: bool, mode: str) -> bool:
    """The selection rule: an epoch within the bounds beats any epoch outside them; otherwise the metric decides
    (strictly, so the earliest of equal epochs stays)."""
    if not math.isfinite(value):
        return False
    if within != best_within:
        return within
    return value > best if mode == "max" else value < best


def select_epoch(history: list[dict[str, Any]], metric_name: str = "val_mean_dice", mode: str = "max",
                 bounds: dict[str, float] | None = None) -> int:  # fmt: skip
    """The epoch ``TrainingCheckpoint`` saves as ``model.pt`` for a selection rule, from a run's validation history.

    Args:
        history: one dict per validated epoch with its ``"epoch"`` and the evaluator's metrics (the handler's
            ``validation_history.json``).
        metric_name, mode, bounds: the rule, as ``TrainingCheckpoint`` takes it.
    Returns:
        the selected epoch, -1 when no epoch has a finite ``metric_name``.
    """
    if mode not in ("max", "min"):
        raise ValueError(f"selection mode must be 'max' or 'min', got {mode!r}")
    bounds = {str(k): float(v) for k, v in (bounds or {}).items()}
    best, best_within, best_epoch = (-math.inf if mode == "max" else math.inf), False, -1
    for entry in history:
        if metric_name not in entry:
            continue
        value, within = float(entry[metric_name]), _within_bounds(entry, bounds)
        if _better(value, within, best, best_within, mode):
            best, best_within, best_epoch = value, within, int(entry["epoch"])
    return best_epoch


class EpochSummary:
    """Log one line per epoch: training loss, the evaluator's metrics, learning rate and wall time.

    Why not MONAI's ``StatsHandler``: it logs the trainer's own state (a line per iteration, or the trainer's epoch
    metrics), not the *evaluator's* metrics beside the epoch's mean loss, learning rate and time in one line; it
    reads the loss back every logged iteration, where this handler sums it on the device and reads it once per epoch.

    Example line::

        epoch 3/100  loss 0.4123  val_mean_dice 0.8120  val_ece 0.0710  lr 1.0e-03  time 12.3 s

    Args:
        evaluator: the validation engine whose ``state.metrics`` are reported (None: training loss only).
        optimizer: the learning rate of the epoch (first parameter group, read when the epoch starts).
        metric_names: evaluator metrics to print, in order; default: all of them, sorted.
        logger_name: logger the line goes to (bundle ``logging.conf`` files configure ``calib_monai``).
    """

    def __init__(
        self,
        evaluator: Engine | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        metric_names: list[str] | None = None,
        logger_name: str = "calib_monai",
    ) -> None:
        self.evaluator = evaluator
        self.optimizer = optimizer
        self.metric_names = metric_names
        self.logger = logging.getLogger(logger_name)
        self._loss_sum = 0.0
        self._loss_count = 0
        self._epoch_start = 0.0
        self._epoch_lr: float | None = None

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, self._start_epoch)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._add_loss)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)

    def _start_epoch(self, engine: Engine) -> None:
        self._loss_sum, self._loss_count, self._epoch_start = 0.0, 0, time.perf_counter()
        # the rate this epoch trained with: schedulers step at EPOCH_COMPLETED, before this line is written
        self._epoch_lr = self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else None

    def _add_loss(self, engine: Engine) -> None:
        output = engine.state.output
        loss = output[0]["loss"] if isinstance(output, list) else output["loss"]
        # summed where the loss lives: a float() here would make every GPU step wait for the GPU
        loss = loss.detach() if isinstance(loss, torch.Tensor) else torch.as_tensor(loss)
        self._loss_sum = loss if self._loss_count == 0 else self._loss_sum + loss
        self._loss_count += 1

    def __call__(self, engine: Engine) -> None:
        if idist.get_rank() > 0:  # one line per epoch, not one per DDP rank
            return
        parts = [f"epoch {engine.state.epoch}/{engine.state.max_epochs}"]
        if self._loss_count:
            parts.append(f"loss {float(self._loss_sum) / self._loss_count:.4f}")
        if self.evaluator is not None:
            metrics = self.evaluator.state.metrics
            for name in self.metric_names or sorted(metrics):
                if name in metrics:
                    parts.append(f"{name} {float(metrics[name]):.4f}")
        if self._epoch_lr is not None:
            parts.append(f"lr {self._epoch_lr:.1e}")
        parts.append(f"time {time.perf_counter() - self._epoch_start:.1f} s")
        self.logger.info("  ".join(parts))


class TrainingCheckpoint:
    """Best-model and resumable checkpoints for a MONAI ``SupervisedTrainer``.

    At every ``EPOCH_COMPLETED`` (after validation) it

    * writes ``best_filename`` (a plain ``state_dict`` of the network, the model-zoo ``models/model.pt``
      format that ``ckpt_export`` and MONAI Label read) when ``evaluator.state.metrics[metric_name]``
      improves on the best so far (higher is better for ``mode="max"``, as for DSC in the papers);
    * writes ``latest_filename`` with network, optimizer, scheduler, trainer state (epoch, iteration), the best value
      so far and the random-number state (``calib_monai.handlers.rng``: torch, CUDA, NumPy, Python, the training
      loader's generators and random transforms), so that a stopped run resumes exactly where it stopped: killed at
      any point and resumed, it ends with the same weights as a run that was never stopped (same machine and
      settings; ``tests/test_resume_exact.py``).

    Every validated epoch's evaluator metrics are also appended to ``validation_history.json`` (a list of
    ``{"epoch": e, "val_mean_dice": ..., ...}``), so any other selection rule can be applied after training with
    :func:`select_epoch`; ``keep_every_epoch=True`` also keeps each epoch's network as ``epoch_<e>.pt``, the weights
    those rules pick (model-selection studies).

    The files are written atomically, by DDP rank 0 only (every rank loads them, and restores rank 0's random-number
    state). At ``STARTED``, if ``latest_filename`` exists, everything is loaded back and training continues at the next
    epoch; ``resume=False`` ignores (and later overwrites) it. A file that cannot be read (cut off, of another network)
    is an error naming it and the fix (delete it to start over); it is read with ``weights_only=True``.
    ``metric_name`` must be one of the evaluator's metrics: a name it does not compute is an error at the first
    validation (naming the metrics it computes), not an epoch silently never saved.

    A ``DistributedDataParallel`` (or ``DataParallel``) network is unwrapped: both files hold the plain network's
    keys (no ``module.`` prefix), so a multi-GPU ``model.pt`` loads into the bundle's ``network_def`` like any other,
    and a multi-GPU run resumes on one GPU and vice versa. ``module.``-prefixed files of older multi-GPU runs are
    still read.

    Why not MONAI's ``CheckpointSaver``/``CheckpointLoader`` (which unwrap DDP too)? They do not keep this
    behaviour: the interval checkpoints are named by epoch (``checkpoint_epoch=N.pt``; a fixed name exists only for
    the final and the key-metric files), while ``CheckpointLoader`` reads one path fixed in the config and fails when
    it is absent (no "resume when the file exists, else start fresh"), and raises on a checkpoint with more epochs
    than ``max_epochs`` (a shorter ``--epochs``) instead of saying there is nothing left to train; the best value so far survives a resume only with ``key_metric_save_state``,
    which puts the saver's state into the best-model file (then no longer the plain state_dict of ``model.pt``);
    and MONAI's ``DiskSaver`` is created with ``atomic=False`` (a run killed mid-write leaves a truncated file).

    Args:
        save_dir: folder of both files.
        network, optimizer, lr_scheduler, trainer: the objects to save and restore.
        evaluator: validation engine holding ``metric_name`` (None: no best model, only the latest state).
        metric_name: evaluator metric that selects the best model.
        mode: ``"max"`` (higher is better) or ``"min"`` (e.g. for ECE or NLL).
        bounds: ``{evaluator metric: upper bound}`` an epoch must meet to be selected, e.g. ``{"val_ece": 0.05}``:
            the best ``metric_name`` among the epochs within the bounds (calibration-aware selection). Until an epoch
            is within them, the best epoch regardless of them is kept (``model.pt`` always exists), and the log says
            so; the first epoch within the bounds replaces it.
        extra: more objects with ``state_dict``/``load_state_dict`` to save and restore in the latest checkpoint,
            e.g. ``{"loss": crac_loss}`` so that CRaC's multipliers survive a restart.
        keep_every_epoch: also write every epoch's network as ``epoch_<e>.pt`` (a plain state_dict, like ``model.pt``).
    """

    def __init__(
        self,
        save_dir: str | os.PathLike,
        network: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any = None,
        evaluator: Engine | None = None,
        metric_name: str = "val_mean_dice",
        mode: str = "max",
        best_filename: str = "model.pt",
        latest_filename: str = "checkpoint_latest.pt",
        resume: bool = True,
        extra: dict[str, Any] | None = None,
        logger_name: str = "calib_monai",
        bounds: dict[str, float] | None = None,
        keep_every_epoch: bool = False,
        history_filename: str = "validation_history.json",
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"TrainingCheckpoint mode must be 'max' or 'min', got {mode!r}.")
        self.bounds = {str(k): float(v) for k, v in (bounds or {}).items()}
        self.save_dir = Path(save_dir)
        self.network = network
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.evaluator = evaluator
        self.metric_name = metric_name
        self.mode = mode
        self.best_path = self.save_dir / best_filename
        self.latest_path = self.save_dir / latest_filename
        self.resume = resume
        self.extra = dict(extra or {})
        self.logger = logging.getLogger(logger_name)
        self.best_metric = -math.inf if mode == "max" else math.inf
        self.best_metric_epoch = -1
        self.best_within_bounds = False
        self.keep_every_epoch = bool(keep_every_epoch)
        self.history_path = self.save_dir / history_filename
        self.history: list[dict[str, float]] = []
        self._trainer: Engine | None = None

    def attach(self, engine: Engine) -> None:
        self._trainer = engine
        engine.add_event_handler(Events.STARTED, self.load_latest)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)
        engine.add_event_handler(Events.COMPLETED, self._report)

    def _report(self, engine: Engine) -> None:
        if self.best_metric_epoch > 0:
            self.logger.info(
                f"training finished: best {self.metric_name} {self.best_metric:.4f} at epoch {self.best_metric_epoch}; "
                f"best model {self.best_path}, resumable state {self.latest_path}"
            )

    def _objects(self) -> dict[str, Any]:
        network = unwrap_network(self.network)  # plain keys, whatever the number of GPUs
        objects: dict[str, Any] = {**self.extra, "network": network, "optimizer": self.optimizer}
        if self.lr_scheduler is not None:
            objects["lr_scheduler"] = self.lr_scheduler
        if self._trainer is not None:
            objects["trainer"] = self._trainer
        return objects

    def load_latest(self, engine: Engine) -> None:
        if not self.resume or not self.latest_path.is_file():
            return
        max_epochs = engine.state.max_epochs
        fix = (f"delete {self.latest_path} to start the run over (model.pt and the validation history are kept until "
               "the new run replaces them), or put back the file of the stopped run")  # fmt: skip
        checkpoint = read_weights_file(self.latest_path, what="a training checkpoint", fix=fix)
        objects = self._objects()
        wanted = (*objects, "best_metric", "best_metric_epoch")
        missing = [name for name in wanted if name not in checkpoint] if isinstance(checkpoint, dict) else list(wanted)
        if missing:
            raise ValueError(f"{self.latest_path} is not a checkpoint of this training (it lacks {missing}): {fix}")
        # a file written by an older multi-GPU run holds "module."-prefixed network keys
        load_network_weights(objects.pop("network"), weights_state_dict(checkpoint["network"]),
                             name=f"{self.latest_path} (its network)")  # fmt: skip
        Checkpoint.load_objects(to_load=objects, checkpoint=checkpoint)
        if "rng" in checkpoint:
            restore_rng_state(checkpoint["rng"], engine.state.dataloader)
        else:
            self.logger.warning(f"{self.latest_path} holds no random-number state (written by an older version): the "
                                "resumed run shuffles differently from an uninterrupted one")  # fmt: skip
        self.best_metric = checkpoint["best_metric"]
        self.best_metric_epoch = checkpoint["best_metric_epoch"]
        self.best_within_bounds = checkpoint.get("best_within_bounds", not self.bounds)
        self.history = [e for e in checkpoint.get("history", []) if e["epoch"] <= engine.state.epoch]
        # the command line may ask for more (or fewer) epochs than the stopped run had
        engine.state.max_epochs = max_epochs
        if engine.state.epoch >= max_epochs:
            self.logger.info(
                f"{self.latest_path} already holds epoch {engine.state.epoch} of {max_epochs}: nothing left to train "
                "(raise --epochs to continue, or delete the file to start over)."
            )
            engine.terminate()
            return
        self.logger.info(
            f"resuming from {self.latest_path}: epoch {engine.state.epoch} done, best {self.metric_name} "
            f"{self.best_metric:.4f} at epoch {self.best_metric_epoch}"
        )

    def __call__(self, engine: Engine) -> None:
        if idist.get_rank() > 0:  # DDP: every rank holds the same weights; rank 0 writes them
            return
        weights = unwrap_network(self.network).state_dict()
        if self.keep_every_epoch:
            save_atomically(weights, self.save_dir / f"epoch_{engine.state.epoch}.pt")
        if self.evaluator is not None and self.evaluator.state.metrics:
            metrics = self.evaluator.state.metrics
            check_selection_metric(self.metric_name, metrics)
            self.history.append({"epoch": engine.state.epoch, **{k: _as_float(v) for k, v in metrics.items()}})
            value = float(metrics[self.metric_name])
            within = _within_bounds(metrics, self.bounds)
            if _better(value, within, self.best_metric, self.best_within_bounds, self.mode):
                self.best_metric, self.best_metric_epoch, self.best_within_bounds = value, engine.state.epoch, within
                save_atomically(weights, self.best_path)
                note = "" if within else f" (no epoch within {self.bounds} yet: the best regardless of them)"
                self.logger.info(f"new best {self.metric_name} {value:.4f} at epoch {engine.state.epoch}: {self.best_path}{note}")
            save_atomically(self.history, self.history_path, write=_write_json)
        state = {name: obj.state_dict() for name, obj in self._objects().items()}
        state.update(best_metric=self.best_metric, best_metric_epoch=self.best_metric_epoch,
                     best_within_bounds=self.best_within_bounds, history=self.history,
                     rng=capture_rng_state(engine.state.dataloader))  # fmt: skip
        save_atomically(state, self.latest_path)


def _as_float(value: Any) -> float:
    return float(value.item() if isinstance(value, torch.Tensor) else value)


class NetworkWeightsLoader:
    """Load a ``model.pt`` into a network when an engine starts (bundle ``evaluate.json`` and ``inference.json``).

    Like MONAI's ``CheckpointLoader(load_dict={"model": network})`` with ``strict=True``, but through
    :func:`calib_monai.bundle.load_network_weights`, so it also reads the ``module.``-prefixed files that multi-GPU
    runs wrote before ``TrainingCheckpoint`` unwrapped DDP (``CheckpointLoader`` fails on those with missing keys).

    Args:
        load_path: the weights file: a plain state_dict, a ``module.``-prefixed one, or ``{"model": ...}``.
        network: the network to load into (a DDP wrapper is unwrapped).
        map_location: where the tensors are loaded before they are copied into the network.
    """

    def __init__(self, load_path: str | os.PathLike, network: torch.nn.Module, map_location: Any = "cpu",
                 logger_name: str = "calib_monai") -> None:  # fmt: skip
        self.load_path = Path(load_path)
        self.network = network
        self.map_location = map_location
        self.logger = logging.getLogger(logger_name)

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self)

    def __call__(self, engine: Engine | None = None) -> None:
        if not self.load_path.is_file():
            raise FileNotFoundError(f"model weights {self.load_path} not found: train the bundle first, or point "
                                    "model_path/output_dir at the folder holding model.pt")  # fmt: skip
        load_network_weights(self.network, self.load_path, map_location=self.map_location)
        self.logger.info(f"loaded the network weights from {self.load_path}")
