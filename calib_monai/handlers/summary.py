"""``EpochSummary``: one log line per training epoch."""

from __future__ import annotations

import logging
import time

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

__all__ = ["EpochSummary"]


class EpochSummary:
    """Log one line per epoch: training loss, the evaluator's metrics, learning rate and wall time (MONAI's
    ``StatsHandler`` logs the trainer's own state and reads the loss back every iteration; this sums it on the
    device and reads it once per epoch)::

        epoch 3/100  loss 0.4123  val_mean_dice 0.8120  val_ece 0.0710  lr 1.0e-03  time 12.3 s

    Args:
        evaluator: the validation engine whose ``state.metrics`` are reported (None: training loss only).
        optimizer: the learning rate of the epoch (first parameter group, read when the epoch starts).
        metric_names: evaluator metrics to print, in order; default: all of them, sorted.
    """

    def __init__(
        self,
        evaluator: Engine | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        metric_names: list[str] | None = None,
    ) -> None:
        self.evaluator = evaluator
        self.optimizer = optimizer
        self.metric_names = metric_names
        self.logger = logging.getLogger("calib_monai")
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
