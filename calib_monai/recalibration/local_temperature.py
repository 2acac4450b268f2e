"""Local temperature scaling (Ding Z. et al., Local Temperature Scaling for Probability Calibration, ICCV 2021).

``softmax(z / T(x))`` with a per-pixel ``T(x) = softplus(CNN([z, image])) + 0.05`` fitted by NLL on 2D slices (a
small version of the paper's network: two 3x3 convolutions); ``T(x) > 0`` keeps the argmax.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from calib_monai.defaults import LTS_STEPS

__all__ = ["LocalTemperatureScaling", "temperature_maps"]

_MIN_TEMPERATURE = 0.05
_START = 0.5413  # softplus(0.5413) + 0.05 = 1.05: the fit starts near T = 1
# pixels of the slices temperature_maps runs at once: their hidden maps (3 x 16 channels) stay in the CPU's cache
_PASS_PIXELS = 1 << 16


class LocalTemperatureScaling(nn.Module):
    """``logits / T(x)`` for 2D logits ``(N, C, H, W)`` and their images ``(N, C_in, H, W)``.

    Args:
        num_classes: logit channels ``C``.
        in_channels: image channels ``C_in``.
        hidden: channels of the two hidden convolutions.
    """

    def __init__(self, num_classes: int, in_channels: int = 1, hidden: int = 16) -> None:
        super().__init__()
        self.num_classes, self.in_channels, self.hidden = int(num_classes), int(in_channels), int(hidden)
        self.body = nn.Sequential(
            nn.Conv2d(num_classes + in_channels, hidden, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(hidden, hidden, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(hidden, 1, 1),
        )
        nn.init.zeros_(self.body[-1].weight)
        nn.init.constant_(self.body[-1].bias, _START)
        self.history: dict[str, float] = {}  # the last fit's held-out NLL before / after and its best step

    def temperature_map(self, logits: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """``(N, 1, H, W)`` temperatures, each ``> 0.05``."""
        x = torch.cat([logits, image.to(logits.dtype)], dim=1)
        return F.softplus(self.body(x)) + _MIN_TEMPERATURE

    def forward(self, logits: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
        if image is None:
            raise ValueError("local temperature scaling needs the image next to the logits")
        return logits / self.temperature_map(logits, image)

    def fit(
        self,
        logits: torch.Tensor | Sequence[torch.Tensor],
        images: torch.Tensor | Sequence[torch.Tensor],
        labels: torch.Tensor | Sequence[torch.Tensor],
        steps: int = LTS_STEPS,
        batch_size: int = 16,
        lr: float = 1e-2,
        seed: int = 0,
        held_out: tuple | None = None,
        eval_every: int = 10,
    ) -> LocalTemperatureScaling:
        """Adam on the NLL of ``steps`` seeded batches of slices: ``logits (S, C, H, W)``, ``images (S, C_in, H, W)``,
        ``labels (S, H, W)``, or lists of such groups of different in-plane sizes (a batch from one group).
        With ``held_out`` (the same three) the parameters with the lowest held-out NLL, measured every ``eval_every``
        steps, are kept (early stopping); ``history``: ``heldout_nll_before``, ``heldout_nll_after``, ``best_step``."""
        groups = _groups(logits, images, labels)
        held = _groups(*held_out) if held_out is not None else []
        torch.manual_seed(seed)
        for module in self.body:
            if isinstance(module, nn.Conv2d) and module is not self.body[-1]:
                module.reset_parameters()
        optimizer = torch.optim.Adam(self.parameters(), lr=lr)
        generator = torch.Generator().manual_seed(seed)
        sizes = torch.tensor([float(z.shape[0]) for z, _, _ in groups])
        best = (self.nll(held), 0, copy.deepcopy(self.state_dict())) if held else None
        before = best[0] if best else float("nan")
        for step in range(1, int(steps) + 1):
            self.train()
            z, x, y = groups[int(torch.multinomial(sizes, 1, generator=generator))]
            batch = torch.randint(0, z.shape[0], (batch_size,), generator=generator)
            loss = F.cross_entropy(self(z[batch], x[batch]), y[batch].long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if best is not None and (step % max(1, int(eval_every)) == 0 or step == int(steps)):
                nll = self.nll(held)
                if nll < best[0]:
                    best = (nll, step, copy.deepcopy(self.state_dict()))
        if best is not None:
            self.load_state_dict(best[2])
            self.history = {"heldout_nll_before": before, "heldout_nll_after": best[0], "best_step": best[1]}
        return self.eval()

    @torch.no_grad()
    def nll(self, groups: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], chunk: int = 64) -> float:
        """The mean NLL over every voxel of ``groups`` of ``(logits, images, labels)`` slices, calibrated."""
        self.eval()
        total, count = 0.0, 0
        for z, x, y in groups:
            for i in range(0, z.shape[0], chunk):
                out = self(z[i : i + chunk], x[i : i + chunk])
                total += float(F.cross_entropy(out.double(), y[i : i + chunk].long(), reduction="sum"))
                count += y[i : i + chunk].numel()
        return total / max(count, 1)


def temperature_maps(
    modules: Sequence[LocalTemperatureScaling], logits: torch.Tensor, image: torch.Tensor | None
) -> torch.Tensor:
    """``(N, K, H, W)``: the temperature maps of ``K`` modules of one shape (the served fit and its folds) for the
    same ``logits (N, C, H, W)`` and ``image (N, C_in, H, W)`` in one pass: their first convolutions stacked, the
    others grouped (``groups=K``), channels-last, a few slices at a time."""
    if image is None:
        raise ValueError("local temperature scaling needs the image next to the logits")
    shapes = {(m.num_classes, m.in_channels, m.hidden) for m in modules}
    if len(shapes) != 1:
        raise ValueError(
            f"temperature_maps: the modules differ in (num_classes, in_channels, hidden), {sorted(shapes)}: stack the "
            "served fit and the folds of one calibration.pt"
        )

    def stacked(layer: int) -> tuple[torch.Tensor, torch.Tensor]:  # the K modules' weights and biases of one layer
        convs = [m.body[layer] for m in modules]
        return torch.cat([c.weight for c in convs]), torch.cat([c.bias for c in convs])

    k, first, second, last = len(modules), stacked(0), stacked(2), stacked(4)
    x = torch.cat([logits, image.to(logits.dtype)], dim=1).contiguous(memory_format=torch.channels_last)
    maps = []
    for part in x.split(max(1, _PASS_PIXELS // max(1, x.shape[2] * x.shape[3]))):  # a few slices at a time
        hidden = F.conv2d(part, *first, padding=1).relu_()
        hidden = F.conv2d(hidden, *second, padding=1, groups=k).relu_()
        maps.append(F.softplus(F.conv2d(hidden, *last, groups=k)).add_(_MIN_TEMPERATURE))
    return torch.cat(maps)


def _groups(logits, images, labels) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Groups of slices ``(logits (S, C, H, W), images (S, C_in, H, W), labels (S, H, W))``, checked."""
    if isinstance(logits, torch.Tensor):
        logits, images, labels = [logits], [images], [labels]
    groups = list(zip(logits, images, labels))
    if not groups or len(groups) != len(logits):
        raise ValueError("local temperature scaling needs at least one group of slices (logits, images, labels)")
    for z, x, y in groups:
        if (
            z.ndim != 4
            or x.shape[0] != z.shape[0]
            or x.shape[2:] != z.shape[2:]
            or y.shape != (z.shape[0], *z.shape[2:])
        ):
            raise ValueError(
                f"need logits (S, C, H, W), images (S, C_in, H, W), labels (S, H, W); got "
                f"{tuple(z.shape)}, {tuple(x.shape)}, {tuple(y.shape)}"
            )
        if z.shape[0] == 0:
            raise ValueError("local temperature scaling got an empty group of slices")
    return groups
