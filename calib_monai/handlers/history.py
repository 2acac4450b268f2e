"""``ValidationHistory`` (``validation_history.json``) and ``EpochSnapshots`` (``epoch_<e>.pt``): the records that
let studies apply other selection rules after training (:func:`calib_monai.handlers.select_epoch`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from calib_monai.atomic import save_atomically, write_json_atomically
from calib_monai.bundle import unwrap_network

__all__ = ["EpochSnapshots", "ValidationHistory"]


class ValidationHistory:
    """Append each validated epoch's evaluator metrics to ``<save_dir>/validation_history.json`` (``[{"epoch": e,
    "val_mean_dice": ..., ...}]``, rank 0, atomically); resumable as ``TrainingCheckpoint(extra={"history": ...})``."""

    def __init__(self, save_dir: str | os.PathLike, evaluator: Engine) -> None:
        self.path = Path(save_dir) / "validation_history.json"
        self.evaluator = evaluator
        self.history: list[dict[str, float]] = []

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = list(state["history"])

    def __call__(self, engine: Engine) -> None:
        metrics = self.evaluator.state.metrics
        if idist.get_rank() > 0 or not metrics:
            return
        self.history = [e for e in self.history if e["epoch"] < engine.state.epoch]
        self.history.append({"epoch": engine.state.epoch, **{k: float(v) for k, v in metrics.items()}})
        write_json_atomically(self.path, self.history, indent=1)


class EpochSnapshots:
    """Write every epoch's network as ``<save_dir>/epoch_<e>.pt`` (a plain state_dict, like ``model.pt``; rank 0)."""

    def __init__(self, save_dir: str | os.PathLike, network: torch.nn.Module) -> None:
        self.save_dir, self.network = Path(save_dir), network

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)

    def __call__(self, engine: Engine) -> None:
        if idist.get_rank() == 0:
            save_atomically(unwrap_network(self.network).state_dict(), self.save_dir / f"epoch_{engine.state.epoch}.pt")
