"""Temperature scaling (Guo C. et al., On Calibration of Modern Neural Networks, ICML 2017).

``softmax(z / T)`` with one scalar ``T > 0`` that minimises the negative log-likelihood of held-out voxels. Dividing
every logit by the same positive number keeps their order, so the argmax (the segmentation, DSC, HD95) is unchanged.
Log-probabilities are valid logits here (``softmax(log p) = p``), so the same fit recalibrates saved probabilities.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.nn import functional as F

from calib_monai.checks import check_option
from calib_monai.defaults import MAX_VOXELS, RECALIBRATION_VOXELS

__all__ = [
    "TemperatureScaling",
    "calibration_voxels",
    "check_voxels",
    "fit_temperature",
    "sample_voxels",
    "temperature_scale",
]

VOXEL_CHOICES = ("foreground", "all")
TEMPERATURE_RANGE = (0.01, 100.0)
LOG_FLOOR = 1e-12  # saved probabilities are clamped to it before the log
logger = logging.getLogger("calib_monai")


def sample_voxels(
    logits: torch.Tensor, labels: torch.Tensor, max_voxels: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded sample of at most ``max_voxels`` rows of ``logits (N, C)`` and ``labels (N,)`` (all when fewer)."""
    if logits.shape[0] <= max_voxels:
        return logits, labels
    keep = torch.randperm(logits.shape[0], generator=torch.Generator().manual_seed(seed))[:max_voxels]
    return logits[keep.to(logits.device)], labels[keep.to(labels.device)]


def calibration_voxels(
    volumes: Iterable[tuple[torch.Tensor, torch.Tensor]],
    voxels: str = RECALIBRATION_VOXELS,
    max_voxels: int = MAX_VOXELS,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``(N, C)`` and labels ``(N,)`` of at most ``max_voxels`` voxels of ``(logits (C, *spatial), label
    (*spatial))`` volumes, the same seeded share from each: ``"foreground"`` (label > 0, where the papers' ECE is
    measured) or ``"all"`` (the NLL is then dominated by easy background voxels)."""
    check_option("calibration voxels", voxels, VOXEL_CHOICES)
    volumes = list(volumes)
    generator = torch.Generator().manual_seed(seed)
    share = max(1, int(max_voxels) // max(1, len(volumes)))
    logits, labels = [], []
    for z, y in volumes:
        z, y = z.reshape(z.shape[0], -1).T, y.reshape(-1).long()
        if voxels == "foreground":
            z, y = z[y > 0], y[y > 0]
        if z.shape[0] > share:
            keep = torch.randperm(z.shape[0], generator=generator)[:share]
            z, y = z[keep], y[keep]
        logits.append(z)
        labels.append(y)
    return torch.cat(logits), torch.cat(labels)


_FLAT = (
    "the logits carry next to no information on these voxels (e.g. a network that predicts background on all "
    "ground-truth foreground voxels): check the model, or fit on every voxel (--calibration_voxels all)"
)
_SHARP = "the voxels are all classified correctly with room to sharpen"


def check_voxels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    """``logits (N, C)`` with ``N > 0`` finite rows and ``labels (N,)`` in ``[0, C)``, else a ValueError saying
    which."""
    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"need logits (N, C) and labels (N,), got {tuple(logits.shape)} and {tuple(labels.shape)}")
    if logits.shape[0] == 0:
        raise ValueError("no voxels to fit a temperature on")
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("the logits hold NaN or inf values; a temperature cannot be fitted on them")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= logits.shape[1]:
        raise ValueError(
            f"labels must lie in [0, {logits.shape[1]}) for {logits.shape[1]} classes, got [{low}, {high}]"
        )


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, max_iter: int = 100) -> float:
    """The temperature minimising ``NLL(softmax(logits / T), labels)`` for ``logits (N, C)`` (or log-probabilities)
    and ``labels (N,)``, by L-BFGS on ``log T``, clipped to :data:`TEMPERATURE_RANGE` with a warning (labels the
    logits never predict drive ``T -> inf``)."""
    check_voxels(logits, labels)
    logits = logits.detach().double()
    labels = labels.detach().long().to(logits.device)
    log_t = torch.zeros((), dtype=torch.float64, device=logits.device, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    temperature = float(log_t.detach().exp())
    low, high = TEMPERATURE_RANGE
    if not low <= temperature <= high:
        # NLL is convex in 1 / T, so the bound is the best temperature within the range
        logger.warning(
            f"the fitted temperature {temperature:.3g} lies outside [{low}, {high}] and is clipped to it: "
            f"{_FLAT if temperature > high else _SHARP}"
        )
        temperature = min(max(temperature, low), high)
    return temperature


class TemperatureScaling(nn.Module):
    """``logits / T`` for logits ``(N, C, *spatial)``; ``T`` is a buffer (it travels in the ``state_dict``).
    ``forward(logits, image=None)``: the calibration modules' signature; TorchScript-able."""

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        self.register_buffer("temperature", torch.tensor(float(temperature)))

    def forward(self, logits: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
        return logits / self.temperature.to(logits.dtype)

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> TemperatureScaling:
        """Fit ``T`` on voxels: ``logits (N, C)``, ``labels (N,)`` (:func:`fit_temperature`)."""
        self.temperature.fill_(fit_temperature(logits, labels))
        return self

    def extra_repr(self) -> str:
        return f"temperature={float(self.temperature):.4f}"


def temperature_scale(probabilities: torch.Tensor, temperature: float, dim: int = 0) -> torch.Tensor:
    """``softmax(log(max(p, 1e-12)) / T)`` along ``dim``: temperature scaling of saved probabilities."""
    return torch.softmax(TemperatureScaling(temperature)(probabilities.clamp_min(LOG_FLOOR).log()), dim=dim)
