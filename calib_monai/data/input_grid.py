"""The served outputs mapped back from the network's grid to the input grid: one axis at a time where the
preprocessing only reoriented and resampled the image, ``Invertd`` otherwise.

Reorientation and resampling map an input voxel index ``k`` to a network coordinate ``M k`` (``M = network
affine^-1 @ file affine``) whose rotation part is a signed permutation times a diagonal: each input axis reads one
network axis, ``c = scale * k + offset``. Trilinear interpolation is then three 1D lerps and nearest the nearest
index per axis: a few passes over the output instead of ``Invertd``'s ``grid_sample`` on a 3 x N grid. Edges are
clamped (``Spacingd``'s ``border`` padding); nearest takes the upper voxel at a tie. Any other spatial step, padding
or a rotation: ``Invertd`` through the chain.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import torch
from monai.config import KeysCollection
from monai.data import MetaTensor
from monai.transforms import Compose, Invertd, MapTransform
from monai.utils import ensure_tuple_rep

__all__ = ["AFFINE_ONLY", "ToInputGridd", "axis_map", "input_shape", "map_axis_by_axis"]

#: the recorded operations whose inverse is the affine map alone (``Spacingd`` records ``SpatialResample``)
AFFINE_ONLY = ("Orientation", "SpatialResample")
_TOLERANCE = 1e-6
_LINEAR_CHUNK = 1 << 20  # output voxels per step of a linear pass


def axis_map(image: torch.Tensor) -> list[tuple[int, float, float]] | None:
    """Per input axis ``(network axis, scale, offset)`` of the preprocessed 3D MetaTensor ``image``: the network
    coordinate of input voxel ``k`` is ``scale * k + offset``; None when the map is not axis by axis."""
    operations = getattr(image, "applied_operations", None)
    if image.ndim != 4 or not operations:
        return None
    for op in operations:
        padding = (op.get("extra_info") or {}).get("padding_mode", "border")
        if op.get("class") not in AFFINE_ONLY or str(padding) != "border":
            return None
    network = np.asarray(torch.as_tensor(image.affine, dtype=torch.float64))
    m = np.linalg.solve(network, _input_affine(operations[0]))
    rotation = m[:3, :3]
    present = np.abs(rotation) > _TOLERANCE * np.abs(rotation).max()
    if not (present.sum(0) == 1).all() or not (present.sum(1) == 1).all():
        return None
    sources = present.argmax(0)  # the network axis each input axis reads
    return [(int(s), float(rotation[s, a]), float(m[s, 3])) for a, s in enumerate(sources)]


def _input_affine(first: Mapping) -> np.ndarray:
    """The input grid's affine, as the first operation recorded it (``Orientation``: ``original_affine``,
    ``SpatialResample``: ``src_affine``)."""
    info = first.get("extra_info") or {}
    affine = info.get("original_affine", info.get("src_affine"))
    return np.asarray(torch.as_tensor(affine, dtype=torch.float64))


def input_shape(image: torch.Tensor) -> list[int]:
    """The input grid's spatial shape, as the first recorded operation saw it."""
    return [int(n) for n in torch.as_tensor(image.applied_operations[0]["orig_size"]).reshape(-1).tolist()]


def _along(x: torch.Tensor, dim: int, coordinate: torch.Tensor, nearest: bool) -> torch.Tensor:
    """``x`` (contiguous) sampled along ``dim`` at the (clamped) ``coordinate``s: the nearest voxel, or the 1D
    linear interpolation of its two neighbours."""
    size = x.shape[dim]
    coordinate = coordinate.clamp(0, size - 1)
    # ``dim`` as the middle axis of a 3D view: index_select then copies whole blocks
    blocks = x.reshape(math.prod(x.shape[:dim]), size, -1)
    shape = (*x.shape[:dim], coordinate.numel(), *x.shape[dim + 1 :])
    if nearest:
        return blocks.index_select(1, torch.floor(coordinate + 0.5).long().clamp_max(size - 1)).reshape(shape)
    low = coordinate.floor().long()
    high, weight = (low + 1).clamp_max(size - 1), (coordinate - low).to(x.dtype).reshape(-1, 1)
    out = blocks.new_empty((blocks.shape[0], coordinate.numel(), blocks.shape[2]))
    # about 1M voxels at a time, into the output: no full-size copies of the neighbours
    step = max(1, _LINEAR_CHUNK // (blocks.shape[0] * blocks.shape[2]))
    for start in range(0, coordinate.numel(), step):
        part = slice(start, start + step)
        below, above = blocks.index_select(1, low[part]), blocks.index_select(1, high[part])
        torch.lerp(below, above, weight[part], out=out[:, part])
    return out.reshape(shape)


def map_axis_by_axis(
    x: torch.Tensor, axes: Sequence[tuple[int, float, float]], shape: Sequence[int], nearest: bool
) -> torch.Tensor:
    """``x (C, *network grid)`` on the input grid ``shape`` through :func:`axis_map`'s ``axes``."""
    out = x.permute(0, *(1 + s for s, _, _ in axes)).contiguous()  # input axis a reads network axis s: put s at a
    # the innermost axis first: the passes that make the most voxels then copy whole rows
    for a in reversed(range(len(axes))):
        _, scale, offset = axes[a]
        coordinate = torch.arange(int(shape[a]), dtype=torch.float64, device=x.device) * scale + offset
        out = _along(out, a + 1, coordinate, nearest)
    return out


class ToInputGridd(MapTransform):
    """Map the tensors under ``keys`` (``(C, *network grid)``) back to the input grid of ``orig_key`` (the
    preprocessed image), axis by axis where :func:`axis_map` allows, else by ``Invertd`` through ``preprocessing``
    (the ``Compose`` instance that made ``orig_key``); ``nearest`` per key (label maps), else linear. The result
    keeps its dtype and gets the file's affine. Keys of one dtype and interpolation cross together, as one tensor
    of their channels: each channel is resampled alone either way, and one pass through ``Invertd`` costs about
    as much for 7 channels as for 2 (the contour masks of a served case).
    """

    _STACKED = "_to_input_grid"

    def __init__(
        self,
        keys: KeysCollection,
        preprocessing: Compose,
        nearest: bool | Sequence[bool] = False,
        orig_key: str = "image",
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.nearest = ensure_tuple_rep(nearest, len(self.keys))
        self.orig_key = orig_key
        self._invert = {
            n: Invertd(self._STACKED, transform=preprocessing, orig_keys=orig_key, nearest_interp=n, to_tensor=True)
            for n in (False, True)
        }

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        image = d[self.orig_key]
        axes = axis_map(image) if isinstance(image, MetaTensor) else None
        if axes is not None:
            shape, affine = input_shape(image), torch.as_tensor(_input_affine(image.applied_operations[0]))
        groups: dict[tuple[bool, torch.dtype], list[Hashable]] = {}
        for key, nearest in self.key_iterator(d, self.nearest):
            groups.setdefault((bool(nearest), d[key].dtype), []).append(key)
        for (nearest, _), keys in groups.items():
            plain = [v.as_tensor() if isinstance(v, MetaTensor) else torch.as_tensor(v) for v in (d[k] for k in keys)]
            stacked = plain[0] if len(plain) == 1 else torch.cat(plain)
            if axes is None:
                # Invertd resamples in float32: a label map gets its type back
                inverted = self._invert[nearest]({self.orig_key: image, self._STACKED: MetaTensor(stacked)})
                mapped, grid = inverted[self._STACKED], inverted[self._STACKED].meta
                mapped = mapped.as_tensor().to(stacked.dtype)
            else:
                mapped, grid = map_axis_by_axis(stacked, axes, shape, nearest), {"affine": affine}
            for key, part in zip(keys, mapped.split([p.shape[0] for p in plain])):
                given = d[key].meta if isinstance(d[key], MetaTensor) else image.meta
                # the input grid's geometry, and what was recorded on the value (case name, source)
                d[key] = MetaTensor(part, meta={**given, **grid})
        return d
