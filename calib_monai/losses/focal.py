"""Focal loss with a softmax over classes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from calib_monai.checks import check_number
from calib_monai.losses._inputs import PerVoxelLoss

__all__ = ["FocalLoss"]


class FocalLoss(PerVoxelLoss):
    """Multi-class (softmax) focal loss, averaged over voxels.

    .. math::
        \\mathcal{L} = \\mathrm{mean}_n \\left(-(1 - p_{n, y_n})^{\\gamma} \\log p_{n, y_n}\\right),
        \\qquad p_n = \\mathrm{softmax}(l_n)

    Lin et al., "Focal Loss for Dense Object Detection", ICCV 2017; calibration effect: Mukhoti et al., NeurIPS 2020.
    It equals ``monai.losses.FocalLoss(use_softmax=True, to_onehot_y=True, reduction="none")`` summed over classes
    and averaged over voxels (MONAI's default is the sigmoid focal loss); ``docs/notes/losses.md``.

    >>> import torch
    >>> logits, labels = torch.zeros(1, 2, 1, 2), torch.tensor([[[0, 1]]])  # p = 1/2 everywhere
    >>> round(FocalLoss(gamma=2.0)(logits, labels).item(), 4)  # (1 - 1/2)^2 log 2
    0.1733

    Args:
        gamma: focusing exponent, >= 0 (0 gives cross-entropy).
        reduction: ``"mean"`` over voxels, ``"sum"``, or ``"none"`` for the ``(B, 1, *spatial)`` map.
    """

    def __init__(self, gamma: float = 3.0, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.gamma = check_number("gamma", gamma, 0, hint="the focusing exponent; 3 in the bundles")

    def per_voxel(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        log_pt = F.log_softmax(logits, dim=1).gather(1, labels.unsqueeze(1))
        return -((1.0 - log_pt.exp()) ** self.gamma) * log_pt
