"""Tensors as the package computes with them: a plain ``torch.Tensor`` view of a MONAI ``MetaTensor``, whose meta
data bookkeeping would slow every operation (losses, metrics, transforms). Floor 0: torch only."""

from __future__ import annotations

import torch

__all__ = ["detached_plain_tensor", "plain_tensor"]


def plain_tensor(x) -> torch.Tensor:
    """``x`` as a plain ``torch.Tensor``: a tensor subclass viewed as one (no copy, autograd kept), anything else
    through ``torch.as_tensor``."""
    if isinstance(x, torch.Tensor):
        return x if type(x) is torch.Tensor else x.as_subclass(torch.Tensor)
    return torch.as_tensor(x)


def detached_plain_tensor(x) -> torch.Tensor:
    """:func:`plain_tensor` out of the autograd graph, no copy."""
    return plain_tensor(x).detach()
