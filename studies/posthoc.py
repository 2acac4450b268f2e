"""Post-hoc calibration fitted on the validation volumes: temperature scaling and local temperature scaling.

* Temperature scaling (Guo C. et al., On Calibration of Modern Neural Networks, ICML 2017): ``softmax(z / T)``,
  one scalar ``T > 0`` minimising the NLL of the validation voxels. Argmax, hence DSC and HD95, is unchanged.
* Local temperature scaling (Ding Z. et al., Local Temperature Scaling for Probability Calibration, ICCV 2021):
  ``softmax(z / T(x))`` with a per-pixel temperature predicted from the logits and the image by a small CNN, fitted
  on the validation slices by NLL (:class:`calib_monai.recalibration.LocalTemperatureScaling`); argmax is unchanged.

Both are the library's modules (``calib_monai.recalibration``, which the bundles' ``calibrate`` step also uses),
wrapped here to take the harness's evaluated volumes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from calib_monai.recalibration import LocalTemperatureScaling as LocalTemperatureModule
from calib_monai.recalibration import calibrate_volume, calibration_voxels, fit_temperature
from studies.evaluation import EvaluatedVolume

__all__ = ["VolumeLocalTemperature", "VolumeTemperature"]


class VolumeTemperature:
    """One temperature for all voxels (:func:`calib_monai.recalibration.fit_temperature`), fitted as the bundles'
    ``calibrate`` step fits it: on the validation volumes' ground-truth foreground voxels by default
    (``voxels="all"``: every voxel), at most ``max_voxels``, the same share from each volume."""

    def __init__(self, max_voxels: int = 2_000_000, seed: int = 0, voxels: str = "foreground") -> None:
        self.max_voxels, self.seed, self.voxels = int(max_voxels), int(seed), voxels
        self.temperature = 1.0

    def fit(self, volumes: Sequence[EvaluatedVolume]) -> VolumeTemperature:
        pairs = ((v.logits, v.label[0]) for v in volumes)
        self.temperature = fit_temperature(*calibration_voxels(pairs, self.voxels, self.max_voxels, self.seed))
        return self

    def __call__(self, volume: EvaluatedVolume) -> torch.Tensor:
        return torch.softmax(volume.logits / self.temperature, dim=0)


class VolumeLocalTemperature:
    """Per-voxel temperatures (:class:`calib_monai.recalibration.LocalTemperatureScaling`) fitted on the validation
    volumes' slices.

    Args:
        steps: Adam steps (batches of ``batch_size`` random validation slices).
        lr: Adam learning rate.
        seed: seed of the initialisation and the batches.
    """

    def __init__(self, steps: int = 300, batch_size: int = 16, lr: float = 1e-2, seed: int = 0) -> None:
        self.steps, self.batch_size, self.lr, self.seed = int(steps), int(batch_size), float(lr), int(seed)
        self.net: LocalTemperatureModule | None = None

    @staticmethod
    def _slices(volume: EvaluatedVolume) -> tuple[torch.Tensor, torch.Tensor]:
        # (C, H, W, D) -> (D, C, H, W): the 2D slices the segmentation network saw
        return volume.logits.permute(3, 0, 1, 2), torch.as_tensor(volume.image).float().permute(3, 0, 1, 2)

    def fit(self, volumes: Sequence[EvaluatedVolume]) -> VolumeLocalTemperature:
        pairs = [self._slices(v) for v in volumes]
        logits = torch.cat([p[0] for p in pairs])
        images = torch.cat([p[1] for p in pairs])
        labels = torch.cat([v.label[0].permute(2, 0, 1) for v in volumes])
        self.net = LocalTemperatureModule(logits.shape[1], images.shape[1])
        self.net.fit(logits, images, labels, self.steps, self.batch_size, self.lr, self.seed)
        return self

    @torch.no_grad()
    def temperature_map(self, volume: EvaluatedVolume) -> torch.Tensor:
        """``(1, H, W, D)`` temperatures of a volume."""
        if self.net is None:
            raise RuntimeError("VolumeLocalTemperature.fit must run before it is applied")
        logits, image = self._slices(volume)
        return self.net.temperature_map(logits, image).permute(1, 2, 3, 0)

    @torch.no_grad()
    def __call__(self, volume: EvaluatedVolume) -> torch.Tensor:
        if self.net is None:
            raise RuntimeError("VolumeLocalTemperature.fit must run before it is applied")
        return torch.softmax(calibrate_volume(self.net, volume.logits, torch.as_tensor(volume.image).float()), dim=0)
