"""The served contours (:mod:`calib_monai.review.contours`): :class:`ContourMarginsd` makes each structure's inner and
outer contour of a case from its calibrated probabilities and the lambdas ``calibrate`` stored, and adds their
volumes, the lambdas and the guarantee to the case quality, with the review's verdict: a case the review flag or the
site alarm puts outside what validation measured gets contours that are not vouched for, and says why."""

from __future__ import annotations

import math
import os
from collections.abc import Hashable, Mapping
from typing import Any

import torch
from monai.data import MetaTensor
from monai.transforms import MapTransform

from calib_monai.bundle.manifest import NOT_APPLICABLE
from calib_monai.review.contours import ContourMargins, contour_masks, read_contour_margins
from calib_monai.review.validated_range import voxel_volume_ml

__all__ = ["CONTOUR_KEYS", "ContourMarginsd"]

#: the item keys of the two contour outputs (``<case>_inner.nii.gz``, ``<case>_outer.nii.gz``)
CONTOUR_KEYS = ("contour_inner", "contour_outer")


class ContourMarginsd(MapTransform):
    """Each foreground structure's inner and outer contour of the probabilities under ``keys`` (softmax, ``(C,
    *spatial)``, on the grid of the delivered segmentation), as ``data["contour_inner"]`` and
    ``data["contour_outer"]``: ``(C - 1, *spatial)`` uint8 MetaTensors with the segmentation's meta data (written
    by ``inferring`` as ``<case>_inner.nii.gz`` and ``<case>_outer.nii.gz``, 4D NIfTI whose 4th axis is the
    foreground class in label order: volume 0 is class 1; one structure: 3D). ``data[quality_key]["contours"]``
    gets the guarantee, ``vouched`` (True; False when the review flag or the site alarm flags the case, None when
    the review could not judge it), ``reason``, and per structure the inner, predicted and outer volume in mL and
    the lambdas (a structure whose lambdas are null, too few validation subjects, gets empty contours and why).

    Args:
        keys: the calibrated probabilities (``inferring``: ``pred`` after ``Invertd``).
        contours: a :class:`ContourMargins`, a ``contours.json`` path (or its folder) or None.
        weights: the network's weights file: a contour set from other weights is refused (one line).
        label_names: ``{"0": "background", ...}``.
        quality_key: the case quality (``CaseQualityd``'s, after the site monitor), whose review verdict it reads.
    """

    def __init__(
        self,
        keys,
        contours: ContourMargins | str | os.PathLike | None = None,
        weights: str | os.PathLike | None = None,
        label_names: Mapping | None = None,
        quality_key: str = "quality",
        segmentation_key: str = "segmentation",
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.missing = "no contour set was given"
        if isinstance(contours, (str, os.PathLike)):
            contours, self.missing = read_contour_margins(contours, weights)
        self.contours = contours
        self.class_names = [str(label_names[k]) for k in sorted(label_names, key=int)] if label_names else None
        self.quality_key, self.segmentation_key = quality_key, segmentation_key

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            quality = d.get(self.quality_key)
            source = (quality.get("source") or {}) if isinstance(quality, Mapping) else {}
            raw = source.get("validated_range") == NOT_APPLICABLE
            if self.contours is None or raw:  # lambdas chosen on recalibrated probabilities do not apply to raw ones
                why = f"contours not applicable: {NOT_APPLICABLE}" if raw else self.missing
                if isinstance(quality, Mapping):
                    d[self.quality_key] = {**quality, "contours": {"vouched": None, "reason": why}}
                continue
            given = d[key]
            names = self.class_names if self.class_names and len(self.class_names) == given.shape[0] else None
            prob = given.as_tensor() if isinstance(given, MetaTensor) else torch.as_tensor(given)  # no meta per op
            pred = self._taken(d, key, prob)
            inner, outer = contour_masks(prob, self.contours.classes, names, pred)
            meta = getattr(d.get(self.segmentation_key), "meta", None) or getattr(given, "meta", {})
            d[CONTOUR_KEYS[0]] = MetaTensor(inner, meta=dict(meta))
            d[CONTOUR_KEYS[1]] = MetaTensor(outer, meta=dict(meta))
            if isinstance(quality, Mapping):
                voxel_ml = voxel_volume_ml(given if isinstance(given, MetaTensor) else d.get("image"))
                record = self._record(pred, inner, outer, voxel_ml, quality)
                d[self.quality_key] = {**quality, "contours": record}
        return d

    def _taken(self, d: Mapping[Hashable, Any], key: Hashable, prob: torch.Tensor) -> torch.Tensor:
        """``prob``'s argmax: the segmentation ``ConfidenceAndSegmentationd`` took of ``d[key]`` just before (on its
        grid), else taken here (the first maximum, as there)."""
        seg = d.get(self.segmentation_key)
        if d.get("confidence_of") == key and seg is not None and tuple(seg.shape[1:]) == tuple(prob.shape[1:]):
            return (seg.as_tensor() if isinstance(seg, MetaTensor) else torch.as_tensor(seg))[0]
        return prob.max(0).indices  # argmax's first maximum, in a tenth of its time on the CPU

    def _record(self, pred: torch.Tensor, inner: torch.Tensor, outer: torch.Tensor, voxel_ml: float, quality) -> dict:
        margins = self.contours
        names = self.class_names[1:] if self.class_names else [f"class_{c}" for c in range(1, inner.shape[0] + 1)]
        classes = {}
        for c, name in enumerate(names, start=1):
            entry = margins.classes.get(name, {})
            chosen = entry.get("lambda_in") is not None and entry.get("lambda_out") is not None  # else no contour
            classes[name] = {
                "inner_ml": float(inner[c - 1].sum()) * voxel_ml if chosen else None,
                "predicted_ml": float((pred == c).sum()) * voxel_ml,
                "outer_ml": float(outer[c - 1].sum()) * voxel_ml if chosen else None,
                "lambda_in": entry.get("lambda_in"),
                "lambda_out": entry.get("lambda_out"),
                "validation_subjects": entry.get("subjects", 0),
                **({"reason": entry["reason"]} if entry.get("reason") else {}),
            }
        review = quality.get("review") or {}
        flag, reasons = review.get("flag"), "; ".join(review.get("reasons", []))
        if flag:
            vouched, reason = False, f"not vouched for: the case lies outside what validation measured ({reasons})"
        elif flag is None:
            vouched, reason = None, f"not vouched for: the review could not judge the case ({reasons})"
        else:
            vouched, reason = True, None
        if any(v["lambda_out"] is None for v in classes.values()) and vouched:
            reasons = "; ".join(v["reason"] for v in classes.values() if "reason" in v)
            vouched, reason = False, f"not vouched for: {reasons}"
        return {
            "alpha": margins.alpha,
            "epsilon": margins.epsilon,
            "risk": margins.risk,
            "guarantee": margins.guarantee,
            "vouched": vouched,
            "reason": reason,
            "classes": {
                n: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in e.items()}
                for n, e in classes.items()
            },  # fmt: skip
        }
