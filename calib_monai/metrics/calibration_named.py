"""Calibration metrics whose paper fixes the voxels, classes and bins: mL1-ACE, classwise ECE over every voxel, and
mL1-ACE of the ground-truth foreground (``METRIC_DEFINITIONS``).

Their defaults are the papers' definitions, per volume (``reduction="mean"``: each volume's value, then the mean over
volumes, as the papers' tables; ``"pooled"`` bins the voxels of all volumes together, ``"none"`` returns the
per-volume values). The same names work as ``metric_name`` of ``segmentation_calibration`` and
``SegmentationCalibrationMetric``, whose arguments left None take the same definitions.

Why the definitions matter: on ground-truth foreground voxels with the background class included (``ml1ace_gt``),
the background probability of a foreground voxel sits in the low bins with no background label there, and every
non-empty bin weighs the same in mL1-ACE, so a perfectly calibrated model scores far from 0 (measurements:
``docs/notes/metrics.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calib_monai.checks import check_positive_int

from ._inputs import check_foreground
from .calibration_error import calibration_errors, segmentation_calibration

__all__ = ["cece_all", "ml1ace", "ml1ace_gt"]


def _reduced(
    probs: Any, labels: Any, name: str, num_bins: int, foreground: str, include_background: bool, reduction: str
) -> float | np.ndarray:
    num_bins, foreground = (
        check_positive_int("num_bins", num_bins),
        check_foreground(foreground),
    )  # None is not a definition here
    if reduction == "pooled":
        return calibration_errors(probs, labels, (name,), num_bins, foreground, include_background)[name]
    return segmentation_calibration(probs, labels, name, num_bins, foreground, reduction, include_background)


def ml1ace(
    probs: Any,
    labels: Any,
    num_bins: int = 20,
    foreground: str = "all",
    include_background: bool = False,
    reduction: str = "mean",
) -> float | np.ndarray:
    """Marginal L1 average calibration error, mL1-ACE (Barfoot et al., "Average Calibration Losses for Reliable
    Uncertainty in Medical Image Segmentation", arXiv:2506.03942): by default the paper's definition, per volume over
    every voxel, background class excluded, 20 bins, then the mean over volumes.

    ``mL1-ACE = 1/K sum_k 1/|B_k+| sum_{b in B_k+} |mean_{B_kb} [y == k] - mean_{B_kb} p_k|``: the bins of CECE
    (equal-width bins ``(b / M, (b + 1) / M]`` of each class probability p_k, 0 in the first), but every non-empty
    bin ``B_k+`` weighted equally instead of by its share of the voxels (the "average" calibration error of
    Neumann et al. 2018; MONAI's ``CalibrationErrorMetric(calibration_reduction="average")``). It is the quantity
    that :class:`~calib_monai.losses.HardL1ACELoss` optimises (20 bins; the loss's calibration term on one image
    with ``include_background`` as here equals this metric of that image, ``empty_classes="include"``, or any
    setting when every class is present).

    Every class 1..C-1 (0..C-1 with ``include_background=True``) is scored, also one absent from the labels (its
    frequency is 0 in every bin). Bin edges are exactly ``k / M``. The authors' evaluation code and the differences
    from it: ``docs/notes/metrics.md``.

    >>> import numpy as np
    >>> probs = np.array([[[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]])  # (B, C, *spatial): 1 volume, 4 voxels
    >>> labels = np.array([[1, 0, 0, 0]])
    >>> # class 1 (background excluded), bins of 0.8 (2 voxels, frequency 1/2), 0.3 and 0.1 (frequency 0):
    >>> round(ml1ace(probs, labels, num_bins=10), 4)  # (|0.5 - 0.8| + |0 - 0.3| + |0 - 0.1|) / 3
    0.2333

    Args:
        probs, labels: as ``segmentation_calibration``.
        num_bins, foreground, include_background: the paper's 20, ``"all"``, False by default; ``foreground="gt"``,
            ``include_background=True``, 15 bins, ``reduction="pooled"`` is ``ml1ace_gt``.
        reduction: ``"mean"`` (per volume, then the mean), ``"pooled"`` or ``"none"``.
    """
    return _reduced(probs, labels, "ml1ace", num_bins, foreground, include_background, reduction)


def ml1ace_gt(probs: Any, labels: Any, num_bins: int = 15, include_background: bool = True) -> float:
    """mL1-ACE of the ground-truth foreground voxels (label != 0), background class included, pooled over all volumes
    given, comparable with the foreground metrics of NACL / CRaC. Not the paper's metric: on these voxels the
    background class contributes bins with no background label, so it is far from 0 for a calibrated model.

    >>> import numpy as np
    >>> probs = np.array([[[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]])  # (B, C, *spatial): 1 volume, 4 voxels
    >>> labels = np.array([[1, 0, 0, 0]])
    >>> round(ml1ace_gt(probs, labels, num_bins=10), 4)  # voxel 0 only: class 0 |0 - 0.2|, class 1 |1 - 0.8|
    0.2
    """
    return calibration_errors(probs, labels, ("ml1ace",), num_bins, "gt", include_background)["ml1ace"]


def cece_all(
    probs: Any, labels: Any, num_bins: int = 20, include_background: bool = False, reduction: str = "mean"
) -> float | np.ndarray:
    """Classwise ECE over every voxel, per volume, background excluded, 20 bins, then the mean over volumes: the
    "ECE" of the papers that score every voxel (MONAI's ``CalibrationErrorMetric`` with its default
    ``calibration_reduction="expected"``, as the mL1-ACE authors' evaluation reports it beside mL1-ACE: same
    20 bins, background excluded, per case).

    ``CECE = 1/K sum_k sum_b |B_kb| / N * |mean_{B_kb} [y == k] - mean_{B_kb} p_k|`` over all N voxels of a volume
    (the bins of ``cece`` and ``ml1ace``, each weighted by its share of the voxels).

    >>> import numpy as np
    >>> probs = np.array([[[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]])  # (B, C, *spatial): 1 volume, 4 voxels
    >>> labels = np.array([[1, 0, 0, 0]])
    >>> round(cece_all(probs, labels, num_bins=10), 4)  # class 1: 2/4 * 0.3 + 1/4 * 0.3 + 1/4 * 0.1
    0.25
    """
    return _reduced(probs, labels, "cece", num_bins, "all", include_background, reduction)
