"""Neighbour-Aware CaLibration loss (NACL)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from calib_monai.checks import check_number, check_option
from calib_monai.losses._inputs import PerVoxelLoss
from calib_monai.losses.priors import BORDER_MODES, KERNEL_OPS, _check_kernel_size, class_proportion_prior

__all__ = ["NACLLoss"]


class NACLLoss(PerVoxelLoss):
    """Cross-entropy plus a penalty pulling the logits towards the class proportions of each voxel's neighbourhood.

    .. math::
        \\mathcal{L} = \\mathrm{mean}_n(-\\log p_{n, y_n})
            + \\alpha \\, \\mathrm{mean}_n \\, \\frac{1}{Z} \\sum_{k=1}^{C} d\\left(\\tau_{nk}, l_{nk}\\right),
        \\qquad d(a, b) = |a - b| \\ (\\text{"l1"}) \\ \\text{or} \\ (a - b)^2 \\ (\\text{"l2"})

    with ``tau`` the prior of :func:`~calib_monai.losses.priors.class_proportion_prior` (mean over the ``3x3``
    patch by default), ``l`` the logits (or the softmax with ``space="softmax"``), ``Z = C`` for
    ``class_reduction="mean"`` (the authors' code and MONAI: a mean over voxels and classes, with ``alpha = 0.1``)
    or ``Z = 1`` for ``"sum"`` (the paper's ``lambda sum_k |tau_k - l_k|``, Eq. 7 MICCAI / Eq. 9 journal).

    Murugesan et al., "Trust your neighbours: Penalty-based constraints for model calibration", MICCAI 2023;
    "Neighbor-Aware Calibration of Segmentation Networks with Penalty-Based Constraints", MedIA 2024.

    Border modes and kernel ops (``"max"``, ``"min"``, ``"median"``, ``"mode"``: MICCAI Table 3) are those of
    :func:`~calib_monai.losses.priors.class_proportion_prior`. The signature is a superset of
    ``monai.losses.NACLLoss``: with ``border="zeros"``, ``space="logits"``, ``class_reduction="mean"`` and
    ``kernel_ops`` ``"mean"`` or ``"gaussian"`` the value is MONAI's. Its raw probabilities overstate volumes: read
    volumes and the case score after recalibration. Sources and differences: ``docs/notes/losses.md``.

    >>> import torch
    >>> logits, labels = torch.zeros(1, 2, 3, 3), torch.zeros(1, 3, 3, dtype=torch.long)
    >>> # class 0 everywhere: tau = (1, 0) at every voxel, |tau - l| = (1, 0), mean over classes 1/2
    >>> round(NACLLoss(classes=2, dim=2, alpha=0.1)(logits, labels).item(), 4)  # log 2 + 0.1 / 2
    0.7431

    Args:
        classes: number of classes ``C``.
        dim: number of spatial dims, 2 or 3.
        kernel_size: odd window size of the prior (>= 3 for ``"svls"``; unused by ``"gaussian"``).
        kernel_ops: ``"mean"``, ``"gaussian"``, ``"svls"``, ``"max"``, ``"min"``, ``"median"`` or ``"mode"``.
        distance_type: ``"l1"`` or ``"l2"`` (squared difference).
        alpha: weight of the penalty (``lambda`` in the papers).
        sigma: Gaussian standard deviation for ``"gaussian"`` and ``"svls"``.
        border: ``"background"`` (default), ``"zeros"`` (MONAI) or ``"replicate"``.
        space: constrain the ``"logits"`` (default, the paper) or the ``"softmax"`` probabilities (ablation).
        class_reduction: ``"mean"`` (default) or ``"sum"`` over classes in the penalty.
        reduction: ``"mean"`` over voxels, ``"sum"``, or ``"none"`` for the ``(B, 1, *spatial)`` map.
    """

    def __init__(
        self,
        classes: int,
        dim: int,
        kernel_size: int = 3,
        kernel_ops: str = "mean",
        distance_type: str = "l1",
        alpha: float = 0.1,
        sigma: float = 1.0,
        border: str = "background",
        space: str = "logits",
        class_reduction: str = "mean",
        reduction: str = "mean",
    ) -> None:
        super().__init__(reduction)
        if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
            raise ValueError(f"classes must be an integer >= 2, got {classes!r}.")
        if dim not in (2, 3):
            raise ValueError(f"dim must be 2 or 3, got {dim!r}.")
        self.kernel_ops = check_option("kernel_ops", kernel_ops, KERNEL_OPS)
        _check_kernel_size(kernel_size, minimum=3 if kernel_ops == "svls" else 1)
        self.sigma = check_number("sigma", sigma, 0, low_open=True, hint="the Gaussian prior's standard deviation")
        self.classes, self.dim, self.ks = classes, dim, kernel_size
        self.distance_type = check_option("distance_type", distance_type, ("l1", "l2"))
        self.alpha = check_number(
            "alpha", alpha, 0, hint="the weight lambda of the neighbour penalty; the papers use 0.1"
        )
        self.border = check_option("border", border, BORDER_MODES)
        self.space = check_option("space", space, ("logits", "softmax"))
        self.class_reduction = check_option("class_reduction", class_reduction, ("mean", "sum"))

    def per_voxel(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        log_p = F.log_softmax(logits, dim=1)
        ce = -log_p.gather(1, labels.unsqueeze(1))
        tau = class_proportion_prior(
            labels, self.classes, self.ks, self.kernel_ops, self.border, self.sigma, logits.dtype
        )
        constrained = logits if self.space == "logits" else log_p.exp()
        gap = constrained - tau
        distance = gap.abs() if self.distance_type == "l1" else gap * gap
        penalty = distance.mean(dim=1, keepdim=True) if self.class_reduction == "mean" else distance.sum(1, True)
        return ce + self.alpha * penalty
