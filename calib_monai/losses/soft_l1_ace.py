"""Soft-binned marginal L1 average calibration error (sL1-ACE) as an auxiliary loss beside DiceCE."""

from __future__ import annotations

import torch

from calib_monai.checks import check_number
from calib_monai.losses._l1ace import L1ACELoss

__all__ = ["SoftL1ACELoss"]


class SoftL1ACELoss(L1ACELoss):
    """DiceCE plus the soft-binned marginal L1 average calibration error of each training image.

    The loss of :class:`~calib_monai.losses.HardL1ACELoss` (same DiceCE, same per-image, per-class mean over
    non-empty bins, same reduction) with each probability shared between the two nearest bin *centres*
    ``c_b = (b + 1/2) / M`` by linear interpolation (a triangular membership of half-width ``1/M``):

    .. math::
        u_{nk} = M p_{nk} - \\tfrac{1}{2}, \\quad b = \\lfloor u_{nk} \\rfloor, \\quad
        w_{nk,b} = 1 - (u_{nk} - b), \\quad w_{nk,b+1} = u_{nk} - b,

    all the weight in bin 0 below ``c_0`` and in bin ``M - 1`` above ``c_{M-1}``; a probability on a centre is in
    that bin only. Per bin, the weighted means replace the plain ones,

    .. math::
        \\mathrm{ACE}_{ik} = \\frac{1}{|\\mathcal{B}^+_{ik}|} \\sum_{b \\in \\mathcal{B}^+_{ik}}
            \\frac{\\left| \\sum_n w_{nk,b} \\, p_{nk} - \\sum_n w_{nk,b} \\, [y_n = k] \\right|}{\\sum_n w_{nk,b}},
        \\qquad \\mathcal{B}^+_{ik} = \\{b : \\textstyle\\sum_n w_{nk,b} \\ge \\epsilon_{empty}\\},

    so the gradient reaches the logits through the weights as well as through ``p``. There is no width to tune: when
    every probability lies on a centre the loss equals the hard one. Barfoot et al., "Average Calibration Losses for
    Reliable Uncertainty in Medical Image Segmentation", arXiv:2506.03942 (sL1-ACE); defaults are the authors', their
    code and the differences: ``docs/notes/losses.md``.

    >>> import torch
    >>> logits = torch.zeros(1, 2, 1, 2)  # p = 1/2, between the centres 0.475 and 0.525 of 20 bins: weights 1/2
    >>> labels = torch.tensor([[[0, 1]]])  # each class observed in 1 of the 2 voxels
    >>> round(SoftL1ACELoss(lambda_dice=0.0, lambda_ce=0.0)(logits, labels).item(), 4)  # |1/2 - 1/2| in both bins
    0.0

    Args:
        num_bins, lambda_ace, lambda_dice, lambda_ce, include_background, empty_classes: as for
            :class:`~calib_monai.losses.HardL1ACELoss`, with the same defaults.
        empty_weight: ``epsilon_empty`` above, the smallest summed weight of a bin that counts (finite, >= 0; 0.01,
            the authors'; keyword only); bins without any weight never count.
    """

    def __init__(self, *args, empty_weight: float = 0.01, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.empty_weight = check_number("empty_weight", empty_weight, 0)

    def memberships(self, p: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Each probability in the bins of its two nearest centres, with the interpolation weights (differentiable)."""
        m = self.num_bins
        u = p * m - 0.5  # in units of bin centres: centre b at u = b
        lower = u.detach().floor().clamp_(0, m - 1)
        # 0 below the first centre (all weight in bin 0); above the last centre both bins are M - 1
        upper_weight = (u - lower).clamp(0.0, 1.0)
        lower_index = lower.long()
        return [(lower_index, 1.0 - upper_weight), ((lower_index + 1).clamp_(max=m - 1), upper_weight)]

    def occupied(self, count: torch.Tensor) -> torch.Tensor:
        """Bins whose summed weight is > 0 and at least ``empty_weight``."""
        return (count > 0) & (count >= self.empty_weight)
