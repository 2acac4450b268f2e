"""Margin-based label smoothing (MbLS)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from calib_monai.checks import check_number, check_option
from calib_monai.losses._inputs import PerVoxelLoss

__all__ = ["MbLSLoss"]


class MbLSLoss(PerVoxelLoss):
    """Cross-entropy plus a hinge penalty on logit distances larger than a margin.

    .. math::
        \\mathcal{L} = \\mathrm{mean}_n(-\\log p_{n, y_n})
            + \\alpha \\, \\mathrm{mean}_{n, c} \\, \\phi\\left(\\max_j l_{nj} - l_{nc} - m\\right),
        \\qquad \\phi(x) = \\max(0, x) \\ (\\text{"l1"}) \\ \\text{or} \\ \\max(0, x)^2 \\ (\\text{"l2"})

    Liu et al., "The Devil is in the Margin: Margin-based Label Smoothing for Network Calibration", CVPR 2022
    (Eq. 8-9; ``m = 10``, ``alpha = 0.1``). ``penalty="l2"`` is the squared hinge, the quadratic penalty of the same
    inequality ``max_j l_j - l_c <= m`` (one-sided, unlike the reference code's L2 variant: ``docs/notes/losses.md``).

    >>> import torch
    >>> logits = torch.tensor([[[[12.0]], [[0.0]]]])  # distances max_j l_j - l_c: 0 and 12
    >>> labels = torch.tensor([[[0]]])
    >>> # CE = log(1 + e^-12) ~ 6e-6; penalty: mean over classes of max(0, d - 10) = (0 + 2) / 2 = 1
    >>> round(MbLSLoss(margin=10.0, alpha=0.1)(logits, labels).item(), 4)
    0.1

    Args:
        margin: the margin ``m`` on logit distances.
        alpha: weight of the penalty.
        penalty: ``"l1"`` (hinge) or ``"l2"`` (squared hinge).
        reduction: ``"mean"`` over voxels, ``"sum"``, or ``"none"`` for the ``(B, 1, *spatial)`` map.
    """

    def __init__(self, margin: float = 10.0, alpha: float = 0.1, penalty: str = "l1", reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.margin = check_number(
            "margin", margin, 0, hint="the logit distance m tolerated before the penalty; the papers use 10"
        )
        self.alpha = check_number("alpha", alpha, 0, hint="the weight lambda of the margin penalty; the papers use 0.1")
        self.penalty = check_option("penalty", penalty, ("l1", "l2"))

    def per_voxel(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        ce = F.cross_entropy(logits, labels, reduction="none").unsqueeze(1)
        # relu((max_j l_j - m) - l_c): the margin is subtracted on the (B, 1, ...) max, one full-size op fewer
        hinge = F.relu((logits.amax(dim=1, keepdim=True) - self.margin) - logits)
        if self.penalty == "l2":
            hinge = hinge * hinge
        return ce + self.alpha * hinge.mean(dim=1, keepdim=True)
