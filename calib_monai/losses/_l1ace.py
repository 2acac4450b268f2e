"""What :class:`~calib_monai.losses.HardL1ACELoss` and :class:`~calib_monai.losses.SoftL1ACELoss` share: argument
checks, the DiceCE term, the per-bin sums and the reduction over bins, classes and images. They differ only in how a
probability is assigned to bins (:meth:`L1ACELoss.memberships`) and which bins count as empty
(:meth:`L1ACELoss.occupied`). Sums are scatters into fixed-size tensors on the logits' device (no host read-back), in
the logits' dtype (float32 for float16 / bfloat16 logits).
"""

from __future__ import annotations

import torch
from torch.nn.modules.loss import _Loss

from calib_monai.checks import check_number, check_option, check_positive_int
from calib_monai.defaults import L1ACE_NUM_BINS
from calib_monai.losses._inputs import prepare_inputs
from calib_monai.losses.ce_dice import CEDiceLoss

__all__ = ["EMPTY_CLASSES", "L1ACELoss"]

#: What the calibration term does with a class absent from an image's labels (``L1ACELoss``'s ``empty_classes``).
EMPTY_CLASSES = ("zero", "exclude", "include")

# The Dice term of the paper's DiceCE (authors' bundle_templates/configs/loss/*_dice_ce.yaml, dice_params).
PAPER_DICE = {"smooth_nr": 0.0, "squared_pred": True}  # smooth_dr: 1e-5, CEDiceLoss's


class L1ACELoss(_Loss):
    """Base class: ``lambda_dice * Dice + lambda_ce * CE + lambda_ace * mL1-ACE`` (Barfoot et al.,
    arXiv:2506.03942); arguments as :class:`~calib_monai.losses.HardL1ACELoss`."""

    def __init__(
        self,
        num_bins: int = L1ACE_NUM_BINS,
        lambda_ace: float = 1.0,
        lambda_dice: float = 1.0,
        lambda_ce: float = 1.0,
        include_background: bool = True,
        empty_classes: str = "zero",
    ) -> None:
        super().__init__()
        self.num_bins = check_positive_int("num_bins", num_bins)
        self.lambda_ace = check_number("lambda_ace", lambda_ace, 0)
        self.lambda_dice = check_number("lambda_dice", lambda_dice, 0)
        self.lambda_ce = check_number("lambda_ce", lambda_ce, 0)
        if not (self.lambda_ace or self.lambda_dice or self.lambda_ce):
            raise ValueError("lambda_ace, lambda_dice and lambda_ce are all 0: at least one must be > 0.")
        self.include_background = bool(include_background)
        self.empty_classes = check_option("empty_classes", empty_classes, EMPTY_CLASSES)
        self.segmentation = None
        if self.lambda_dice or self.lambda_ce:
            self.segmentation = CEDiceLoss(self.include_background, self.lambda_dice, self.lambda_ce, **PAPER_DICE)

    def memberships(self, p: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The bins each probability of ``p (B, C, N)`` is counted in: ``(bin index (B, C, N) int64, weight (B, C, N)
        or None for 1)`` pairs whose weights add up to 1 per probability."""
        raise NotImplementedError

    def occupied(self, count: torch.Tensor) -> torch.Tensor:
        """Which bins of the per-bin weight sums ``count (B, C, M)`` are not empty (enter the mean over bins)."""
        return count > 0

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits, labels = prepare_inputs(input, target, owner=self)
        if not self.lambda_ace:
            return self.segmentation.of_prepared(logits, labels)
        term = self.lambda_ace * self._calibration_term(logits, labels)
        return term if self.segmentation is None else self.segmentation.of_prepared(logits, labels) + term

    def calibration_term(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mL1-ACE term alone, unweighted (what ``forward`` multiplies by ``lambda_ace``): a scalar in the autograd
        graph of ``input`` (logits, as for ``forward``)."""
        return self._calibration_term(*prepare_inputs(input, target, owner=self))

    def per_image_class(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ace, present)``, both ``(B, C)``: each image's L1 ACE of each class (mean over its non-empty bins of
        ``|mean p_k - mean [y == k]|``) and whether the class is in the image's labels; checked plain ``logits``
        and ``int64`` labels ``(B, *spatial)`` (as ``prepare_inputs`` returns them)."""
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        p = torch.softmax(logits, dim=1).flatten(2)
        batch, classes, m = p.shape[0], p.shape[1], self.num_bins
        own = labels.reshape(batch, 1, -1)
        offsets = (torch.arange(batch * classes, device=p.device) * m).view(batch, classes, 1)
        count, sum_p, hits = (p.new_zeros(batch * classes * m) for _ in range(3))
        for index, weight in self.memberships(p):
            keys = index + offsets  # (B, C, N): flat bin of (image, class, bin)
            w = torch.ones_like(p) if weight is None else weight
            count = count.scatter_add(0, keys.view(-1), w.reshape(-1))
            sum_p = sum_p.scatter_add(0, keys.view(-1), (p if weight is None else weight * p).reshape(-1))
            # [y == k] is 1 only in the voxel's own class: its bins and weights
            hits = hits.scatter_add(0, keys.gather(1, own).view(-1), w.gather(1, own).reshape(-1))
        count, sum_p, hits = (t.view(batch, classes, m) for t in (count, sum_p, hits))
        occupied = self.occupied(count)
        # |mean p - mean y| = |sum p - sum y| / count in the occupied bins (a safe denominator elsewhere)
        gaps = (sum_p - hits).abs() / torch.where(occupied, count, torch.ones_like(count))
        ace = (gaps * occupied).sum(-1) / occupied.sum(-1).clamp(min=1)
        # every voxel's weights add up to 1, so a class's hits add up to its voxel count: > 0 iff present
        return ace, hits.sum(-1) > 0

    def _calibration_term(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        ace, present = self.per_image_class(logits, labels)
        first = 0 if self.include_background else 1
        ace, present = ace[:, first:], present[:, first:]
        if self.empty_classes == "include":
            return ace.mean()
        kept = torch.where(present, ace, torch.zeros_like(ace))
        if self.empty_classes == "zero":
            return kept.mean()
        return kept.sum() / present.sum().clamp(min=1)
