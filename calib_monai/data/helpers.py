"""Small pieces shared by the seed data set components (ACDC, BraTS, KiTS, MRBrainS, PROMISE12, ...)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path

import torch
from monai.config import KeysCollection
from monai.transforms import MapTransform, ScaleIntensityd, ScaleIntensityRanged, ScaleIntensityRangePercentilesd

from calib_monai.data.layouts import layout_error
from calib_monai.data.transforms import CaseDataError, case_filename

__all__ = [
    "CheckChannelsd",
    "ScaleIntensityToUnitd",
    "check_window",
    "existing_root",
    "intensity_scaling",
    "require_file",
]


def existing_root(dataset_dir: str | os.PathLike | None, layouts: Sequence[str]) -> Path | None:
    """``dataset_dir`` resolved; None for None (a preprocessing-only component, for inference: nothing is read); a
    ValueError listing the expected ``layouts`` when it is empty ("", e.g. a forgotten ``--dataset_dir``) or not a
    folder."""
    if dataset_dir is None:
        return None
    if not dataset_dir:
        raise ValueError("dataset_dir is empty; expected:\n  - " + "\n  - ".join(layouts))
    root = Path(dataset_dir).expanduser().resolve()
    if not root.is_dir():
        raise layout_error(root, "does not exist or is not a folder", layouts)
    return root


def require_file(path: Path, what: str) -> str:
    """``str(path)``, or a ValueError naming the missing ``what`` file and where it was expected."""
    if not path.is_file():
        raise ValueError(f"{what} {path} is missing; add the file or remove the case folder {path.parent}")
    return str(path)


def check_window(window: Sequence[float]) -> tuple[float, float]:
    """A CT ``window`` (HU) as ``(low, high)`` floats, or a ValueError."""
    values = tuple(float(w) for w in window)
    if len(values) != 2 or not -math.inf < values[0] < values[1] < math.inf:
        raise ValueError(
            f"window must be (low, high) finite HU with low < high, got {tuple(window)}: pass e.g. "
            '--data#window "[-160,240]"'
        )
    return values


def intensity_scaling(intensity: str | Sequence[float], keys: KeysCollection = "image") -> list[Callable]:
    """Per volume and channel scaling to [0, 1]: ``"minmax"``, ``"percentile"`` (0.5/99.5, clipped) or a fixed
    ``(low, high)`` window (clipped), as ``MSDDataset``; a ValueError for anything else."""
    if isinstance(intensity, str):
        if intensity == "minmax":
            return [ScaleIntensityd(keys, minv=0.0, maxv=1.0, channel_wise=True)]
        if intensity == "percentile":
            return [
                ScaleIntensityRangePercentilesd(
                    keys, lower=0.5, upper=99.5, b_min=0.0, b_max=1.0, clip=True, channel_wise=True
                )
            ]
        raise ValueError(f"intensity must be 'minmax', 'percentile' or a (low, high) window, got {intensity!r}")
    window = [float(v) for v in intensity]
    if len(window) != 2 or window[0] >= window[1]:
        raise ValueError(f"an intensity window must be (low, high) with low < high, got {tuple(intensity)}")
    return [ScaleIntensityRanged(keys, a_min=window[0], a_max=window[1], b_min=0.0, b_max=1.0, clip=True)]


class ScaleIntensityToUnitd(MapTransform):
    """Scale ``keys`` to [0, 1] by the rule that a data set's ``intensity`` argument names (``intensity_scaling``):

    - ``"minmax"``: ``ScaleIntensityd``, ``x' = (x - min x) / (max x - min x)`` per volume and channel;
    - ``"percentile"``: ``ScaleIntensityRangePercentilesd``, ``x' = clip((x - p_0.5) / (p_99.5 - p_0.5), 0, 1)`` per
      volume and channel, robust to a few hot voxels;
    - ``(low, high)``: ``ScaleIntensityRanged``, a fixed window ``x' = clip((x - low) / (high - low), 0, 1)``.

    One config item whose argument picks the MONAI transform, so that ``--data#intensity percentile`` still switches it.
    """

    def __init__(
        self, keys: KeysCollection, intensity: str | Sequence[float] = "minmax", allow_missing_keys: bool = False
    ):
        super().__init__(keys, allow_missing_keys)
        self.intensity = intensity
        (self.scaler,) = intensity_scaling(intensity, self.keys)
        self.scaler.allow_missing_keys = allow_missing_keys

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> Mapping[Hashable, torch.Tensor]:
        return self.scaler(data)


class CheckChannelsd(MapTransform):
    """Raise a ``CaseDataError`` naming the file when ``data[key]`` does not have ``len(names)`` channels."""

    def __init__(self, key: str, names: Sequence[str], source: str):
        super().__init__(key)
        self.key, self.names, self.source = key, tuple(names), source

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> Mapping[Hashable, torch.Tensor]:
        channels = int(data[self.key].shape[0])
        if channels != len(self.names):
            raise CaseDataError(
                f"{self.key} {case_filename(data, self.key)} has {channels} channel(s); {self.source} "
                f"expects {len(self.names)} ({', '.join(self.names)}): check the modality files"
            )
        return data
