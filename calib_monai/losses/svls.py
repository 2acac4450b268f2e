"""Spatially Varying Label Smoothing (SVLS)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from calib_monai.losses._inputs import PerVoxelLoss
from calib_monai.losses.priors import class_proportion_prior, svls_kernel

__all__ = ["SVLSLoss"]


class SVLSLoss(PerVoxelLoss):
    """Cross-entropy against the SVLS soft target: the one-hot labels filtered by the SVLS kernel.

    .. math::
        \\tilde y_{n}^{c} = \\sum_{i \\in N_k(n)} w_i \\, y_i^c, \\qquad
        \\mathcal{L} = \\mathrm{mean}_n\\left(-\\sum_c \\tilde y_n^c \\log p_{nc}\\right)

    with ``w`` the :func:`~calib_monai.losses.priors.svls_kernel` over the ``k^dim`` patch ``N_k(n)`` (centre 0.5,
    neighbours a Gaussian sharing 0.5) and replicate padding at the image border, so ``tilde y`` sums to 1 everywhere.
    Islam & Glocker, "Spatially Varying Label Smoothing: Capturing Uncertainty from Expert Annotations", IPMI 2021
    (NACL journal Eq. 2-3). Any odd ``k >= 3``, 2D and 3D: the centre is ``k // 2``, the padding ``k // 2``
    (the reference code is right for ``k = 3`` only: ``docs/notes/losses.md``).

    >>> import torch
    >>> logits, labels = torch.zeros(1, 2, 3, 3), torch.zeros(1, 3, 3, dtype=torch.long)
    >>> round(SVLSLoss()(logits, labels).item(), 4)  # one class everywhere: the target is one-hot, CE = log 2
    0.6931

    Args:
        kernel_size: odd patch size ``k >= 3``.
        sigma: Gaussian standard deviation of the neighbour weights.
        reduction: ``"mean"`` over voxels, ``"sum"``, or ``"none"`` for the ``(B, 1, *spatial)`` map.
    """

    def __init__(self, kernel_size: int = 3, sigma: float = 1.0, reduction: str = "mean") -> None:
        super().__init__(reduction)
        svls_kernel(kernel_size, 2, sigma)  # validates kernel_size and sigma now rather than at the first batch
        self.kernel_size, self.sigma = kernel_size, float(sigma)

    def per_voxel(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        soft_target = class_proportion_prior(
            labels, logits.shape[1], self.kernel_size, "svls", border="replicate", sigma=self.sigma, dtype=logits.dtype
        )
        return -(soft_target * F.log_softmax(logits, dim=1)).sum(dim=1, keepdim=True)
