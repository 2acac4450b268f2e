"""Per-case network features: a 2D network's bottleneck output, captured by a forward hook under any inferer and
averaged over every slice (window) and position the network saw, one vector per volume: the input of
:mod:`calib_monai.metrics.feature_distance` (González et al., MedIA 2022).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from monai.networks.nets import AttentionUnet, BasicUNetPlusPlus, DynUNet, UNet

__all__ = ["BottleneckFeatures", "PooledFeatures", "bottleneck_module_name"]


def _unwrap(network: torch.nn.Module, prefix: str = "") -> tuple[torch.nn.Module, str]:
    """The network inside DDP/DataParallel and the backbones' single-child wrappers, and its module-name prefix."""
    while True:
        if isinstance(network, torch.jit.ScriptModule):
            raise ValueError(
                "network is a TorchScript module: its submodules take no forward hooks; load the bundle's "
                "models/model.pt (a state_dict) instead of model.ts to capture features"
            )
        inner = next(
            (getattr(network, a) for a in ("module", "net") if isinstance(getattr(network, a, None), torch.nn.Module)),
            None,
        )
        if inner is None or isinstance(network, (UNet, AttentionUnet, DynUNet, BasicUNetPlusPlus)):
            return network, prefix
        name = "module" if getattr(network, "module", None) is inner else "net"
        network, prefix = inner, f"{prefix}{name}."


def bottleneck_module_name(network: torch.nn.Module) -> str:
    """The name (``network.get_submodule(name)``) of the deepest encoder block of a MONAI ``UNet``,
    ``AttentionUnet``, ``DynUNet`` or ``BasicUNetPlusPlus`` (as built by :func:`calib_monai.networks.backbone`,
    also inside DDP or the UNet++ wrapper); other networks raise a ``ValueError`` naming them."""
    net, prefix = _unwrap(network)
    if isinstance(net, DynUNet):
        return prefix + "bottleneck"
    if isinstance(net, BasicUNetPlusPlus):
        return prefix + "conv_4_0"
    if isinstance(net, (UNet, AttentionUnet)):
        # Sequential(encoder, SkipConnection/AttentionLayer(submodule=...), decoder) nested down to the bottom block
        name, module = prefix + "model", net.model
        while isinstance(module, torch.nn.Sequential) and len(module) > 1 and hasattr(module[1], "submodule"):
            name, module = f"{name}.1.submodule", module[1].submodule
        if name != prefix + "model":
            return name
    raise ValueError(
        f"network: bottleneck features are not supported for backbone {type(net).__name__}; use a MONAI UNet, "
        "AttentionUnet, DynUNet or BasicUNetPlusPlus, or pass module_name= the submodule to hook"
    )


@dataclass(frozen=True)
class PooledFeatures:
    """One case's pooled features: the mean ``vector`` (float64, CPU), the ``slices`` (2D inputs, windows
    included) and the ``positions`` (slices x bottleneck positions) it averages."""

    vector: np.ndarray
    slices: int
    positions: int

    @property
    def finite(self) -> bool:
        return bool(self.positions > 0 and np.isfinite(self.vector).all())


class BottleneckFeatures:
    """A forward hook on ``network``'s bottleneck (or ``module_name``) summing its output over batch and positions in
    float64 on its device (overlapping windows and padding count as the network saw them); :meth:`pop` returns the
    case's mean and resets::

        with BottleneckFeatures(bundle.network) as features:
            prediction = bundle.predict(path)
        pooled = features.pop()  # PooledFeatures(vector (C,), slices, positions)
    """

    def __init__(self, network: torch.nn.Module, module_name: str | None = None) -> None:
        self.module_name = bottleneck_module_name(network) if module_name is None else module_name
        try:
            self.module = network.get_submodule(self.module_name)
        except AttributeError as err:
            raise ValueError(
                f"module_name: {self.module_name!r} is not a submodule of {type(network).__name__}"
            ) from err
        self._handle = None
        self.reset()

    def reset(self) -> None:
        self._sum: torch.Tensor | None = None
        self.slices = 0
        self.positions = 0

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if isinstance(output, (list, tuple)):
            output = output[0]
        x = output.as_tensor() if hasattr(output, "as_tensor") else output
        x = x.detach().to(torch.float64)
        total = x.sum(dim=[0, *range(2, x.ndim)])
        self._sum = total if self._sum is None else self._sum + total
        self.slices += int(x.shape[0])
        self.positions += int(x.shape[0] * math.prod(x.shape[2:]))

    def start(self) -> BottleneckFeatures:
        """Register the hook (from zero; a config can call ``$@features.start()``); ``stop`` removes it."""
        self.stop()
        self.reset()
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __enter__(self) -> BottleneckFeatures:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def pop(self) -> PooledFeatures:
        """The pooled features since the last ``pop`` (or entry), then reset; no forward pass raises."""
        if self._sum is None:
            raise RuntimeError(
                f"no forward pass through {self.module_name!r} since the last pop: run the inferer inside the "
                "with block"
            )
        pooled = PooledFeatures((self._sum / self.positions).cpu().numpy(), self.slices, self.positions)
        self.reset()
        return pooled
