"""Cross-entropy + Dice, the usual segmentation baseline ("CE+DSC" in the NACL/CRaC papers)."""

from __future__ import annotations

import torch
from monai.losses import DiceCELoss
from torch.nn.modules.loss import _Loss

from calib_monai.checks import check_number, check_option
from calib_monai.losses._inputs import prepare_inputs

__all__ = ["CEDiceLoss"]


class CEDiceLoss(_Loss):
    """Cross-entropy plus soft Dice on softmax probabilities, built on ``monai.losses.DiceCELoss``.

    .. math::
        \\mathcal{L} = \\lambda_{CE} \\, \\mathrm{mean}_n(-\\log p_{n, y_n})
            + \\lambda_{Dice} \\, \\mathrm{mean}_{b, c}\\left(1 - \\frac{2 \\sum_n p_{bnc} y_{bnc} + s_{nr}}
            {\\sum_n p_{bnc} + \\sum_n y_{bnc} + s_{dr}}\\right)

    with ``p = softmax(logits)``, ``y`` the one-hot labels, ``s_dr = 1e-5``, both weights 1 by default; class 0 is in
    the Dice term by default. Milletari et al., "V-Net", 3DV 2016 (the Dice term); the CE+DSC baseline of Murugesan
    et al., NACL, MICCAI 2023 / MedIA 2024. Source code and differences: ``docs/notes/losses.md``.

    >>> import torch
    >>> logits = torch.zeros(1, 2, 1, 2)  # uniform: p = 1/2 everywhere
    >>> labels = torch.tensor([[[0, 1]]])
    >>> # CE = log 2; Dice of each class (2 * 1/2 + s) / (1 + 1 + s) ~ 1/2, so 1 - Dice = 1/2
    >>> round(CEDiceLoss()(logits, labels).item(), 4)
    1.1931

    Args:
        include_background: whether class 0 enters the Dice term (the CE term always covers every class).
        lambda_dice: weight of the Dice term, >= 0.
        lambda_ce: weight of the cross-entropy term, >= 0.
        reduction: ``"mean"`` or ``"sum"`` (passed to ``DiceCELoss``; there is no per-voxel Dice).
        smooth_nr: Dice numerator smoothing ``s_nr``.
        squared_pred: whether the Dice denominator sums squared probabilities ``sum_n p^2`` (the V-Net form, used
            by the Average Calibration Losses paper's DiceCE baseline) instead of ``sum_n p``.
    """

    def __init__(
        self,
        include_background: bool = True,
        lambda_dice: float = 1.0,
        lambda_ce: float = 1.0,
        reduction: str = "mean",
        smooth_nr: float = 1e-5,
        squared_pred: bool = False,
    ) -> None:
        super().__init__(reduction=check_option("reduction", str(reduction), ("mean", "sum")))
        check_number("lambda_dice", lambda_dice, 0, hint="the weight of the Dice term")
        check_number("lambda_ce", lambda_ce, 0, hint="the weight of the cross-entropy term")
        self.dice_ce = DiceCELoss(
            include_background=include_background,
            to_onehot_y=True,
            softmax=True,
            reduction=reduction,
            smooth_nr=smooth_nr,
            squared_pred=squared_pred,
            lambda_dice=lambda_dice,
            lambda_ce=lambda_ce,
        )

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.of_prepared(*prepare_inputs(input, target, owner=self))

    def of_prepared(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of inputs ``prepare_inputs`` already checked (a loss that contains this one checks them once)."""
        return self.dice_ce(logits, labels.unsqueeze(1))
