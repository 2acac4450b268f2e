"""Shifted inputs for the quality study: corruptions of the preprocessed test images at graded strengths.

Each corruption maps a preprocessed image ``(C, H, W, D)`` (intensities scaled to about [0, 1] by the bundle) and
its label to the shifted pair; the label changes only where the anatomy moves (the flip). Seeded, so every method
sees the same corrupted volumes.

* ``noise``: ``x + N(0, s^2)``;
* ``blur``: a Gaussian of ``s`` voxels (MONAI ``GaussianSmooth``, all spatial axes);
* ``gamma``: contrast change ``clip(x, 0, 1) ** s``;
* ``shift``: intensity offset ``x + s``;
* ``flip``: the image and its label mirrored along the second in-plane axis (a wrongly stored orientation).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from monai.transforms import GaussianSmooth

__all__ = ["CORRUPTIONS", "corruption"]

#: kind -> strengths, weakest first (the last one is "the strongest corruption" of the study's flag target)
CORRUPTIONS: dict[str, tuple[float, ...]] = {
    "noise": (0.05, 0.1, 0.2),
    "blur": (1.0, 2.0, 4.0),
    "gamma": (1.5, 2.5, 4.0),
    "shift": (0.1, 0.25, 0.5),
    "flip": (1.0,),
}

Corruption = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def corruption(kind: str, strength: float, seed: int = 0) -> Corruption:
    """``f(image, label, index) -> (image, label)`` of ``kind`` at ``strength`` (volume ``index`` seeds its noise)."""
    if kind not in CORRUPTIONS:
        raise ValueError(f"corruption kind must be one of {list(CORRUPTIONS)}, got {kind!r}")
    s = float(strength)

    def apply(image: torch.Tensor, label: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if kind == "noise":
            generator = torch.Generator().manual_seed(int(seed) * 100003 + int(index))
            return image + s * torch.randn(image.shape, generator=generator, dtype=image.dtype), label
        if kind == "blur":
            return GaussianSmooth(sigma=s)(image), label
        if kind == "gamma":
            return image.clamp(0, 1) ** s, label
        if kind == "shift":
            return image + s, label
        return torch.flip(image, dims=[2]), torch.flip(label, dims=[2])  # flip: the second in-plane axis

    return apply
