"""Local temperature scaling (Ding Z. et al., Local Temperature Scaling for Probability Calibration, ICCV 2021).

``softmax(z / T(x))`` with a per-pixel temperature ``T(x) = softplus(CNN([z, image])) + 0.05`` predicted from the
logits and the image, fitted on held-out slices by NLL. This is a small version of the paper's network (two 3x3
convolutions on 2D slices, like the segmentation network); ``T(x) > 0`` keeps the argmax.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["LocalTemperatureScaling"]

_MIN_TEMPERATURE = 0.05
_START = 0.5413  # softplus(0.5413) + 0.05 = 1.05: the fit starts near T = 1


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
        logits: torch.Tensor,
        images: torch.Tensor,
        labels: torch.Tensor,
        steps: int = 300,
        batch_size: int = 16,
        lr: float = 1e-2,
        seed: int = 0,
    ) -> LocalTemperatureScaling:
        """Adam on the NLL of ``steps`` batches of random slices: ``logits (S, C, H, W)``, ``images (S, C_in, H, W)``,
        ``labels (S, H, W)``; seeded (initialisation and batches)."""
        if (
            logits.ndim != 4
            or images.shape[0] != logits.shape[0]
            or labels.shape != (logits.shape[0], *logits.shape[2:])
        ):
            raise ValueError(
                f"need logits (S, C, H, W), images (S, C_in, H, W), labels (S, H, W); got "
                f"{tuple(logits.shape)}, {tuple(images.shape)}, {tuple(labels.shape)}"
            )
        torch.manual_seed(seed)
        for module in self.body:
            if isinstance(module, nn.Conv2d) and module is not self.body[-1]:
                module.reset_parameters()
        optimizer = torch.optim.Adam(self.parameters(), lr=lr)
        generator = torch.Generator().manual_seed(seed)
        self.train()
        for _ in range(int(steps)):
            batch = torch.randint(0, logits.shape[0], (batch_size,), generator=generator)
            loss = F.cross_entropy(self(logits[batch], images[batch]), labels[batch].long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return self.eval()
