"""The Augmented Lagrangian outer step of CRaC as an Ignite handler on the trainer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from calib_monai.losses.crac import REGIONS, CRaCLoss

__all__ = ["ALMUpdateHandler"]


def _image_and_label(batch: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return batch["image"].to(device), batch["label"].to(device)


class ALMUpdateHandler:
    """After each training epoch, update a :class:`~calib_monai.losses.CRaCLoss`'s multipliers on validation data.

    With the network in eval mode and no gradients, it runs ``val_data_loader`` through ``inferer`` (e.g. MONAI's
    ``SliceInferer`` for whole volumes and a 2D network), sums :meth:`CRaCLoss.validation_statistics` over all
    batches (3D outputs of a 2D loss are cut into axial slices, the last axis, as the network saw them in training),
    all-reduces the sums across DDP ranks so every rank gets identical multipliers, then calls
    :meth:`CRaCLoss.outer_update`. It logs one line per epoch with lambda, rho and the mean constraint of every
    (class, region), and puts them in ``engine.state.metrics`` (``alm_lambda_<k>_<region>``, ``alm_rho_...``,
    ``alm_constraint_...``) so that an epoch-level ``TensorBoardStatsHandler`` attached after it plots them.

    The multipliers live in the loss's buffers: checkpoint the loss (e.g. ``TrainingCheckpoint(extra={"loss": loss})``)
    and a resumed run continues with them.

    Args:
        loss: the CRaC loss the trainer optimises.
        network: the trained network.
        val_data_loader: validation batches (dicts with "image" and "label" unless ``prepare_batch`` says otherwise).
        inferer: ``inferer(inputs, network)`` -> logits; None calls the network directly.
        prepare_batch: ``(batch, device) -> (image, label)``.
        device: where inference runs (default: the device of the network's parameters).
        class_names: names for the log line (default: class indices).
    """

    def __init__(
        self,
        loss: CRaCLoss,
        network: torch.nn.Module,
        val_data_loader: Iterable,
        inferer: Callable | None = None,
        prepare_batch: Callable = _image_and_label,
        device: str | torch.device | None = None,
        class_names: list[str] | None = None,
        logger_name: str = "calib_monai",
    ) -> None:
        if not isinstance(loss, CRaCLoss):
            raise ValueError(f"ALMUpdateHandler needs a CRaCLoss, got {type(loss).__name__}.")
        self.loss = loss
        self.network = network
        self.val_data_loader = val_data_loader
        self.inferer = inferer
        self.prepare_batch = prepare_batch
        self.device = device
        self.class_names = class_names or [str(k) for k in range(loss.classes)]
        self.logger = logging.getLogger(logger_name)

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)

    def _as_loss_input(self, logits: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if logits.ndim - 2 == self.loss.dim + 1:  # a volume for a 2D loss: slices along the last axis
            logits = logits.movedim(-1, 1).flatten(0, 1)
            label = label.movedim(-1, 1).flatten(0, 1)
        return logits, label

    def collect_statistics(self) -> torch.Tensor:
        """Summed validation statistics ``(3, K, 2)`` over this rank's batches, all-reduced across ranks."""
        device = self.device or next(self.network.parameters()).device
        was_training = self.network.training
        self.network.eval()
        stats = torch.zeros(3, self.loss.classes, 2, dtype=torch.float64, device=device)
        try:
            with torch.no_grad():
                for batch in self.val_data_loader:
                    image, label = self.prepare_batch(batch, device)
                    logits = self.inferer(image, self.network) if self.inferer is not None else self.network(image)
                    logits, label = self._as_loss_input(torch.as_tensor(logits), torch.as_tensor(label))
                    stats += self.loss.validation_statistics(logits, label)
        finally:
            self.network.train(was_training)
        if idist.get_world_size() > 1:
            stats = idist.all_reduce(stats)
        return stats

    def __call__(self, engine: Engine) -> None:
        result = self.loss.outer_update(self.collect_statistics(), engine.state.epoch)
        parts = []
        for k, name in enumerate(self.class_names):
            for r, region in enumerate(REGIONS):
                lam, rho, h = (float(result[key][k, r]) for key in ("lambda", "rho", "constraint"))
                engine.state.metrics[f"alm_lambda_{k}_{region}"] = lam
                engine.state.metrics[f"alm_rho_{k}_{region}"] = rho
                engine.state.metrics[f"alm_constraint_{k}_{region}"] = h
                parts.append(f"{name}/{region} lambda {lam:.3g} rho {rho:.3g} h {h:.3g}")
        self.logger.info(f"ALM outer step {int(self.loss.outer_steps)} (epoch {engine.state.epoch}): " + "; ".join(parts))
