"""Small pieces shared by the data set components: argument checks and intensity scaling."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

import torch
from monai.config import KeysCollection
from monai.transforms import MapTransform, ScaleIntensityd, ScaleIntensityRanged, ScaleIntensityRangePercentilesd

__all__ = [
    "ScaleIntensityToUnitd",
    "intensity_scaling",
    "require_file",
]


def require_file(path: Path, what: str) -> str:
    """``str(path)``, or a ValueError naming the missing ``what`` file and where it was expected."""
    if not path.is_file():
        raise ValueError(f"{what} {path} is missing; add the file or remove the case folder {path.parent}")
    return str(path)


def intensity_scaling(intensity: str | Sequence[float], keys: KeysCollection = "image") -> MapTransform:
    """Per volume and channel scaling to [0, 1]; a ValueError for another ``intensity`` than:

    - ``"minmax"``: ``x' = (x - min x) / (max x - min x)``;
    - ``"percentile"``: ``x' = clip((x - p_0.5) / (p_99.5 - p_0.5), 0, 1)``, robust to a few hot voxels;
    - ``(low, high)``: a fixed window, ``x' = clip((x - low) / (high - low), 0, 1)``.
    """
    if isinstance(intensity, str):
        if intensity == "minmax":
            return ScaleIntensityd(keys, minv=0.0, maxv=1.0, channel_wise=True)
        if intensity == "percentile":
            return ScaleIntensityRangePercentilesd(keys, 0.5, 99.5, b_min=0.0, b_max=1.0, clip=True, channel_wise=True)
        raise ValueError(f"intensity must be 'minmax', 'percentile' or a (low, high) window, got {intensity!r}")
    window = [float(v) for v in intensity]
    if len(window) != 2 or window[0] >= window[1]:
        raise ValueError(f"an intensity window must be (low, high) with low < high, got {tuple(intensity)}")
    return ScaleIntensityRanged(keys, a_min=window[0], a_max=window[1], b_min=0.0, b_max=1.0, clip=True)


class ScaleIntensityToUnitd(MapTransform):
    """Scale ``keys`` to [0, 1] by the ``intensity`` rule (``intensity_scaling``): one config item whose argument
    picks the MONAI transform, so that ``--data#intensity percentile`` switches it."""

    def __init__(
        self, keys: KeysCollection, intensity: str | Sequence[float] = "minmax", allow_missing_keys: bool = False
    ):
        super().__init__(keys, allow_missing_keys)
        self.intensity = intensity
        self.scaler = intensity_scaling(intensity, self.keys)
        self.scaler.allow_missing_keys = allow_missing_keys

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> Mapping[Hashable, torch.Tensor]:
        return self.scaler(data)
