"""``NetworkWeightsLoader``: load a ``model.pt`` into a network when an engine starts."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Engine, Events

from calib_monai.bundle import load_network_weights

__all__ = ["NetworkWeightsLoader"]


class NetworkWeightsLoader:
    """Load a ``model.pt`` into a network when an engine starts (bundle ``evaluate.json`` and ``inference.json``):
    MONAI's strict ``CheckpointLoader`` through :func:`calib_monai.bundle.load_network_weights`, which also reads
    ``module.``-prefixed files (on which ``CheckpointLoader`` fails with missing keys).

    Args:
        load_path: the weights file: a plain state_dict, a ``module.``-prefixed one, or ``{"model": ...}``.
        network: the network to load into (a DDP wrapper is unwrapped).
        map_location: where the tensors are loaded before they are copied into the network.
    """

    def __init__(
        self,
        load_path: str | os.PathLike,
        network: torch.nn.Module,
        map_location: Any = "cpu",
    ) -> None:
        self.load_path = Path(load_path)
        self.network = network
        self.map_location = map_location
        self.logger = logging.getLogger("calib_monai")

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self)

    def __call__(self, engine: Engine | None = None) -> None:
        if not self.load_path.is_file():
            raise FileNotFoundError(
                f"model weights {self.load_path} not found: train the bundle first, or point "
                "model_path/output_dir at the folder holding model.pt"
            )
        load_network_weights(self.network, self.load_path, map_location=self.map_location)
        self.logger.info(f"loaded the network weights from {self.load_path}")
