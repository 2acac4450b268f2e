"""Label smoothing: cross-entropy against a target mixed with the uniform distribution."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from calib_monai.checks import check_number
from calib_monai.losses._inputs import PerVoxelLoss

__all__ = ["LabelSmoothingLoss"]


class LabelSmoothingLoss(PerVoxelLoss):
    """Cross-entropy against ``q = (1 - alpha) onehot(y) + alpha / C``.

    .. math::
        \\mathcal{L} = \\mathrm{mean}_n \\left(-\\sum_c q_{nc} \\log p_{nc}\\right)
            = \\mathrm{mean}_n\\left(-(1 - \\alpha) \\log p_{n, y_n} - \\frac{\\alpha}{C} \\sum_c \\log p_{nc}\\right)

    Szegedy et al., "Rethinking the Inception Architecture for Computer Vision", CVPR 2016; calibration effect:
    Mueller et al., NeurIPS 2019. Computed by ``torch.nn.functional.cross_entropy(label_smoothing=alpha)``. Its raw
    probabilities overstate volumes: read volumes and the case score after recalibration (``docs/notes/losses.md``).

    >>> import torch
    >>> logits = torch.tensor([[[[2.0]], [[0.0]]]])  # (B, C, H, W) = (1, 2, 1, 1): p = (0.881, 0.119)
    >>> labels = torch.tensor([[[0]]])
    >>> # -(0.9 + 0.1/2) log p_0 - (0.1/2) log p_1 = 0.95 * 0.1269 + 0.05 * 2.1269
    >>> round(LabelSmoothingLoss(alpha=0.1)(logits, labels).item(), 4)
    0.2269

    Args:
        alpha: smoothing weight in ``[0, 1]``.
        reduction: ``"mean"`` over voxels, ``"sum"``, or ``"none"`` for the ``(B, 1, *spatial)`` map.
    """

    def __init__(self, alpha: float = 0.1, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.alpha = check_number(
            "alpha", alpha, 0, 1, hint="the probability mass spread over the classes; 0.1 in the bundles"
        )

    def per_voxel(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels, reduction="none", label_smoothing=self.alpha).unsqueeze(1)
