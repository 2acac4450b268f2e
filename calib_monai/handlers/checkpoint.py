"""``TrainingCheckpoint``: the resumable state of a training run, written after every epoch and loaded at start."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint

from calib_monai.atomic import save_atomically
from calib_monai.bundle import load_network_weights, read_weights_file, unwrap_network, weights_state_dict

from .rng import capture_rng_state, restore_rng_state

__all__ = ["TrainingCheckpoint"]


def _upgrade(checkpoint: dict[str, Any], extra: dict[str, Any]) -> None:
    """A checkpoint written when one handler kept the best value and the history (top-level ``best_metric``... and a
    ``history`` list) in the layout of the ``selection`` and ``history`` handlers, so that it still resumes."""
    if "selection" in extra and "selection" not in checkpoint and "best_metric" in checkpoint:
        keys = ("best_metric", "best_metric_epoch", "best_within_bounds")
        checkpoint["selection"] = {k: checkpoint[k] for k in keys if k in checkpoint}
    if "history" in extra and isinstance(checkpoint.get("history"), list):
        checkpoint["history"] = {"history": checkpoint["history"]}


class TrainingCheckpoint:
    """Resumable checkpoints for a MONAI ``SupervisedTrainer``.

    At every ``EPOCH_COMPLETED`` it writes ``latest_filename`` (atomically, by DDP rank 0) with the network,
    optimizer, scheduler, trainer state (epoch, iteration), the state of every ``extra`` object (``state_dict`` /
    ``load_state_dict``: CRaC's loss with its multipliers, the ``ModelSelection`` and ``ValidationHistory`` handlers)
    and the random-number state (``calib_monai.handlers.rng``: torch, CUDA, NumPy, Python, the training loader's
    generators and random transforms). At ``STARTED``, when the file exists, everything is loaded back and training
    continues at the next epoch, exactly: killed at any point and resumed, a run ends with the same weights as one
    that was never stopped (same machine and settings; ``tests/test_resume_exact.py``). ``resume=False`` ignores (and
    later overwrites) it. A file that cannot be read (cut off, of another network) is an error naming it and the fix
    (delete it to start over); it is read with ``weights_only=True``.

    Attach it after the handlers whose state it saves (bundle configs list it after them). A DDP network is unwrapped:
    the file holds the plain network's keys, so a multi-GPU run resumes on one GPU and vice versa (``module.``-prefixed
    files of older runs are still read).

    Why not MONAI's ``CheckpointSaver``/``CheckpointLoader`` (which unwrap DDP too)? The interval checkpoints are named
    by epoch (``checkpoint_epoch=N.pt``; a fixed name exists only for the final and the key-metric files), while
    ``CheckpointLoader`` reads one path fixed in the config and fails when it is absent (no "resume when the file
    exists, else start fresh"), and raises on a checkpoint with more epochs than ``max_epochs`` (a shorter
    ``--epochs``) instead of saying there is nothing left to train; MONAI's ``DiskSaver`` is created with
    ``atomic=False`` (a run killed mid-write leaves a truncated file); and neither keeps the random-number state.

    Args:
        save_dir: folder of the file.
        network, optimizer, lr_scheduler: the objects to save and restore.
        extra: more objects with ``state_dict`` / ``load_state_dict``, e.g. ``{"loss": crac_loss, "selection": ...}``.
        latest_filename: the file's name.
        resume: load the file at start when it exists.
    """

    def __init__(
        self,
        save_dir: str | os.PathLike,
        network: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any = None,
        extra: dict[str, Any] | None = None,
        latest_filename: str = "checkpoint_latest.pt",
        resume: bool = True,
        logger_name: str = "calib_monai",
    ) -> None:
        self.latest_path = Path(save_dir) / latest_filename
        self.network, self.optimizer, self.lr_scheduler = network, optimizer, lr_scheduler
        self.extra = dict(extra or {})
        self.resume = resume
        self.logger = logging.getLogger(logger_name)
        self._trainer: Engine | None = None

    def attach(self, engine: Engine) -> None:
        self._trainer = engine
        engine.add_event_handler(Events.STARTED, self.load_latest)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)

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
        fix = (
            f"delete {self.latest_path} to start the run over (model.pt and the validation history are kept until "
            "the new run replaces them), or put back the file of the stopped run"
        )
        checkpoint = read_weights_file(self.latest_path, what="a training checkpoint", fix=fix)
        if isinstance(checkpoint, dict):
            _upgrade(checkpoint, self.extra)
        objects = self._objects()
        missing = (
            [name for name in objects if name not in checkpoint] if isinstance(checkpoint, dict) else list(objects)
        )
        if missing:
            raise ValueError(f"{self.latest_path} is not a checkpoint of this training (it lacks {missing}): {fix}")
        # a file written by an older multi-GPU run holds "module."-prefixed network keys
        load_network_weights(
            objects.pop("network"), weights_state_dict(checkpoint["network"]), name=f"{self.latest_path} (its network)"
        )
        Checkpoint.load_objects(to_load=objects, checkpoint=checkpoint)
        if "rng" in checkpoint:
            restore_rng_state(checkpoint["rng"], engine.state.dataloader)
        else:
            self.logger.warning(
                f"{self.latest_path} holds no random-number state (written by an older version): the "
                "resumed run shuffles differently from an uninterrupted one"
            )
        # the command line may ask for more (or fewer) epochs than the stopped run had
        engine.state.max_epochs = max_epochs
        if engine.state.epoch >= max_epochs:
            self.logger.info(
                f"{self.latest_path} already holds epoch {engine.state.epoch} of {max_epochs}: nothing left to train "
                "(raise --epochs to continue, or delete the file to start over)."
            )
            engine.terminate()
            return
        self.logger.info(f"resuming from {self.latest_path}: epoch {engine.state.epoch} done")

    def __call__(self, engine: Engine) -> None:
        if idist.get_rank() > 0:  # DDP: every rank holds the same weights; rank 0 writes them
            return
        state = {name: obj.state_dict() for name, obj in self._objects().items()}
        state["rng"] = capture_rng_state(engine.state.dataloader)
        save_atomically(state, self.latest_path)
