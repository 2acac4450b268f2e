"""Hard-binned marginal L1 average calibration error (hL1-ACE) as an auxiliary loss beside DiceCE."""

from __future__ import annotations

import torch

from calib_monai.losses._l1ace import L1ACELoss
from calib_monai.metrics.calibration_torch import equal_width_bins

__all__ = ["HardL1ACELoss"]


class HardL1ACELoss(L1ACELoss):
    """DiceCE plus the hard-binned marginal L1 average calibration error of each training image.

    .. math::
        \\mathcal{L} = \\lambda_{Dice} \\, \\mathcal{L}_{Dice} + \\lambda_{CE} \\, \\mathcal{L}_{CE}
            + \\lambda_{ACE} \\, \\mathrm{mean}_{i, k} \\, \\mathrm{ACE}_{ik},
        \\qquad \\mathrm{ACE}_{ik} = \\frac{1}{|\\mathcal{B}^+_{ik}|} \\sum_{b \\in \\mathcal{B}^+_{ik}}
            \\left| \\frac{1}{|B_{ikb}|} \\sum_{n \\in B_{ikb}} p_{nk}
            - \\frac{1}{|B_{ikb}|} \\sum_{n \\in B_{ikb}} [y_n = k] \\right|

    for image ``i`` of the batch and class ``k``: ``p = softmax(logits)``; ``B_ikb`` the voxels of image ``i`` whose
    ``p_k`` lies in bin ``b = (b/M, (b+1)/M]`` (0 in the first bin), all voxels of the image, not a foreground
    selection; ``B+_ik`` the non-empty bins, each weighted equally (an *average*, not expected, calibration error:
    the mean predicted probability and the observed frequency of class ``k`` are compared per bin, whatever the bin's
    voxel count). The mean over classes makes it *marginal* (classwise), over the images of the batch *per image*.
    The bin assignment is not differentiable; the per-bin means are, so the gradient reaches the logits through
    ``mean p`` of each bin. ``L_Dice`` and ``L_CE`` are the paper's DiceCE: softmax Dice with squared
    probabilities in the denominator (``squared_pred``, ``smooth_nr=0``, ``smooth_dr=1e-5``, background included)
    and cross-entropy (:class:`~calib_monai.losses.CEDiceLoss`).

    Barfoot, Garcia-Peraza-Herrera, Akcay, Glocker, Vercauteren, "Average Calibration Losses for Reliable
    Uncertainty in Medical Image Segmentation", arXiv:2506.03942 (IEEE TMI 2026; first as "Average Calibration
    Error: A Differentiable Loss for Improved Reliability in Image Segmentation", MICCAI 2024). Code:
    github.com/cai4cai/Average-Calibration-Losses (commit 5ad8418; ``src/losses/hardl1ace.py``), which MONAI's open
    pull request #9092 (``monai.losses.HardL1ACELoss``, the calibration term alone, issue #8505) ports.

    Defaults, from the authors' code and configs: ``num_bins=20`` (``hardl1ace.py`` l. 116;
    ``bundle_templates/configs/loss/hardl1ace_dice_ce.yaml`` l. 11), background included (l. 12), classes absent
    from an image's labels contribute 0 (``ignore_empty_classes``, l. 15; ``hardl1ace.py`` l. 239-241), and Dice,
    CE and mL1-ACE weighted equally (``ace_weight = dice_weight = ce_weight = 0.33``, yaml l. 6-8): the same ratio
    with this library's unit Dice and CE weights is ``lambda_ace = 1``. The common factor 0.33 only scales the
    gradient (Adam, which the bundles use, is invariant to it up to its epsilon); pass 0.33 for all three to get
    the authors' numbers.

    Same as the authors' code (tests/test_losses_l1_ace.py holds the values equal on seeded inputs, within float32
    rounding): per-image, per-class bins over all voxels, softmax inside, mean over non-empty bins (``nanmean``,
    l. 236), then over images and classes with absent classes counted as 0 (l. 239-241, 264-265). Where it differs:

    * bin edges: exact ``k / M`` (a value on an edge goes to the lower bin, as the authors' ``bucketize(...,
      right=False)``, l. 89, and as :func:`calib_monai.metrics.ml1ace`); the authors' edges are ``k (1 + eps32) / M``
      in float32 (l. 71-76), so a probability within 1.2e-7 relative above ``k / M`` is in bin ``k`` here and in
      bin ``k - 1`` there. This keeps the loss equal to the project's metric.
    * empty classes: ``empty_classes="zero"`` is the authors' ``ignore_empty_classes=True`` (the term of an absent
      class is 0 and still counts in the mean over ``B x C``), ``"include"`` their ``False``; ``"exclude"`` (the
      mean over the present (image, class) pairs only) is an addition.
    * inputs: logits and integer labels (this library's contract) instead of the authors' activation switches and
      one-hot targets; no per-class ``weight`` and no ``reduction`` (the loss is the scalar above).

    With ``foreground="all"`` and ``num_bins`` as here, :func:`calib_monai.metrics.ml1ace` of the softmax of one
    image equals the calibration term (``empty_classes="include"``, or any setting when every class is present):
    the loss optimises the metric. :meth:`calibration_term` returns the term alone (MONAI's ``HardL1ACELoss``).

    Args:
        num_bins: number of equal-width bins ``M`` (integer >= 1; 20, the authors').
        lambda_ace: weight of the mL1-ACE term (finite, >= 0; 1: the authors' equal weighting).
        lambda_dice: weight of the Dice term (finite, >= 0; 0 with ``lambda_ce=0`` leaves the mL1-ACE term alone).
        lambda_ce: weight of the cross-entropy term (finite, >= 0).
        include_background: whether class 0 enters the mL1-ACE and Dice terms (True, the authors').
        empty_classes: ``"zero"`` (the authors'), ``"exclude"`` or ``"include"``: see above.
    """

    def memberships(self, p: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Each probability in its one bin ``(k/M, (k+1)/M]`` with weight 1 (the index computed exactly, in float64)."""
        return [(equal_width_bins(p.detach().double(), self.num_bins, p.dtype), None)]
