"""Small pieces shared by the seed data set components (ACDC, BraTS, KiTS, MRBrainS, PROMISE12, ...)."""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path

import torch
from monai.transforms import (
    MapTransform,
    Resized,
    ScaleIntensityd,
    ScaleIntensityRanged,
    ScaleIntensityRangePercentilesd,
    Spacingd,
)

from calib_monai.data.layouts import layout_error
from calib_monai.data.transforms import CaseDataError, case_filename

__all__ = ["CheckChannelsd", "in_plane_spacing", "intensity_scaling", "existing_root", "resize", "require_file"]


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


def intensity_scaling(intensity: str | Sequence[float], key: str = "image") -> list[Callable]:
    """Per volume and channel scaling to [0, 1]: ``"minmax"``, ``"percentile"`` (0.5/99.5, clipped) or a fixed
    ``(low, high)`` window (clipped), as ``MSDDataset``."""
    if isinstance(intensity, str):
        if intensity == "minmax":
            return [ScaleIntensityd(key, minv=0.0, maxv=1.0, channel_wise=True)]
        if intensity == "percentile":
            return [ScaleIntensityRangePercentilesd(key, lower=0.5, upper=99.5, b_min=0.0, b_max=1.0, clip=True,
                                                    channel_wise=True)]  # fmt: skip
        raise ValueError(f"intensity must be 'minmax', 'percentile' or a (low, high) window, got {intensity!r}")
    low, high = (float(v) for v in intensity)
    if low >= high:
        raise ValueError(f"an intensity window must be (low, high) with low < high, got {tuple(intensity)}")
    return [ScaleIntensityRanged(key, a_min=low, a_max=high, b_min=0.0, b_max=1.0, clip=True)]


def resize(keys: tuple[str, ...], size: Sequence[int]) -> list[Callable]:
    """Resize to ``size`` (``-1`` keeps an axis): linear image (anti-aliased when shrinking), nearest label."""
    modes = tuple("nearest" if k == "label" else "trilinear" for k in keys)
    return [Resized(keys, spatial_size=tuple(int(s) for s in size), mode=modes, anti_aliasing=tuple(k != "label"
                                                                                                    for k in keys))]


def in_plane_spacing(keys: tuple[str, ...], spacing: float) -> list[Callable]:
    """Resample the two in-plane axes to ``spacing`` mm and keep each volume's slice spacing (thick-slice MRI)."""
    s = float(spacing)
    modes = tuple("nearest" if k == "label" else "bilinear" for k in keys)
    # min/max_pixdim: an axis whose spacing lies in [min, max] keeps it; the slice axis always does
    return [Spacingd(keys, pixdim=(s, s, 1.0), min_pixdim=(s, s, 1e-6), max_pixdim=(s, s, 1e6), mode=modes,
                     dtype=torch.float32)]  # fmt: skip


class CheckChannelsd(MapTransform):
    """Raise a ``CaseDataError`` naming the file when ``data[key]`` does not have ``len(names)`` channels."""

    def __init__(self, key: str, names: Sequence[str], source: str):
        super().__init__(key)
        self.key, self.names, self.source = key, tuple(names), source

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> Mapping[Hashable, torch.Tensor]:
        channels = int(data[self.key].shape[0])
        if channels != len(self.names):
            raise CaseDataError(f"{self.key} {case_filename(data, self.key)} has {channels} channel(s); {self.source} "
                                f"expects {len(self.names)} ({', '.join(self.names)}): check the modality files")
        return data
