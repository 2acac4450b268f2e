"""Post-hoc calibration fitted on the validation volumes: temperature scaling and local temperature scaling.

* Temperature scaling (Guo C. et al., On Calibration of Modern Neural Networks, ICML 2017): ``softmax(z / T)``,
  one scalar ``T > 0`` minimising the NLL of the validation voxels. Argmax, hence DSC and HD95, is unchanged.
* Local temperature scaling (Ding Z. et al., Local Temperature Scaling for Probability Calibration, ICCV 2021):
  ``softmax(z / T(x))`` with a per-pixel temperature predicted from the logits and the image by a small CNN, fitted
  on the validation slices by NLL. This is a small version of the paper's network (two 3x3 convolutions, applied
  to 2D slices like the segmentation network); argmax is unchanged as ``T(x) > 0``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from calib_monai.calibration import fit_temperature, sample_voxels
from calib_monai.experiments.evaluation import EvaluatedVolume

__all__ = ["LocalTemperatureScaling", "TemperatureScaling"]


def _voxels(volumes: Sequence[EvaluatedVolume], max_voxels: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``(N, C)`` and labels ``(N,)`` of all voxels (a seeded sample of ``max_voxels`` when more)."""
    logits = torch.cat([v.logits.reshape(v.logits.shape[0], -1).T for v in volumes])
    labels = torch.cat([v.label.reshape(-1) for v in volumes])
    return sample_voxels(logits, labels, max_voxels, seed)


class TemperatureScaling:
    """One temperature for all voxels (:func:`calib_monai.calibration.fit_temperature`)."""

    def __init__(self, max_voxels: int = 2_000_000, seed: int = 0) -> None:
        self.max_voxels, self.seed = int(max_voxels), int(seed)
        self.temperature = 1.0

    def fit(self, volumes: Sequence[EvaluatedVolume]) -> TemperatureScaling:
        self.temperature = fit_temperature(*_voxels(volumes, self.max_voxels, self.seed))
        return self

    def __call__(self, volume: EvaluatedVolume) -> torch.Tensor:
        return torch.softmax(volume.logits / self.temperature, dim=0)


class _TemperatureNet(nn.Module):
    def __init__(self, channels: int, hidden: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, hidden, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(hidden, hidden, 3, padding=1), nn.ReLU(), nn.Conv2d(hidden, 1, 1))  # fmt: skip
        nn.init.zeros_(self.body[-1].weight)
        nn.init.constant_(self.body[-1].bias, 0.5413)  # softplus(0.5413) + 0.05 = 1.05: starts near T = 1

    def forward(self, logits: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return F.softplus(self.body(torch.cat([logits, image], dim=1))) + 0.05


class LocalTemperatureScaling:
    """A per-pixel temperature ``T(x) = softplus(CNN([logits, image])) + 0.05`` fitted on validation slices.

    Args:
        steps: Adam steps (batches of ``batch_size`` random validation slices).
        lr: Adam learning rate.
        seed: seed of the initialisation and the batches.
    """

    def __init__(self, steps: int = 300, batch_size: int = 16, lr: float = 1e-2, seed: int = 0) -> None:
        self.steps, self.batch_size, self.lr, self.seed = int(steps), int(batch_size), float(lr), int(seed)
        self.net: _TemperatureNet | None = None

    @staticmethod
    def _slices(volume: EvaluatedVolume) -> tuple[torch.Tensor, torch.Tensor]:
        # (C, H, W, D) -> (D, C, H, W): the 2D slices the segmentation network saw
        return volume.logits.permute(3, 0, 1, 2), torch.as_tensor(volume.image).float().permute(3, 0, 1, 2)

    def fit(self, volumes: Sequence[EvaluatedVolume]) -> LocalTemperatureScaling:
        pairs = [self._slices(v) for v in volumes]
        logits = torch.cat([p[0] for p in pairs])
        images = torch.cat([p[1] for p in pairs])
        labels = torch.cat([v.label[0].permute(2, 0, 1) for v in volumes])
        torch.manual_seed(self.seed)
        self.net = _TemperatureNet(logits.shape[1] + images.shape[1])
        optimizer = torch.optim.Adam(self.net.parameters(), lr=self.lr)
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(self.steps):
            batch = torch.randint(0, logits.shape[0], (self.batch_size,), generator=generator)
            temperature = self.net(logits[batch], images[batch])
            loss = F.cross_entropy(logits[batch] / temperature, labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        self.net.eval()
        return self

    @torch.no_grad()
    def temperature_map(self, volume: EvaluatedVolume) -> torch.Tensor:
        """``(1, H, W, D)`` temperatures of a volume."""
        if self.net is None:
            raise RuntimeError("LocalTemperatureScaling.fit must run before it is applied")
        logits, image = self._slices(volume)
        return self.net(logits, image).permute(1, 2, 3, 0)

    def __call__(self, volume: EvaluatedVolume) -> torch.Tensor:
        return torch.softmax(volume.logits / self.temperature_map(volume), dim=0)
