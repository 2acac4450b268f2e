"""The margins answer of MONAI Label (``<bundle>_margins``): each structure's inner and outer contour
(:mod:`calib_monai.review.contours`) and its prediction as three nested segments of one uint8 label map, which the
stock 3D Slicer module imports as named segments (no MONAI Label import here).

Per structure ``k``: ``"<name> (outer 90%)"`` ``3k - 2``, ``"<name> (predicted)"`` ``3k - 1`` and ``"<name> (inner
90%)"`` ``3k`` (90% = 1 - alpha). A label map holds one value per voxel, so the inner contour overrides the
prediction, which overrides the outer contour (of any structure): the outer contour is the union of a structure's
three segments, its prediction the union of the last two, and the ``(outer 90%)`` segment is the band the outer
contour adds around the prediction.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from calib_monai.review.contours import contour_segment_name

__all__ = ["PREDICTED_SUFFIX", "margins_label_map", "margins_label_names"]

PREDICTED_SUFFIX = " (predicted)"


def margins_label_names(label_names: Mapping[int, str], alpha: float) -> dict[str, int]:
    """``{name: value}`` of the margins map: background 0, then per structure ``k`` its outer band ``3k - 2``, its
    prediction ``3k - 1`` and its inner contour ``3k``: consecutive values, every one named, as Slicer's MONAI Label
    module needs them (it names the imported segments by position)."""
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
