"""The 2D slices the papers train on, served from cached preprocessed 3D volumes
(:class:`~calib_monai.data.volumes.VolumeSegmentationData`'s training set)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from monai.data import MetaTensor
from torch.utils.data import Dataset

__all__ = ["SliceDataset"]


def _plain(x) -> torch.Tensor:
    return x.as_tensor() if isinstance(x, MetaTensor) else torch.as_tensor(x)


class SliceDataset(Dataset):
    """All 2D slices along the last axis of the volumes of ``volumes`` (a dataset of 3D ``{"image", "label"}`` dicts).

    Item ``i`` is slice ``k`` of volume ``v`` in volume-major order. Slices are plain tensors (no meta data): the
    volume's affine does not describe a 2D slice. ``volumes`` should be a fully cached ``CacheDataset`` (the
    component's preprocessing is deterministic, so a slice costs an index); an uncached volume is recomputed for each
    of its slices.

    Args:
        volumes: dataset of preprocessed 3D volumes, image ``(C, H, W, D)`` and label ``(1, H, W, D)``.
        transform: optional callable applied to each slice dict (e.g. 2D augmentation).
        drop_empty: keep only the slices whose label has foreground (BraTS: "slices containing only background are
            removed from the training").
    """

    def __init__(self, volumes: Dataset, transform: Callable | None = None, drop_empty: bool = False):
        self.volumes = volumes
        self.transform = transform
        self.drop_empty = bool(drop_empty)
        self.index: list[tuple[int, int]] = []
        for v in range(len(volumes)):
            volume = volumes[v]
            if self.drop_empty:
                label = _plain(volume["label"])
                keep = label.reshape(-1, label.shape[-1]).gt(0).any(0).nonzero().reshape(-1).tolist()
                self.index.extend((v, int(k)) for k in keep)
            else:
                self.index.extend((v, k) for k in range(int(volume["image"].shape[-1])))

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        v, k = self.index[i]
        volume = self.volumes[v]
        # plain tensors: a 2D slice has no meaningful 3D affine, and MetaTensor collation costs time per batch
        item = {key: _plain(volume[key])[..., k].clone() for key in ("image", "label")}
        return self.transform(item) if self.transform is not None else item
