"""Confidence penalty: cross-entropy minus a multiple of the prediction entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from calib_monai.checks import check_number, check_option
from calib_monai.losses._inputs import PerVoxelLoss

__all__ = ["ECPLoss"]


class ECPLoss(PerVoxelLoss):
    """Entropy-based confidence penalty (ECP).

    .. math::
        \\mathcal{L} = \\mathrm{mean}_n\\left(-\\log p_{n, y_n} - \\alpha H(p_n)\\right), \\qquad
        H(p_n) = -\\frac{1}{Z} \\sum_{c=1}^{C} p_{nc} \\log p_{nc}

    Pereyra et al., "Regularizing Neural Networks by Penalizing Confident Output Distributions", ICLR-W 2017 (the
    Shannon entropy, ``Z = 1``: ``class_reduction="sum"``). ``class_reduction="mean"`` (default) takes ``Z = C``,
    the code the NACL/CRaC numbers come from, with ``alpha = 0.1``; for a given ``alpha`` the ``"sum"`` penalty is
    ``C`` times stronger (``docs/notes/losses.md``).

    >>> import torch
    >>> logits, labels = torch.zeros(1, 2, 1, 2), torch.tensor([[[0, 1]]])  # p = 1/2: CE = H = log 2
    >>> round(ECPLoss(alpha=0.1)(logits, labels).item(), 4)  # log 2 - 0.1 log 2 / 2
    0.6585
    >>> round(ECPLoss(alpha=0.1, class_reduction="sum")(logits, labels).item(), 4)  # log 2 - 0.1 log 2
    0.6238

    Args:
        alpha: weight of the entropy term.
        class_reduction: ``"mean"`` (``Z = C``) or ``"sum"`` (``Z = 1``, the paper).
        reduction: ``"mean"`` over voxels, ``"sum"``, or ``"none"`` for the ``(B, 1, *spatial)`` map.
    """

    def __init__(self, alpha: float = 0.1, class_reduction: str = "mean", reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.alpha = check_number(
            "alpha", alpha, 0, hint="the weight of the confidence (negative entropy) penalty; 0.1 in the bundles"
        )
        self.class_reduction = check_option("class_reduction", class_reduction, ("mean", "sum"))

    def per_voxel(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        log_p = F.log_softmax(logits, dim=1)
        ce = -log_p.gather(1, labels.unsqueeze(1))
        p_log_p = log_p.exp() * log_p  # 0 * finite where p underflows, never NaN
        neg_entropy = p_log_p.mean(dim=1, keepdim=True) if self.class_reduction == "mean" else p_log_p.sum(1, True)
        return ce + self.alpha * neg_entropy
