"""The cached preprocessed 3D volumes of a data set component, and the 2D slices the papers train on, served from them
(:class:`~calib_monai.data.volumes.VolumeSegmentationData`'s datasets)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from monai.data import CacheDataset
from torch.utils.data import Dataset

from calib_monai.data.transforms import unwrap_case_error
from calib_monai.tensors import plain_tensor

__all__ = ["SliceDataset", "cached_volumes"]


class _CaseCheckedCacheDataset(CacheDataset):
    """``CacheDataset`` that surfaces a bad case as its ``CaseDataError`` (a ValueError naming the file), not as
    MONAI's generic ``RuntimeError("applying transform ...")`` wrapper around it."""

    def _load_cache_item(self, idx: int):
        try:
            return super()._load_cache_item(idx)
        except RuntimeError as err:
            raise (unwrap_case_error(err) or err) from None

    def _transform(self, index: int):
        try:
            return super()._transform(index)
        except RuntimeError as err:
            raise (unwrap_case_error(err) or err) from None


def cached_volumes(items: Sequence[dict], chain: Callable, cache_rate: float, num_workers: int) -> CacheDataset:
    """``items`` preprocessed by the deterministic ``chain``, ``cache_rate`` of them up front (``num_workers``
    threads); a bad case raises its ``CaseDataError``. Cached with one intra-op torch thread: preprocessing is many
    small tensor operations, whose thread hand-offs dominate on a busy machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _CaseCheckedCacheDataset(
            items,
            transform=chain,
            cache_rate=cache_rate,
            num_workers=max(num_workers, 1),
            progress=False,
            copy_cache=False,  # deterministic chains: slices index the cache read-only
        )
    finally:
        torch.set_num_threads(previous)


class SliceDataset(Dataset):
    """All 2D slices along the last axis of ``volumes``, volume-major, as plain tensors (a 2D slice has no meaningful
    3D affine). ``volumes`` should be fully cached: an uncached volume is recomputed for each of its slices.

    Args:
        volumes: dataset of preprocessed 3D volumes, image ``(C, H, W, D)`` and label ``(1, H, W, D)``.
        transform: optional callable applied to each slice dict (e.g. 2D augmentation).
        drop_empty: keep only the slices whose label has foreground (BraTS).
    """

    def __init__(self, volumes: Dataset, transform: Callable | None = None, drop_empty: bool = False):
        self.volumes = volumes
        self.transform = transform
        self.drop_empty = bool(drop_empty)
        self.index: list[tuple[int, int]] = []
        for v in range(len(volumes)):
            volume = volumes[v]
            if self.drop_empty:
                label = plain_tensor(volume["label"])
                keep = label.reshape(-1, label.shape[-1]).gt(0).any(0).nonzero().reshape(-1).tolist()
                self.index.extend((v, int(k)) for k in keep)
            else:
                self.index.extend((v, k) for k in range(int(volume["image"].shape[-1])))

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        v, k = self.index[i]
        volume = self.volumes[v]
        item = {key: plain_tensor(volume[key])[..., k].clone() for key in ("image", "label")}
        return self.transform(item) if self.transform is not None else item
