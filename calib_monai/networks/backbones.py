"""Segmentation backbones by name, with the configurations the papers trained: a UNet for most tables, and in their
backbone ablations an attention UNet, UNet++, an nnU-Net-like DynUNet (CRaC) and TransUNet, which MONAI lacks: its
transformer UNets (``unetr``, ``swin_unetr``) stand in for it (results with them are not the papers' numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from monai.networks import nets

__all__ = ["BACKBONES", "backbone"]


def _unet(spatial_dims: int, in_channels: int, out_channels: int, **kw: Any) -> torch.nn.Module:
    # the papers' "MONAI UNet": channels 16..256, stride 2, two residual units per level
    args = {"channels": (16, 32, 64, 128, 256), "strides": (2, 2, 2, 2), "num_res_units": 2, **kw}
    return nets.UNet(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, **args)


def _attention_unet(spatial_dims: int, in_channels: int, out_channels: int, **kw: Any) -> torch.nn.Module:
    args = {"channels": (16, 32, 64, 128, 256), "strides": (2, 2, 2, 2), **kw}
    return nets.AttentionUnet(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, **args)


class _FinalOutput(torch.nn.Module):
    """UNet++ returns a list of (deep-supervision) outputs; inferers and losses want the final tensor."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[0]


def _unet_plus_plus(spatial_dims: int, in_channels: int, out_channels: int, **kw: Any) -> torch.nn.Module:
    net = nets.BasicUNetPlusPlus(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, **kw)
    return _FinalOutput(net)


def _dynunet(spatial_dims: int, in_channels: int, out_channels: int, **kw: Any) -> torch.nn.Module:
    # nnU-Net-like: 3x3 convolutions, five downsamplings by 2, filters capped at 320, instance norm, leaky ReLU
    strides = [1] + [2] * 5
    args = {
        "kernel_size": [3] * len(strides),
        "strides": strides,
        "upsample_kernel_size": strides[1:],
        "filters": (32, 64, 128, 256, 320, 320),
        **kw,
    }
    return nets.DynUNet(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, **args)


def _unetr(spatial_dims: int, in_channels: int, out_channels: int, img_size: Sequence[int] | None = None, **kw: Any):
    if img_size is None:
        raise ValueError("backbone 'unetr' needs img_size (the training patch size, e.g. [192, 192]).")
    return nets.UNETR(in_channels, out_channels, img_size=img_size, spatial_dims=spatial_dims, **kw)


def _swin_unetr(spatial_dims: int, in_channels: int, out_channels: int, **kw: Any) -> torch.nn.Module:
    args = {"feature_size": 24, **kw}
    return nets.SwinUNETR(in_channels=in_channels, out_channels=out_channels, spatial_dims=spatial_dims, **args)


BACKBONES = {
    "unet": _unet,
    "attention_unet": _attention_unet,
    "unet_plus_plus": _unet_plus_plus,
    "dynunet": _dynunet,
    "unetr": _unetr,
    "swin_unetr": _swin_unetr,
}


def backbone(
    name: str = "unet", spatial_dims: int = 2, in_channels: int = 1, out_channels: int = 2, **kwargs: Any
) -> torch.nn.Module:
    """Build the backbone ``name`` (one of ``BACKBONES``) returning logits ``B, out_channels, *spatial``.

    Extra ``kwargs`` go to the MONAI network and replace the defaults above. ``img_size`` (the training patch
    size) is used by ``unetr`` only, so a bundle config can always pass it and switch backbones by name:
    ``{"_target_": "calib_monai.networks.backbone", "name": "@backbone", "img_size": [192, 192], ...}``.
    """
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; expected one of {sorted(BACKBONES)}.")
    img_size = kwargs.pop("img_size", None)
    if name == "unetr":
        kwargs["img_size"] = img_size
    return BACKBONES[name](spatial_dims, in_channels, out_channels, **kwargs)
