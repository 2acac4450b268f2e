"""What the review rule's input signal measures of an image, without a label: its intensities and sharpness
(:func:`image_statistics`) and its field of view and voxel spacing (:func:`image_geometry`); together
:func:`input_statistics`, the vector the validated range stores per image (``review/validated_range.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from calib_monai.tensors import detached_plain_tensor

__all__ = [
    "GEOMETRY_TOLERANCE",
    "SHADING_TOLERANCE",
    "image_geometry",
    "image_geometry_names",
    "image_statistic_names",
    "image_statistics",
    "input_statistic_names",
    "input_statistics",
    "is_geometry",
    "statistic_floor",
    "statistic_group",
]

# the least spread of a geometry statistic (log mm): images of one protocol share a spacing to the last digit
GEOMETRY_TOLERANCE = math.log(1.1)
_GEOMETRY_PREFIXES = ("field of view", "voxel spacing")
# the least spread of a shading statistic (in intensity spreads; real images: 0.05-0.3)
SHADING_TOLERANCE = 0.01
# image_statistics' per-axis statistics, in order
_AXIS_KINDS = ("sharpness", "roughness", "spectrum roughness", "intensity slope", "intensity curvature")
_SHADING_PREFIXES = ("intensity slope", "intensity curvature")
# at most this many lines per axis in the spectrum roughness, and voxels in the skewness's quantiles (torch.quantile
# refuses more than 16M values): every one of a network-sized image, an even stride of a CT-sized one
_SPECTRUM_LINES = 1 << 14
_QUANTILE_VOXELS = 1 << 20


def image_statistics(image: Any) -> list[float]:
    """Per channel of a (preprocessed) image ``(C, *spatial)`` (0 where undefined; :func:`image_statistic_names`):

    - mean, standard deviation and quantile skewness ``(q90 + q10 - 2 q50) / (q90 - q10)`` (a contrast curve moves it);
    - per spatial axis: sharpness (mean absolute neighbour difference / std), roughness (mean absolute second / first
      difference: about 1.7 for noise, near 0 along an interpolated axis), spectrum roughness (mean absolute second
      difference of the log power spectrum: ghosting, ringing) and the intensity slope and curvature (:func:`_shading`).

    >>> import torch
    >>> image = torch.tensor([[[0.0, 2.0, 4.0, 0.0, 0.0, 0.0]] * 2])  # 2 x 6: the same row twice
    >>> # mean 1, std sqrt(7 / 3); of the 12 values sorted (eight 0, two 2, two 4) q10 = q50 = 0 and q90 = 2 + 0.9 * 2,
    >>> # so the skewness is 3.8 / 3.8 = 1 (an upper tail far above the median); along axis 1 steps of 2, 2, 4, 0, 0
    >>> # (mean 8/5), second differences 0, 6, 4, 0 (mean 5/2), and the row's power 28, 12, 4 at frequencies 1, 2, 3:
    >>> # |log 28 - 2 log 12 + log 4| = log(9 / 7); the row's profile drifts down (slope -5/7 and curvature -1.3393,
    >>> # over std: _shading's example), the axis of 2 identical rows not at all
    >>> [round(v, 4) for v in image_statistics(image)]  # sharpness 8/5 / std; roughness (5/2) / (8/5)
    [1.0, 1.5275, 1.0, 0.0, 1.0474, 0.0, 1.5625, 0.0, 0.2513, 0.0, -0.4676, 0.0, -0.8768]
    """
    image = detached_plain_tensor(torch.as_tensor(image)).double()
    flat = image.reshape(image.shape[0], -1)
    std = flat.std(1, correction=0)
    out, roughness, tiny = [flat.mean(1), std, _quantile_skewness(flat)], [], torch.finfo(torch.float64).tiny
    spectra = [_spectrum_roughness(image, axis) for axis in range(1, image.ndim)]
    for axis in range(1, image.ndim):
        first = image.diff(dim=axis)  # the second difference is its difference: one pass less
        step = first.abs().reshape(image.shape[0], -1).mean(1)
        out.append(torch.where(std > 0, step / std.clamp_min(tiny), torch.zeros_like(step)))
        if image.shape[axis] < 3:
            roughness.append(torch.zeros_like(step))
            continue
        bend = first.diff(dim=axis).abs_().reshape(image.shape[0], -1).mean(1)
        roughness.append(torch.where(step > 0, bend / step.clamp_min(tiny), torch.zeros_like(step)))
    shading = [_shading(image, axis, std) for axis in range(1, image.ndim)]
    slopes, curvatures = [s for s, _ in shading], [c for _, c in shading]
    return torch.stack(out + roughness + spectra + slopes + curvatures, dim=1).reshape(-1).cpu().tolist()


def _quantile_skewness(flat: torch.Tensor) -> torch.Tensor:
    """Per row of ``flat`` ``(C, N)``, ``(q90 + q10 - 2 q50) / (q90 - q10)``; 0 where ``q90 == q10``."""
    step = math.ceil(flat.shape[1] / _QUANTILE_VOXELS)
    q10, q50, q90 = torch.quantile(flat[:, ::step], flat.new_tensor([0.1, 0.5, 0.9]), dim=1)
    width = q90 - q10
    return torch.where(width > 0, (q90 + q10 - 2 * q50) / width.clamp_min(torch.finfo(flat.dtype).tiny), 0.0)


def _shading(image: torch.Tensor, axis: int, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel, the least-squares coefficients of ``u`` and ``(3 u^2 - 1) / 2`` (centred; ``u`` the position in
    [-1, 1] along ``axis``) in the slabs' mean intensity, over ``std``: the slope and curvature of a bias field's
    drift (0 with fewer than 2, resp. 3, voxels or a constant channel).

    >>> profile = torch.tensor([[[0.0, 0.0, 3.0]]])  # mean 1, std sqrt(2); u = -1, 0, 1
    >>> # slope (1 + 0 + 2) / 2; the centred curvature basis is 1/2, -1, 1/2: (-1/2 + 1 + 1) / (3/2) = 1
    >>> [round(float(v), 4) for v in _shading(profile, 2, profile.reshape(1, -1).std(1, correction=0))]
    [1.0607, 0.7071]
    """
    size = image.shape[axis]
    if size < 2:
        zero = torch.zeros(image.shape[0], dtype=image.dtype, device=image.device)
        return zero, zero
    profile = image.mean(dim=[d for d in range(1, image.ndim) if d != axis])  # (C, size)
    profile = profile - profile.mean(1, keepdim=True)
    u = torch.linspace(-1.0, 1.0, size, dtype=image.dtype, device=image.device)
    coefficients = []
    for basis in (u, 1.5 * u * u - 0.5) if size >= 3 else (u,):  # the centred quadratic of 2 points is 0
        basis = basis - basis.mean()  # u is centred; the quadratic is not (orthogonal to u on the grid by symmetry)
        coefficients.append(profile @ basis / basis.square().sum())
    coefficients += [torch.zeros_like(std)] * (2 - len(coefficients))
    tiny = torch.finfo(image.dtype).tiny
    return tuple(torch.where(std > 0, c / std.clamp_min(tiny), torch.zeros_like(c)) for c in coefficients)


def _spectrum_roughness(image: torch.Tensor, axis: int) -> torch.Tensor:
    """Per channel, the mean absolute second difference of the log power spectrum along ``axis`` (summed over the
    lines along it), over the frequencies with power; 0 with fewer than 3 of them."""
    if image.shape[axis] < 3:
        return torch.zeros(image.shape[0], dtype=image.dtype, device=image.device)
    other = [d for d in range(1, image.ndim) if d != axis]
    count = math.prod(image.shape[d] for d in other)
    step = math.ceil((count / _SPECTRUM_LINES) ** (1 / len(other))) if count > _SPECTRUM_LINES else 1
    lines = image[tuple(slice(None, None, step) if d in other else slice(None) for d in range(image.ndim))]
    lines = lines.movedim(axis, -1).reshape(image.shape[0], -1, image.shape[axis])
    centred = lines - lines.mean(dim=-1, keepdim=True)  # frequency 0 out: the mean's power, not the texture's
    power = torch.fft.rfft(centred, dim=-1).abs().square().sum(1)[:, 1:]
    values = []
    for row in power:
        log = row[row > 0].log()
        values.append(log.diff().diff().abs().mean() if log.numel() >= 3 else log.new_zeros(()))
    return torch.stack(values)


def image_statistic_names(channels: int, spatial_dims: int) -> list[str]:
    """The names of :func:`image_statistics`' values of a ``channels``-channel image with ``spatial_dims`` axes."""
    axes = range(spatial_dims)
    per_channel = [
        "mean intensity",
        "intensity spread",
        "intensity skewness",
        *(f"{kind} along axis {a}" for kind in _AXIS_KINDS for a in axes),
    ]
    prefix = (lambda c: "") if channels == 1 else (lambda c: f"channel {c} ")
    return [f"{prefix(c)}{name}" for c in range(channels) for name in per_channel]


def image_geometry(image: Any) -> list[float]:
    """Per spatial axis of a (preprocessed) image ``(C, *spatial)``: the log of its field of view (mm, which
    resampling keeps) and of the voxel spacing it was acquired with (the ``original_affine`` column along the axis).
    NaN without ``original_affine`` (not a file MONAI's reader loaded): the rule leaves it out.

    >>> import torch
    >>> from monai.data import MetaTensor
    >>> affine = torch.diag(torch.tensor([2.0, 2.0, 10.0, 1.0]))  # resampled to 2 x 2 mm in-plane
    >>> acquired = torch.diag(torch.tensor([1.0, 1.0, 10.0, 1.0]))  # read as 1 x 1 x 10 mm voxels
    >>> image = MetaTensor(torch.zeros(1, 50, 40, 8), affine=affine, meta={"original_affine": acquired})
    >>> [round(math.exp(v), 3) for v in image_geometry(image)]  # field of view 100, 80, 80 mm; spacing 1, 1, 10
    [100.0, 80.0, 80.0, 1.0, 1.0, 10.0]
    """
    spatial = tuple(image.shape[1:])
    meta = getattr(image, "meta", None) or {}
    original = meta.get("original_affine")
    affine = getattr(image, "affine", None)
    if original is None or affine is None:
        return [math.nan] * (2 * len(spatial))
    affine = np.asarray(torch.as_tensor(affine).cpu(), dtype=np.float64)
    original = np.asarray(torch.as_tensor(original).cpu(), dtype=np.float64)
    if affine.ndim != 2 or original.ndim != 2:
        raise ValueError(
            f"image_geometry takes one image (C, *spatial) with a (4, 4) affine, got affine {affine.shape} and "
            f"original_affine {original.shape}: decollate the batch first"
        )
    affine = affine[: len(spatial), : len(spatial)]
    original = original[: original.shape[0] - 1, : original.shape[1] - 1]  # the linear part, any number of axes
    rows = min(affine.shape[0], original.shape[0])
    spacing, acquired = np.linalg.norm(affine, axis=0), np.linalg.norm(original, axis=0)
    out_fov, out_spacing = [], []
    for axis, size in enumerate(spatial):
        out_fov.append(math.log(max(spacing[axis], 1e-12) * size))
        direction = affine[:rows, axis] / max(spacing[axis], 1e-12)
        cosines = np.abs(direction @ original[:rows]) / np.maximum(acquired, 1e-12)
        out_spacing.append(math.log(max(acquired[int(np.argmax(cosines))], 1e-12)) if cosines.size else math.nan)
    return out_fov + out_spacing


def image_geometry_names(spatial_dims: int) -> list[str]:
    """The names of :func:`image_geometry`'s values (log mm) of an image with ``spatial_dims`` axes."""
    return [f"field of view along axis {a}" for a in range(spatial_dims)] + [
        f"voxel spacing along axis {a}" for a in range(spatial_dims)
    ]


def input_statistics(image: Any, geometry: Sequence[float] | None = None) -> list[float]:
    """The input signal's vector of an image: :func:`image_statistics` then :func:`image_geometry` (``geometry``:
    taken before the image lost its metadata; None: from ``image``).

    >>> import torch
    >>> input_statistics(torch.tensor([[[0.0, 2.0], [0.0, 2.0]]]))  # a plain tensor: no geometry, NaN (left out)
    [1.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, nan, nan, nan, nan]
    """
    return image_statistics(image) + list(image_geometry(image) if geometry is None else geometry)


def input_statistic_names(channels: int, spatial_dims: int) -> list[str]:
    """The names of :func:`input_statistics`' values."""
    return image_statistic_names(channels, spatial_dims) + image_geometry_names(spatial_dims)


def statistic_floor(name: str) -> float:
    """The least spread the rule measures a statistic named ``name`` in: :data:`GEOMETRY_TOLERANCE` for the geometry,
    :data:`SHADING_TOLERANCE` for the shading, 0 for the other intensity statistics.

    >>> round(statistic_floor("voxel spacing along axis 2"), 4), statistic_floor("mean intensity")  # log 1.1, none
    (0.0953, 0.0)
    """
    group = statistic_group(name)
    return GEOMETRY_TOLERANCE if group == "geometry" else SHADING_TOLERANCE if group == "shading" else 0.0


def statistic_group(name: str) -> str:
    """How the input signal counts the statistic named ``name``: ``"geometry"`` alone, ``"shading"`` (slopes and
    curvatures) and ``"intensity"`` each together with its group.

    >>> statistic_group("voxel spacing along axis 2"), statistic_group("channel 1 intensity slope along axis 0")
    ('geometry', 'shading')
    >>> statistic_group("intensity skewness")
    'intensity'
    """
    if is_geometry(name):
        return "geometry"
    bare = name.split(" ", 2)[2] if name.startswith("channel ") else name
    return "shading" if bare.startswith(_SHADING_PREFIXES) else "intensity"


def is_geometry(name: str) -> bool:
    """Whether the statistic named ``name`` measures the acquisition geometry (field of view, voxel spacing).

    >>> is_geometry("field of view along axis 0"), is_geometry("channel 1 intensity skewness")
    (True, False)
    """
    return name.startswith(_GEOMETRY_PREFIXES)
