"""Model selection: :func:`select_epoch` is the one rule of which epoch becomes ``model.pt``;
:class:`ModelSelection` applies it while training, studies afterwards to ``validation_history.json``."""

from __future__ import annotations

import difflib
import logging
import math
import os
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from calib_monai.atomic import save_atomically
from calib_monai.bundle import unwrap_network

__all__ = ["ModelSelection", "select_epoch"]


def _check_mode(mode: Any) -> None:
    if mode not in ("max", "min"):
        raise ValueError(f"selection mode must be 'max' or 'min' (higher or lower is better), got {mode!r}.")


def _within_bounds(metrics: dict[str, Any], bounds: dict[str, float]) -> bool:
    missing = [name for name in bounds if name not in metrics]
    if missing:
        raise KeyError(
            f"selection bounds name {missing}, which the evaluator does not compute; its metrics are {sorted(metrics)}"
        )
    return all(float(metrics[name]) <= bound for name, bound in bounds.items())


def _better(value: float, within: bool, best: float, best_within: bool, mode: str) -> bool:
    """The selection rule: an epoch within the bounds beats any epoch outside them; otherwise the metric decides
    (strictly, so the earliest of equal epochs stays)."""
    if not math.isfinite(value):
        return False
    if within != best_within:
        return within
    return value > best if mode == "max" else value < best


def select_epoch(
    history: list[dict[str, Any]],
    metric_name: str = "val_mean_dice",
    mode: str = "max",
    bounds: dict[str, float] | None = None,
) -> int:
    """The epoch :class:`ModelSelection` with this rule saves as ``model.pt``, from a run's validation history (one
    dict per validated epoch: ``"epoch"`` and the metrics); -1 when no epoch has a finite ``metric_name``."""
    _check_mode(mode)
    bounds = {str(k): float(v) for k, v in (bounds or {}).items()}
    best, best_within, best_epoch = (-math.inf if mode == "max" else math.inf), False, -1
    for entry in history:
        if metric_name not in entry:
            continue
        value, within = float(entry[metric_name]), _within_bounds(entry, bounds)
        if _better(value, within, best, best_within, mode):
            best, best_within, best_epoch = value, within, int(entry["epoch"])
    return best_epoch


class ModelSelection:
    """Write the network of the best epoch so far as ``model.pt`` (a plain ``state_dict``, unwrapped from DDP, by rank
    0) after each validation.

    The rule (:func:`select_epoch`): the highest ``evaluator.state.metrics[metric_name]`` (``mode="max"``; ``"min"``
    for NLL or ECE), the earliest of equal epochs; with ``bounds`` (``{"val_ece": 0.05}``) epochs within them come
    first, and until one is the best regardless of them is kept and the log says so. A ``metric_name`` the evaluator
    does not compute is an error at the first validation. Attach after MONAI's ``ValidationHandler``; resumable as
    ``TrainingCheckpoint(extra={"selection": ...})``.

    Args:
        save_dir: folder of ``model.pt``.
        network: the trained network.
        evaluator: the validation engine holding ``metric_name``.
        metric_name, mode, bounds: the rule.
    """

    def __init__(
        self,
        save_dir: str | os.PathLike,
        network: torch.nn.Module,
        evaluator: Engine,
        metric_name: str = "val_mean_dice",
        mode: str = "max",
        bounds: dict[str, float] | None = None,
    ) -> None:
        _check_mode(mode)
        self.best_path = Path(save_dir) / "model.pt"
        self.network, self.evaluator = network, evaluator
        self.metric_name, self.mode = metric_name, mode
        self.bounds = {str(k): float(v) for k, v in (bounds or {}).items()}
        self.logger = logging.getLogger("calib_monai")
        self.best_metric = -math.inf if mode == "max" else math.inf
        self.best_metric_epoch = -1
        self.best_within_bounds = False

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)
        engine.add_event_handler(Events.COMPLETED, self._report)

    def state_dict(self) -> dict[str, Any]:
        return {
            "best_metric": self.best_metric,
            "best_metric_epoch": self.best_metric_epoch,
            "best_within_bounds": self.best_within_bounds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_metric = float(state["best_metric"])
        self.best_metric_epoch = int(state["best_metric_epoch"])
        self.best_within_bounds = bool(state["best_within_bounds"])

    def __call__(self, engine: Engine) -> None:
        metrics = self.evaluator.state.metrics
        if idist.get_rank() > 0 or not metrics:  # no validation this epoch (val_interval > 1)
            return
        if self.metric_name not in metrics:
            close = difflib.get_close_matches(self.metric_name, list(metrics), n=1)
            raise ValueError(
                f"selection_metric {self.metric_name!r} is not a metric of the validation"
                f"{f' (did you mean {close[0]!r}?)' if close else ''}: it computes {sorted(metrics)}; pass "
                "--selection_metric <one of them>"
            )
        value, within = float(metrics[self.metric_name]), _within_bounds(metrics, self.bounds)
        if _better(value, within, self.best_metric, self.best_within_bounds, self.mode):
            self.best_metric, self.best_metric_epoch, self.best_within_bounds = value, engine.state.epoch, within
            save_atomically(unwrap_network(self.network).state_dict(), self.best_path)
            note = "" if within else f" (no epoch within {self.bounds} yet: the best regardless of them)"
            self.logger.info(
                f"new best {self.metric_name} {value:.4f} at epoch {engine.state.epoch}: {self.best_path}{note}"
            )

    def _report(self, engine: Engine) -> None:
        if self.best_metric_epoch > 0 and idist.get_rank() == 0:
            self.logger.info(
                f"training finished: best {self.metric_name} {self.best_metric:.4f} at epoch "
                f"{self.best_metric_epoch}; best model {self.best_path}"
            )
