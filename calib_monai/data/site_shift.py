"""Simulated site shifts: what another scanner or protocol could do to an image. :func:`apply_site_shift` applies one
kind at a named strength (``SITE_SHIFTS``), deterministically for a seed, with MONAI's MR artefact transforms:

* ``bias_field``: ``exp(sum_k c_k P_k)`` of Legendre polynomials of degree 3, ``c_k`` in ``[-c, c]``
  (``RandBiasField``; Sled et al., IEEE TMI 1998);
* ``gibbs``: ringing from a truncated k-space (``GibbsNoise``);
* ``spike``: one k-space spike (herringbone artefact) at a seeded in-plane frequency (``KSpaceSpikeNoise``);
* ``ghosting``: as TorchIO's ``RandomGhosting`` (MONAI has none), every ``n``-th in-plane k-space line along a
  phase-encoding axis scaled by ``1 - intensity``, centre lines kept (Zaitsev et al., JMRI 2015);
* ``gamma``: ``((x - min) / range) ** gamma * range + min`` (``AdjustContrast``), gamma above or below 1 by the seed;
* ``resolution``: a thicker slice, the last spatial axis averaged down by a factor and interpolated back (3D only).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import AdjustContrast, GibbsNoise, KSpaceSpikeNoise, RandBiasField, Resize
from monai.utils import look_up_option

__all__ = ["SITE_SHIFTS", "SITE_SHIFT_KINDS", "SITE_SHIFT_STRENGTHS", "apply_site_shift", "ghosting"]

SITE_SHIFT_STRENGTHS = ("mild", "moderate", "strong")
SITE_SHIFTS: dict[str, dict[str, float]] = {
    "bias_field": {"mild": 0.05, "moderate": 0.1, "strong": 0.2},  # coefficient bound c
    "gibbs": {"mild": 0.4, "moderate": 0.6, "strong": 0.8},  # GibbsNoise alpha (0: identity, 1: all cut)
    "spike": {"mild": 0.02, "moderate": 0.05, "strong": 0.15},  # spike magnitude / k-space peak
    "ghosting": {"mild": 0.3, "moderate": 0.6, "strong": 0.9},  # 1 - the scale of the ghosting lines
    "gamma": {"mild": 1.25, "moderate": 1.6, "strong": 2.2},  # gamma or its inverse
    "resolution": {"mild": 2, "moderate": 3, "strong": 5},  # slice thickness factor
}
SITE_SHIFT_KINDS = tuple(SITE_SHIFTS)


def ghosting(image: torch.Tensor, intensity: float, num_ghosts: int, axis: int, restore: float = 0.02) -> torch.Tensor:
    """Ghosts along spatial ``axis`` (0 or 1, in-plane): in the 2D k-space of every slice, the lines ``0, n, 2n, ...``
    along ``axis`` (centred spectrum, ``n = num_ghosts``) are scaled by ``1 - intensity``, except the central
    ``restore`` fraction of lines; the real part of the inverse transform."""
    if not 0 <= intensity <= 1:
        raise ValueError(f"intensity must be in [0, 1], got {intensity}; 0 changes nothing")
    if int(num_ghosts) < 2:
        raise ValueError(f"num_ghosts must be >= 2, got {num_ghosts}")
    if axis not in (0, 1):
        raise ValueError(f"axis must be an in-plane spatial axis, 0 or 1, got {axis}")
    dims = (1, 2)
    k = torch.fft.fftshift(torch.fft.fftn(image.to(torch.float32), dim=dims), dim=dims)
    size = image.shape[axis + 1]
    scale = torch.ones(size, dtype=torch.float32, device=image.device)
    scale[:: int(num_ghosts)] = 1 - float(intensity)
    half = max(1, int(round(restore * size / 2)))
    scale[max(0, size // 2 - half) : size // 2 + half] = 1.0  # the centre of k-space: the image's contrast
    shape = [1] * image.ndim
    shape[axis + 1] = size
    k = k * scale.reshape(shape)
    return torch.fft.ifftn(torch.fft.ifftshift(k, dim=dims), dim=dims).real


def _spike_location(shape: tuple[int, ...], rng: np.random.RandomState) -> tuple[int, ...]:
    """A seeded location in the centred k-space: in-plane at 1/8 to 3/8 of the size from the centre, centred
    through-plane (one spike shared by the slices)."""
    loc = []
    for i, n in enumerate(shape):
        if i < 2:
            offset = int(rng.randint(max(1, n // 8), max(2, 3 * n // 8 + 1))) * (1 if rng.rand() < 0.5 else -1)
            loc.append(min(max(n // 2 + offset, 0), n - 1))
        else:
            loc.append(n // 2)
    return tuple(loc)


def _shift(x: torch.Tensor, kind: str, value: float, seed: int) -> torch.Tensor:
    rng = np.random.RandomState(seed)
    spatial = tuple(x.shape[1:])
    if kind == "bias_field":
        if len(spatial) not in (2, 3):
            raise ValueError(f"image: bias_field needs a 2D or 3D image (C, H, W[, D]), got shape {tuple(x.shape)}")
        field = RandBiasField(degree=3, coeff_range=(-value, value), prob=1.0)
        field.set_random_state(seed=seed)
        return torch.as_tensor(field(x.cpu())).to(x.device)
    if kind == "gibbs":
        return torch.as_tensor(GibbsNoise(alpha=value)(x))
    if kind == "spike":
        k = torch.fft.fftn(x, dim=tuple(range(1, x.ndim)))
        log_peak = math.log(float(k.abs().max()) + 1e-10)
        loc = _spike_location(spatial, rng)
        return torch.as_tensor(KSpaceSpikeNoise(loc, k_intensity=log_peak + math.log(value))(x))
    if kind == "ghosting":
        return ghosting(x, value, num_ghosts=int(rng.randint(2, 7)), axis=int(rng.randint(0, 2)))
    if kind == "gamma":
        gamma = value if rng.rand() < 0.5 else 1 / value
        return torch.as_tensor(AdjustContrast(gamma=gamma)(x))
    if kind == "resolution":
        if len(spatial) != 3:
            raise ValueError(f"image: resolution needs a 3D image (C, H, W, D), got shape {tuple(x.shape)}")
        thick = max(1, int(round(spatial[2] / value)))
        down = Resize((*spatial[:2], thick), mode="area")(x)
        return torch.as_tensor(Resize(spatial, mode="trilinear", align_corners=True)(down))
    raise AssertionError(kind)


def apply_site_shift(image: torch.Tensor, kind: str, strength: str = "moderate", seed: int = 0) -> torch.Tensor:
    """``image`` ``(C, H, W[, D])`` under the site shift ``kind`` (one of ``SITE_SHIFT_KINDS``) at ``strength``
    (``"mild"``, ``"moderate"``, ``"strong"``), the same for the same ``seed``; the input's shape, dtype, device."""
    kind = look_up_option(kind, SITE_SHIFT_KINDS)
    strength = look_up_option(strength, SITE_SHIFT_STRENGTHS)
    if not isinstance(image, torch.Tensor) or image.ndim < 3:
        shape = tuple(getattr(image, "shape", ()))
        raise ValueError(f"image: expected a channel-first tensor (C, H, W[, D]), got {type(image).__name__} {shape}")
    plain = image.as_tensor() if isinstance(image, MetaTensor) else image
    x = plain.to(torch.float32)
    out = _shift(x, kind, SITE_SHIFTS[kind][strength], int(seed)).to(x.device, torch.float32)
    out = out.as_tensor() if isinstance(out, MetaTensor) else out  # MONAI's transforms return MetaTensors
    if image.dtype.is_floating_point:
        out = out.to(image.dtype)
    elif image.dtype == torch.bool:
        raise ValueError(f"image: a boolean image has no intensities to shift (dtype {image.dtype})")
    else:
        info = torch.iinfo(image.dtype)
        out = out.round().clamp(info.min, info.max).to(image.dtype)
    if isinstance(image, MetaTensor):
        out = MetaTensor(out, meta=image.meta)  # its affine included
    return out
