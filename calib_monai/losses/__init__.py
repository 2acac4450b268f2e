"""Calibration losses, one per module (each class docstring gives its formula and paper). All take logits
``(B, C, H, W[, D])`` and integer labels ``(B, 1, H, W[, D])`` or ``(B, H, W[, D])``, checked by
:func:`calib_monai.losses._inputs.prepare_inputs`.
"""

from __future__ import annotations

from calib_monai.losses.ce_dice import CEDiceLoss
from calib_monai.losses.crac import CRaCLoss
from calib_monai.losses.ecp import ECPLoss
from calib_monai.losses.focal import FocalLoss
from calib_monai.losses.hard_l1_ace import HardL1ACELoss
from calib_monai.losses.label_smoothing import LabelSmoothingLoss
from calib_monai.losses.mbls import MbLSLoss
from calib_monai.losses.nacl import NACLLoss
from calib_monai.losses.priors import boundary_mask, class_proportion_prior, svls_kernel
from calib_monai.losses.soft_l1_ace import SoftL1ACELoss
from calib_monai.losses.svls import SVLSLoss

__all__ = [
    "CEDiceLoss",
    "CRaCLoss",
    "ECPLoss",
    "FocalLoss",
    "HardL1ACELoss",
    "LabelSmoothingLoss",
    "MbLSLoss",
    "NACLLoss",
    "SVLSLoss",
    "SoftL1ACELoss",
    "boundary_mask",
    "class_proportion_prior",
    "svls_kernel",
]
