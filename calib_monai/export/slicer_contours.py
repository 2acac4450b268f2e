"""The contours in the 3D Slicer segmentation: per structure the segments ``"<name> (outer 90%)"`` and
``"<name> (inner 90%)"`` (90% = 1 - alpha) from ``inferring``'s ``<case>_inner/_outer.nii.gz`` or
``Prediction.contours``, with the lambdas, alpha and epsilon in segment tags and ``calib_monai_contours_*`` fields.
The inner contours lie inside their disjoint predictions and share one layer (value: the label value); the outer ones
may overlap, so each has its own layer (value 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from calib_monai.review.contours import contour_segment_name

from .slicer_inputs import ArrayOrPath, load_volume

__all__ = ["contour_segments", "contour_stack"]

_FIX = "write the contours with the segmentation again (the bundle's inferring step)"


def contour_stack(volume: ArrayOrPath, shape: Sequence[int], affine: np.ndarray, what: str) -> np.ndarray:
    """``(structures, *shape)`` uint8 of one contour output: a NIfTI file or image (structure last; one structure: 3D)
    or an array or tensor (structure first), checked to lie on the segmentation's grid (``shape``, ``affine``)."""
    array, own = load_volume(volume, what)
    if own is not None and not np.allclose(own, affine, atol=1e-4):
        raise ValueError(f"{what} is not on the segmentation's grid (affine\n{own}\nvs\n{affine}): {_FIX}")
    affine = own
    shape = tuple(int(s) for s in shape)
    if array.ndim == len(shape):
        array = array[None]
    elif affine is not None and array.ndim == len(shape) + 1:
        array = np.moveaxis(array, -1, 0)
    if array.shape[1:] != shape:
        raise ValueError(
            f"{what} has shape {tuple(array.shape)}, not one volume per structure on the segmentation's grid {shape}: "
            f"{_FIX}"
        )
    return (np.asarray(array) > 0).astype(np.uint8)


def _tags(kind: str, entry: Mapping[str, Any], contours: Mapping[str, Any]) -> str:
    """Slicer segment tags (``key:value|``) of one contour: its kind, lambda, alpha, epsilon, risk and volume."""
    tags = {
        "calib_monai.contour": kind,
        "calib_monai.lambda": entry.get({"inner": "lambda_in", "outer": "lambda_out"}[kind]),
        "calib_monai.alpha": contours.get("alpha"),
        "calib_monai.epsilon": contours.get("epsilon"),
        "calib_monai.risk": contours.get("risk"),
        "calib_monai.volume_ml": entry.get(f"{kind}_ml"),
    }
    return "".join(f"{k}:{v if isinstance(v, str) else f'{v:.4g}'}|" for k, v in tags.items() if v is not None)


def _lighter(rgb: Sequence[float], kind: str) -> tuple[float, ...]:
    """The outer contour in a tint of the structure's colour, the inner one in a shade."""
    rgb = np.asarray(rgb, dtype=np.float64)
    return tuple(np.round(rgb + (1 - rgb) * 0.5 if kind == "outer" else rgb * 0.6, 6).tolist())


def contour_segments(
    inner: np.ndarray,
    outer: np.ndarray,
    structures: Sequence[tuple[int, str, tuple[float, float, float]]],
    contours: Mapping[str, Any] | None,
    first_layer: int,
) -> tuple[list[np.ndarray], list[tuple], dict[str, str]]:
    """``(layers, segments, header fields)`` of the contours ``inner`` and ``outer`` ``(n, *spatial)`` of
    ``structures`` (label value, name, colour), from layer ``first_layer``; ``contours``: the case quality's
    (alpha, epsilon, lambdas). Segments are ``(id, name, colour, label value, layer, tags)``."""
    if inner.shape != outer.shape or len(inner) != len(structures):
        raise ValueError(
            f"the inner {inner.shape} and outer {outer.shape} contours do not hold one volume for each of the same "
            f"{len(structures)} structures: {_FIX}"
        )
    contours = dict(contours or {})
    alpha = contours.get("alpha")
    classes = contours.get("classes") or {}
    inner_layer = np.zeros(inner.shape[1:], dtype=np.uint8)
    layers, segments = [inner_layer], []
    for index, (value, name, color) in enumerate(structures):
        inner_layer[inner[index] > 0] = value
        layers.append(outer[index])
        entry = classes.get(name) or {}
        for kind, layer, label in (("outer", first_layer + 1 + index, 1), ("inner", first_layer, value)):
            title = contour_segment_name(name, kind, alpha) if alpha is not None else f"{name} ({kind})"
            tags = _tags(kind, entry, contours)
            segments.append((f"{kind}_{value}", title, _lighter(color, kind), label, layer, tags))
    fields = {}
    if contours:
        lambdas = "; ".join(
            f"{name} in={_lambda(e.get('lambda_in'))} out={_lambda(e.get('lambda_out'))}" for name, e in classes.items()
        )
        fields = {
            "calib_monai_contours_alpha": f"{contours['alpha']:g}",
            "calib_monai_contours_epsilon": f"{contours['epsilon']:g}",
            "calib_monai_contours_risk": str(contours.get("risk")),
            "calib_monai_contours_lambdas": lambdas or "-",
            "calib_monai_contours_vouched": {True: "yes", False: "no"}.get(contours.get("vouched"), "unknown"),
            "calib_monai_contours_reason": " ".join(str(contours.get("reason") or "-").split()),
            "calib_monai_contours_guarantee": str(contours.get("guarantee") or "-"),
        }
    return layers, segments, fields


def _lambda(value: Any) -> str:
    return "null" if value is None else f"{float(value):.6g}"
