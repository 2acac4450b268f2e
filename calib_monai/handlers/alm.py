"""The Augmented Lagrangian outer step of CRaC as an Ignite handler on the trainer."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from calib_monai.atomic import write_json_atomically
from calib_monai.losses.crac import REGIONS, STATISTICS_ROWS, CRaCLoss

__all__ = ["ALMUpdateHandler"]


def _sum_over_ranks(stats: torch.Tensor) -> torch.Tensor:
    """All-reduce (sum) across DDP ranks on the backend's device (NCCL reduces CUDA tensors only)."""
    if idist.get_world_size() == 1:
        return stats
    return idist.all_reduce(stats.to(idist.device())).to(stats.device)


class ALMUpdateHandler:
    """After each validated epoch, CRaC's outer step (:meth:`CRaCLoss.outer_update`) on the validation statistics
    of the trainer's own validation (3D outputs cut into axial slices), summed over DDP ranks; each (class, region)'s
    lambda, rho, mean constraint and satisfied share go to the log, ``engine.state.metrics``
    (``alm_lambda_<k>_<region>``, ...) and ``<save_dir>/alm_history.json``. Checkpoint the loss to resume.

    Args:
        loss: the CRaC loss the trainer optimises.
        evaluator: the validation engine; its decollated outputs keep the raw logits ``(C, *spatial)`` under
            ``"logits"`` (a ``CopyItemsd`` before the softmax) and the labels under ``"label"``.
        class_names: names for the log line and the record (default: class indices).
        save_dir: folder of ``alm_history.json`` (None: no record).
    """

    def __init__(
        self,
        loss: CRaCLoss,
        evaluator: Engine,
        class_names: list[str] | None = None,
        save_dir: str | os.PathLike | None = None,
    ) -> None:
        if not isinstance(loss, CRaCLoss):
            raise ValueError(f"ALMUpdateHandler needs a CRaCLoss, got {type(loss).__name__}.")
        if evaluator is None:
            raise ValueError("ALMUpdateHandler needs evaluator=<the validation engine the trainer runs each epoch>")
        self.loss, self.evaluator = loss, evaluator
        self.class_names = class_names or [str(k) for k in range(loss.classes)]
        self.history_path = Path(save_dir) / "alm_history.json" if save_dir is not None else None
        self.logger = logging.getLogger("calib_monai")
        self._stats: torch.Tensor | None = None  # sums of the current validation run
        self._validated = False  # the evaluator ran since the last outer step

    def attach(self, engine: Engine) -> None:
        """Run the outer step after each of ``engine``'s epochs, from the evaluator's outputs."""
        if not self.evaluator.has_event_handler(self._reset, Events.STARTED):
            self.evaluator.add_event_handler(Events.STARTED, self._reset)
            self.evaluator.add_event_handler(Events.ITERATION_COMPLETED, self._add_evaluator_output)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)

    def _reset(self, engine: Engine) -> None:
        self._stats = None  # allocated on the device of the first validation output
        self._validated = True

    def _add_evaluator_output(self, engine: Engine) -> None:
        output = engine.state.output
        for item in output if isinstance(output, list) else [output]:
            logits = torch.as_tensor(item["logits"]).detach()
            label = torch.as_tensor(item["label"]).detach()
            if label.shape[0] > 1:  # one-hot after the evaluator's postprocessing
                label = label.argmax(0, keepdim=True)
            logits, label = logits[None], label[None]
            if logits.ndim - 2 == self.loss.dim + 1:  # a volume for a 2D loss: slices along the last axis
                logits, label = logits.movedim(-1, 1).flatten(0, 1), label.movedim(-1, 1).flatten(0, 1)
            # the sums stay where the logits are: no host round trip per validation volume
            stats = self.loss.validation_statistics(logits, label)
            self._stats = stats if self._stats is None else self._stats + stats.to(self._stats.device)

    def __call__(self, engine: Engine) -> None:
        if not self._validated:  # validation did not run this epoch (val_interval > 1)
            return
        if self._stats is None:  # this rank saw no validation volume, others may have: add zeros to the sum
            self._stats = torch.zeros(
                STATISTICS_ROWS, self.loss.classes, 2, dtype=torch.float64, device=self.loss.lambdas.device
            )
        stats, self._stats, self._validated = _sum_over_ranks(self._stats), None, False
        result = self.loss.outer_update(stats, engine.state.epoch)
        parts, record = [], {"epoch": engine.state.epoch, "step": int(self.loss.outer_steps), "classes": {}}
        for k, name in enumerate(self.class_names):
            for r, region in enumerate(REGIONS):
                values = {key: float(result[key][k, r]) for key in ("lambda", "rho", "constraint", "satisfied")}
                engine.state.metrics.update({f"alm_{key}_{k}_{region}": v for key, v in values.items()})
                record["classes"].setdefault(name, {})[region] = values
                lam, rho, h, ok = values.values()
                parts.append(f"{name}/{region} lambda {lam:.3g} rho {rho:.3g} h {h:.3g} satisfied {ok:.3g}")
        self.logger.info(f"ALM outer step {record['step']} (epoch {engine.state.epoch}): " + "; ".join(parts))
        if self.history_path is not None and idist.get_rank() == 0:
            self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        """Append the step to the record, keeping the earlier epochs only (a resumed run repeats none)."""
        import json

        history = json.loads(self.history_path.read_text()) if self.history_path.is_file() else []
        history = [r for r in history if r["epoch"] < record["epoch"]] + [record]
        write_json_atomically(self.history_path, history, indent=1)
