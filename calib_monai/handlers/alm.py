"""The Augmented Lagrangian outer step of CRaC as an Ignite handler on the trainer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from calib_monai.losses.crac import REGIONS, STATISTICS_ROWS, CRaCLoss

__all__ = ["ALMUpdateHandler"]


def _sum_over_ranks(stats: torch.Tensor) -> torch.Tensor:
    """All-reduce (sum) across DDP ranks on the backend's device (NCCL reduces CUDA tensors only)."""
    if idist.get_world_size() == 1:
        return stats
    return idist.all_reduce(stats.to(idist.device())).to(stats.device)


def _image_and_label(batch: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return batch["image"].to(device), batch["label"].to(device)


class ALMUpdateHandler:
    """After each training epoch, update a :class:`~calib_monai.losses.CRaCLoss`'s multipliers on validation data.

    The validation logits come from one of two places:

    * ``evaluator`` (what the bundles use): the validation engine the trainer already runs each epoch; its
      postprocessing must keep the raw logits under ``logits_key`` (a ``CopyItemsd`` before the softmax). The
      statistics are summed as the evaluator goes, so validation runs once per epoch, not twice; an epoch without
      validation (``val_interval > 1``) leaves the multipliers as they are.
    * ``val_data_loader``: the handler runs the loader through ``inferer`` itself (e.g. MONAI's ``SliceInferer`` for
      whole volumes and a 2D network), with the network in eval mode and no gradients.

    It sums :meth:`CRaCLoss.validation_statistics` over all volumes (3D outputs of a 2D loss are cut into axial
    slices, the last axis, as the network saw them in training), all-reduces the sums across DDP ranks so every rank gets identical multipliers, then calls
    :meth:`CRaCLoss.outer_update`. It logs one line per epoch with, for every (class, region), lambda, rho, the mean
    constraint ``h = |tau - l|`` and the fraction of validation pixels whose constraint holds (``h <= tolerance``;
    with tolerance 0 only pixels where ``l == tau`` exactly, almost none: the multipliers then can only rise), and
    puts them in ``engine.state.metrics`` (``alm_lambda_<k>_<region>``, ``alm_rho_...``, ``alm_constraint_...``,
    ``alm_satisfied_...``) so that an epoch-level ``TensorBoardStatsHandler`` attached after it plots them.

    The multipliers live in the loss's buffers: checkpoint the loss (e.g. ``TrainingCheckpoint(extra={"loss": loss})``)
    and a resumed run continues with them.

    Args:
        loss: the CRaC loss the trainer optimises.
        network: the trained network (loader mode).
        val_data_loader: validation batches (dicts with "image" and "label" unless ``prepare_batch`` says otherwise).
        evaluator: the validation engine to read logits and labels from, instead of ``val_data_loader``.
        logits_key: where the evaluator's decollated outputs keep the raw logits ``(C, *spatial)``; labels are read
            from "label" (class indices or one-hot).
        inferer: ``inferer(inputs, network)`` -> logits; None calls the network directly.
        prepare_batch: ``(batch, device) -> (image, label)``.
        device: where inference runs (default: the device of the network's parameters).
        class_names: names for the log line (default: class indices).
    """

    def __init__(
        self,
        loss: CRaCLoss,
        network: torch.nn.Module | None = None,
        val_data_loader: Iterable | None = None,
        evaluator: Engine | None = None,
        logits_key: str = "logits",
        inferer: Callable | None = None,
        prepare_batch: Callable = _image_and_label,
        device: str | torch.device | None = None,
        class_names: list[str] | None = None,
        logger_name: str = "calib_monai",
    ) -> None:
        if not isinstance(loss, CRaCLoss):
            raise ValueError(f"ALMUpdateHandler needs a CRaCLoss, got {type(loss).__name__}.")
        if (evaluator is None) == (val_data_loader is None and network is None):
            raise ValueError("ALMUpdateHandler needs either evaluator=... or network=... with val_data_loader=..., "
                             "not both and not neither.")  # fmt: skip
        self.loss = loss
        self.network = network
        self.val_data_loader = val_data_loader
        self.inferer = inferer
        self.prepare_batch = prepare_batch
        self.device = device
        self.class_names = class_names or [str(k) for k in range(loss.classes)]
        self.logger = logging.getLogger(logger_name)
        self.evaluator = evaluator
        self.logits_key = logits_key
        self._stats: torch.Tensor | None = None  # evaluator mode: sums of the current validation run
        self._validated = False  # evaluator mode: the evaluator ran since the last outer step

    def attach(self, engine: Engine) -> None:
        """Run the outer step after each of ``engine``'s epochs; in evaluator mode, also read the evaluator's outputs."""
        if self.evaluator is not None and not self.evaluator.has_event_handler(self._reset, Events.STARTED):
            self.evaluator.add_event_handler(Events.STARTED, self._reset)
            self.evaluator.add_event_handler(Events.ITERATION_COMPLETED, self._add_evaluator_output)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)

    def _reset(self, engine: Engine) -> None:
        self._stats = None  # allocated on the device of the first validation output
        self._validated = True

    def _add_evaluator_output(self, engine: Engine) -> None:
        output = engine.state.output
        for item in output if isinstance(output, list) else [output]:
            logits = torch.as_tensor(item[self.logits_key]).detach()
            label = torch.as_tensor(item["label"]).detach()
            if label.shape[0] > 1:  # one-hot after the evaluator's postprocessing
                label = label.argmax(0, keepdim=True)
            logits, label = self._as_loss_input(logits[None], label[None])
            # the sums stay where the logits are: no host round trip per validation volume
            stats = self.loss.validation_statistics(logits, label)
            self._stats = stats if self._stats is None else self._stats + stats.to(self._stats.device)

    def _as_loss_input(self, logits: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if logits.ndim - 2 == self.loss.dim + 1:  # a volume for a 2D loss: slices along the last axis
            logits = logits.movedim(-1, 1).flatten(0, 1)
            label = label.movedim(-1, 1).flatten(0, 1)
        return logits, label

    def collect_statistics(self) -> torch.Tensor:
        """Summed validation statistics ``(4, K, 2)`` over this rank's batches, all-reduced across ranks."""
        device = self.device or next(self.network.parameters()).device
        was_training = self.network.training
        self.network.eval()
        stats = torch.zeros(STATISTICS_ROWS, self.loss.classes, 2, dtype=torch.float64, device=device)
        try:
            with torch.no_grad():
                for batch in self.val_data_loader:
                    image, label = self.prepare_batch(batch, device)
                    logits = self.inferer(image, self.network) if self.inferer is not None else self.network(image)
                    logits, label = self._as_loss_input(torch.as_tensor(logits), torch.as_tensor(label))
                    stats += self.loss.validation_statistics(logits, label)
        finally:
            self.network.train(was_training)
        return _sum_over_ranks(stats)

    def __call__(self, engine: Engine) -> None:
        if self.evaluator is None:
            stats = self.collect_statistics()
        else:
            if not self._validated:  # validation did not run this epoch (val_interval > 1)
                return
            if self._stats is None:  # this rank saw no validation volume, others may have: add zeros to the sum
                self._stats = torch.zeros(STATISTICS_ROWS, self.loss.classes, 2, dtype=torch.float64,
                                          device=self.loss.lambdas.device)  # fmt: skip
            stats, self._stats, self._validated = _sum_over_ranks(self._stats), None, False
        result = self.loss.outer_update(stats, engine.state.epoch)
        parts = []
        for k, name in enumerate(self.class_names):
            for r, region in enumerate(REGIONS):
                lam, rho, h, ok = (float(result[key][k, r]) for key in ("lambda", "rho", "constraint", "satisfied"))
                engine.state.metrics[f"alm_lambda_{k}_{region}"] = lam
                engine.state.metrics[f"alm_rho_{k}_{region}"] = rho
                engine.state.metrics[f"alm_constraint_{k}_{region}"] = h
                engine.state.metrics[f"alm_satisfied_{k}_{region}"] = ok
                parts.append(f"{name}/{region} lambda {lam:.3g} rho {rho:.3g} h {h:.3g} satisfied {ok:.3g}")
        self.logger.info(f"ALM outer step {int(self.loss.outer_steps)} (epoch {engine.state.epoch}): " + "; ".join(parts))
