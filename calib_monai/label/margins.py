"""The margins answer of MONAI Label (``<bundle>_margins``): each structure's outer contour, prediction and inner
contour (:mod:`calib_monai.review.contours`) as three nested segments of one uint8 label map (no MONAI Label import).

Per structure ``k``: ``"<name> (outer 90%)"`` ``3k - 2``, ``"<name> (predicted)"`` ``3k - 1`` and ``"<name> (inner
90%)"`` ``3k`` (90% = 1 - alpha). One value per voxel: the inner contour overrides the prediction, which overrides
the outer band, so a structure's outer contour is the union of its three segments.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from calib_monai.review.contours import contour_segment_name

__all__ = ["PREDICTED_SUFFIX", "margins_label_map", "margins_label_names"]

PREDICTED_SUFFIX = " (predicted)"


def margins_label_names(label_names: Mapping[int, str], alpha: float) -> dict[str, int]:
    """``{name: value}`` of the margins map (see the module): every value named (Slicer names segments by position)."""
    names = {"background": 0}
    for value, name in sorted(label_names.items()):
        if value > 0:
            names[contour_segment_name(name, "outer", alpha)] = 3 * value - 2
            names[name + PREDICTED_SUFFIX] = 3 * value - 1
            names[contour_segment_name(name, "inner", alpha)] = 3 * value
    return names


def margins_label_map(segmentation: np.ndarray, inner: np.ndarray, outer: np.ndarray) -> np.ndarray:
    """The margins map (uint8, the segmentation's shape) of the labels ``segmentation`` and the contours ``inner`` and
    ``outer`` (``(C - 1, *spatial)``, structure ``k`` at ``k - 1``): the outer contours first (a later structure's
    over an earlier one's), then the predictions, then the inner contours."""
    segmentation = np.asarray(segmentation).astype(np.int64)
    inner, outer = np.asarray(inner) > 0, np.asarray(outer) > 0
    if inner.shape != outer.shape or inner.shape[1:] != segmentation.shape:
        raise ValueError(
            f"the contours {inner.shape} / {outer.shape} are not one volume per structure on the segmentation's grid "
            f"{segmentation.shape}: the bundle's contour step must run on the delivered segmentation's grid"
        )
    if 3 * len(inner) > np.iinfo(np.uint8).max:
        raise ValueError(f"{len(inner)} structures need margin values up to {3 * len(inner)}: more than uint8 holds")
    out = np.zeros(segmentation.shape, dtype=np.int64)
    for k in range(1, len(outer) + 1):
        out[outer[k - 1]] = 3 * k - 2
    out = np.where(segmentation > 0, 3 * segmentation - 1, out)
    for k in range(1, len(inner) + 1):
        out[inner[k - 1]] = 3 * k
    return out.astype(np.uint8)
