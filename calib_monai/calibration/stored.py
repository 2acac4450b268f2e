"""A fitted calibration stored next to a bundle's weights, and applied wherever the bundle's logits become
probabilities: ``evaluate`` and ``inference`` (the :class:`CalibrateLogitsd` transform before the softmax), the
exported ``segmentation_confidence`` modules and MONAI Label (through ``inference.json``).

``<models>/calibration.pt`` holds the method, the module's ``state_dict``, what it was fitted on and the SHA-256 of
the ``model.pt`` it was fitted for; a calibration is never applied to other weights (a retrained bundle must be
calibrated again). ``<models>/calibration.json`` repeats the same facts for people to read.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import torch
from monai.transforms import MapTransform
from torch import nn

from calib_monai.atomic import save_atomically, write_json_atomically
from calib_monai.bundle.weights import read_weights_file

from .local_temperature import LocalTemperatureScaling
from .temperature import TemperatureScaling

__all__ = [
    "CALIBRATION_FILE",
    "CalibrateLogitsd",
    "CalibratedNetwork",
    "Uncalibrated",
    "calibrate_volume",
    "file_sha256",
    "load_calibration",
    "save_calibration",
]

logger = logging.getLogger(__name__)
CALIBRATION_FILE = "calibration.pt"
METHODS = {"temperature": TemperatureScaling, "local_temperature": LocalTemperatureScaling}


class Uncalibrated(nn.Module):
    """The identity with the calibration modules' signature (so a scripted model always has one)."""

    def forward(self, logits: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
        return logits


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _method(module: nn.Module) -> str:
    for name, cls in METHODS.items():
        if type(module) is cls:
            return name
    raise TypeError(f"can store {list(METHODS)} modules, got {type(module).__name__}")


def save_calibration(module: nn.Module, path: str | os.PathLike, weights: str | os.PathLike, **info: Any) -> Path:
    """Write ``module`` (fitted for the network weights file ``weights``) to ``path`` atomically, and the readable
    ``calibration.json`` beside it; ``info`` (fit statistics: voxels, NLL and ECE before and after...) goes in both."""
    path = Path(path)
    method = _method(module)
    record = {"method": method, "weights": str(Path(weights).name), "weights_sha256": file_sha256(weights), **info}
    if isinstance(module, TemperatureScaling):
        record["temperature"] = float(module.temperature)
    else:
        record.update(num_classes=module.num_classes, in_channels=module.in_channels, hidden=module.hidden)
    save_atomically({**record, "state_dict": module.state_dict()}, path)
    write_json_atomically(path.with_suffix(".json"), record)
    return path


def load_calibration(path: str | os.PathLike, weights: str | os.PathLike | None = None) -> nn.Module | None:
    """The calibration module stored at ``path``, or None when there is no such file.

    With ``weights`` (the network's weights file), a calibration fitted for other weights is not applied: a
    warning says so and None is returned."""
    path = Path(path)
    if path.is_dir():
        path = path / CALIBRATION_FILE
    if not path.is_file():
        return None
    fix = "delete it and run the bundle's calibrate step again"
    record = read_weights_file(path, what="a calibration file of calib_monai", fix=fix)  # names what is wrong
    try:
        method = record["method"]
        cls = METHODS[method]
    except Exception as err:
        raise ValueError(
            f"{path} is not a calibration file of calib_monai ({type(err).__name__}: {err}); {fix}"
        ) from err
    if weights is not None and Path(weights).is_file() and record.get("weights_sha256") != file_sha256(weights):
        logger.warning(
            f"{path} was fitted for other weights than {weights} (the model was trained again since): "
            "not applied; run the bundle's calibrate step again"
        )
        return None
    if cls is TemperatureScaling:
        module: nn.Module = TemperatureScaling(record["temperature"])
    else:
        module = LocalTemperatureScaling(record["num_classes"], record["in_channels"], record["hidden"])
    module.load_state_dict(record["state_dict"])
    return module.eval()


class CalibratedNetwork(nn.Module):
    """``calibration(network(x), x)``: a network whose logits come out calibrated (same argmax)."""

    def __init__(self, network: nn.Module, calibration: nn.Module) -> None:
        super().__init__()
        self.network, self.calibration = network, calibration

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.calibration(self.network(x), x)


def calibrate_volume(
    calibration: nn.Module, logits: torch.Tensor, image: torch.Tensor, spatial_dim: int = 2
) -> torch.Tensor:
    """Apply a 2D calibration module to a volume's logits ``(C, H, W, D)`` slice by slice along ``spatial_dim``
    (the slices the 2D network saw), with the image ``(C_in, H, W, D)``; 2D inputs ``(C, H, W)`` go in as they are."""
    if logits.ndim == 3:
        return calibration(logits[None], image[None].to(logits.device))[0]
    axis = spatial_dim + 1
    slices = logits.movedim(axis, 0)
    images = torch.as_tensor(image).to(logits.device).movedim(axis, 0)
    return calibration(slices, images).movedim(0, axis)


class CalibrateLogitsd(MapTransform):
    """Calibrate a volume's logits under ``keys`` (before the softmax); optionally keep the uncalibrated softmax.

    Args:
        keys: the logits ``(C, *spatial)`` (``"pred"``).
        calibration: a calibration module, a ``calibration.pt`` path (or its folder) or None (nothing to apply).
        weights: the network's weights file, to check that a stored calibration was fitted for them.
        image_key: the image, for local temperature scaling.
        uncalibrated_key: where to put ``softmax`` of the logits as they came (the evaluation's "before" numbers);
            None keeps nothing.
        spatial_dim: the slice axis of the 2D network (as ``SliceInferer``).
    """

    def __init__(
        self,
        keys,
        calibration: nn.Module | str | os.PathLike | None = None,
        weights: str | os.PathLike | None = None,
        image_key: str = "image",
        uncalibrated_key: str | None = None,
        spatial_dim: int = 2,
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        if isinstance(calibration, (str, os.PathLike)):
            calibration = load_calibration(calibration, weights)
        self.calibration = calibration
        self.image_key, self.uncalibrated_key, self.spatial_dim = image_key, uncalibrated_key, spatial_dim
        if calibration is not None:
            logger.info(f"logits calibrated with {calibration}")

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            logits = d[key]
            if self.uncalibrated_key is not None:
                d[self.uncalibrated_key] = torch.softmax(logits.float(), dim=0)
            if self.calibration is not None:
                with torch.no_grad():
                    module = self.calibration.to(logits.device)
                    d[key] = calibrate_volume(module, logits, d.get(self.image_key), self.spatial_dim)
        return d
