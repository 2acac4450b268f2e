"""``EpochSummary``: one log line per training epoch; ``InferenceSummary``: one when ``inferring`` ends."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

__all__ = ["EpochSummary", "InferenceSummary"]


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


class InferenceSummary:
    """Log one line when ``inferring`` ends: how many cases it wrote and where, how many the review flagged or could
    not judge, and the site monitor's verdict, read from each case's quality (``CaseQualityd``'s, in the evaluator's
    post-processed output). MONAI's evaluator ends without a word; this line points a user at what to open::

        wrote 40 cases to out: the review flagged 3 and could not judge 0 (quality.csv); site monitor: no alarm
        after 40 cases (out/site.json)

    Args:
        output_dir: where the cases were written (the bundle's ``output_dir``).
        quality_key: the case quality's key in each output item.
    """

    def __init__(self, output_dir: str | os.PathLike, quality_key: str = "quality") -> None:
        self.output_dir, self.quality_key = str(output_dir), quality_key
        self.logger = logging.getLogger("calib_monai")
        self.flags: list = []
        self.site: Mapping | None = None
        self.unjudged_why = ""

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self._reset)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._count)
        engine.add_event_handler(Events.COMPLETED, self)

    def _reset(self, engine: Engine) -> None:
        self.flags, self.site, self.unjudged_why = [], None, ""

    def _count(self, engine: Engine) -> None:
        output = engine.state.output
        for item in output if isinstance(output, list) else [output]:
            quality = item.get(self.quality_key) if isinstance(item, Mapping) else None
            if not isinstance(quality, Mapping):
                self.flags.append("no quality")
                continue
            review = quality.get("review") or {}
            self.flags.append(review.get("flag"))
            if review.get("flag") is None and review.get("reasons"):
                self.unjudged_why = str(review["reasons"][0])
            self.site = quality.get("site") if isinstance(quality.get("site"), Mapping) else self.site

    def __call__(self, engine: Engine) -> None:
        if idist.get_rank() > 0:
            return
        line = f"wrote {len(self.flags)} case{'s' * (len(self.flags) != 1)} to {self.output_dir}"
        if self.flags and all(flag == "no quality" for flag in self.flags):
            line += ": no estimated DSC or review flag (the bundle's postprocessing has no CaseQualityd)"
        elif self.flags:
            flagged, unjudged = self.flags.count(True), self.flags.count(None)
            line += f": the review flagged {flagged} and could not judge {unjudged} (quality.csv)"
            if unjudged == len(self.flags):  # one cause for all, as a rule: say it
                line += f", {self.unjudged_why}" if self.unjudged_why else ""
        if self.site and self.site.get("monitored"):
            verdict = f"ALARM, {self.site.get('message')}" if self.site.get("alarm") else "no alarm"
            line += f"; site monitor: {verdict} after {self.site.get('cases')} cases ({self.site.get('file')})"
        self.logger.info(line)
