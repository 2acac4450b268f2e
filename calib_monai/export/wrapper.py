"""A deployable 3D segmentation model: a 2D network applied slice by slice, with its confidence."""

from __future__ import annotations

import torch

from calib_monai.recalibration.stored import Uncalibrated

__all__ = ["SegmentationWithConfidence"]


class SegmentationWithConfidence(torch.nn.Module):
    """Segment volumes ``(B, C_in, H, W, D)`` with a 2D network slice by slice (no ``SliceInferer``): ``segmentation``
    ``(B, 1, H, W, D)`` ``int64`` (the argmax) and ``confidence`` ``(B, 1, H, W, D)`` ``float32`` (the max softmax
    probability, of the calibrated logits with a ``calibration``). Scriptable and exportable; all ``B x D`` slices
    run as one batch, so feed a large CT in chunks.

    Args:
        network: a 2D network mapping ``(N, C_in, H, W)`` to logits ``(N, C, H, W)``.
        spatial_dim: the spatial axis to slice along, ``0``, ``1`` or ``2`` for ``H``, ``W`` or ``D`` (the same
            convention as ``monai.inferers.SliceInferer``); defaults to the last axis.
        calibration: a module ``(logits, image) -> logits`` applied to each batch of 2D slices; None: none.

    Example::

        net = calib_monai.networks.backbone("unet", spatial_dims=2, in_channels=1, out_channels=5)
        model = SegmentationWithConfidence(net).eval()
        segmentation, confidence = model(torch.rand(1, 1, 192, 192, 30))
    """

    def __init__(
        self, network: torch.nn.Module, spatial_dim: int = 2, calibration: torch.nn.Module | None = None
    ) -> None:
        super().__init__()
        if spatial_dim not in (0, 1, 2):
            raise ValueError(f"spatial_dim must be 0, 1 or 2 (an axis of H, W, D), got {spatial_dim}.")
        self.network = network
        self.calibration = calibration if calibration is not None else Uncalibrated()
        self.axis = spatial_dim + 2  # tensor axis of the slices in (B, C, H, W, D)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(segmentation, confidence)`` for the volume ``x`` of shape ``(B, C_in, H, W, D)``."""
        # (B, C, *spatial) -> (B, S, C, P, Q): the slices next to the batch so that one reshape folds them in
        slices = x.movedim(self.axis, 1)
        b, s, c, p, q = slices.shape
        flat = slices.reshape(b * s, c, p, q)
        logits = self.calibration(self.network(flat), flat)
        logits = logits.reshape(b, s, logits.shape[1], p, q).movedim(1, self.axis)
        # one max over the softmax gives both outputs, so the label is always the class the confidence belongs to
        confidence, segmentation = torch.softmax(logits.float(), dim=1).max(dim=1, keepdim=True)
        return segmentation, confidence
