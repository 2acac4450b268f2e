"""Hard-binned marginal L1 average calibration error (hL1-ACE) as an auxiliary loss beside DiceCE."""

from __future__ import annotations

import torch

from calib_monai.losses._l1ace import L1ACELoss
from calib_monai.metrics.calibration import equal_width_bin

__all__ = ["HardL1ACELoss"]


class HardL1ACELoss(L1ACELoss):
    """DiceCE plus the hard-binned marginal L1 average calibration error of each training image.

    .. math::
        \\mathcal{L} = \\lambda_{Dice} \\, \\mathcal{L}_{Dice} + \\lambda_{CE} \\, \\mathcal{L}_{CE}
            + \\lambda_{ACE} \\, \\mathrm{mean}_{i, k} \\, \\mathrm{ACE}_{ik},
        \\qquad \\mathrm{ACE}_{ik} = \\frac{1}{|\\mathcal{B}^+_{ik}|} \\sum_{b \\in \\mathcal{B}^+_{ik}}
            \\left| \\frac{1}{|B_{ikb}|} \\sum_{n \\in B_{ikb}} p_{nk}
            - \\frac{1}{|B_{ikb}|} \\sum_{n \\in B_{ikb}} [y_n = k] \\right|

    for image ``i`` of the batch and class ``k``: ``p = softmax(logits)``; ``B_ikb`` the voxels of image ``i`` (all
    of them) whose ``p_k`` lies in bin ``b = (b/M, (b+1)/M]`` (0 in the first bin, a value on an edge in the lower
    bin, as :func:`calib_monai.metrics.ml1ace`); ``B+_ik`` the non-empty bins, each weighted equally (an *average*
    calibration error). The bin assignment is not differentiable; the gradient reaches the logits through each bin's
    ``mean p``. ``L_Dice`` and ``L_CE`` are the paper's DiceCE (:class:`~calib_monai.losses.CEDiceLoss` with
    ``squared_pred``, ``smooth_nr=0``, ``smooth_dr=1e-5``, background included). The loss is the scalar above (no
    ``reduction``); :meth:`calibration_term` returns the term alone, which equals :func:`calib_monai.metrics.ml1ace`
    (``foreground="all"``) of one image's softmax when every class is present or ``empty_classes="include"``.

    Barfoot, Garcia-Peraza-Herrera, Akcay, Glocker, Vercauteren, "Average Calibration Losses for Reliable
    Uncertainty in Medical Image Segmentation", arXiv:2506.03942 (IEEE TMI 2026; MICCAI 2024). Defaults are the
    authors'; their code and the differences: ``docs/notes/losses.md``.

    >>> import torch
    >>> logits = torch.zeros(1, 2, 1, 2)  # p = 1/2 for both classes, in bin 9 of 20 ((0.45, 0.5])
    >>> labels = torch.tensor([[[0, 1]]])  # each class observed in 1 of the 2 voxels: frequency 1/2
    >>> round(HardL1ACELoss(lambda_dice=0.0, lambda_ce=0.0)(logits, labels).item(), 4)  # |1/2 - 1/2| = 0
    0.0
    >>> labels = torch.tensor([[[0, 0]]])  # class 0 everywhere: |1/2 - 1| = 1/2; class 1 absent ("zero"): 0
    >>> round(HardL1ACELoss(lambda_dice=0.0, lambda_ce=0.0)(logits, labels).item(), 4)  # mean over classes
    0.25

    Args:
        num_bins: number of equal-width bins ``M`` (integer >= 1; 20, the authors').
        lambda_ace: weight of the mL1-ACE term (finite, >= 0; 1: the authors' equal weighting).
        lambda_dice: weight of the Dice term (finite, >= 0; 0 with ``lambda_ce=0`` leaves the mL1-ACE term alone).
        lambda_ce: weight of the cross-entropy term (finite, >= 0).
        include_background: whether class 0 enters the mL1-ACE and Dice terms (True, the authors').
        empty_classes: a class absent from an image's labels: ``"zero"`` (its term is 0 and still counts in the mean
            over ``B x C``, the authors'), ``"include"`` (scored like any class) or ``"exclude"`` (the mean over the
            present (image, class) pairs only).
    """

    def memberships(self, p: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Each probability in its one bin ``(k/M, (k+1)/M]`` with weight 1 (the metrics' bin rule)."""
        return [(equal_width_bin(p.detach(), self.num_bins), None)]
