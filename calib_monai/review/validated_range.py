"""The validated range: what the served model's case quality looked like on its validation volumes, stored next to
its weights as ``<models>/validated_range.json`` (with the SHA-256 of the ``model.pt`` it was measured with: a range
is never applied to other weights), and the review flag of a new case against it.

The rule (:class:`~calib_monai.review.rule.ValidatedRange`) is one full-conformal test. Each signal ``j`` gives each
of the ``n + 1`` cases (the validation volumes, scored cross-fitted, and the new case) a nonconformity ``a_j``
measured against the other ``n``: the case score negated (``score_check``), the image statistics' distance from the
training images' (``input_check``), the Mahalanobis distance (Ledoit-Wolf) of the pooled bottleneck features
(``feature_check``). Each is a robust z-score against the other ``n`` (``(a_j - median) / (1.4826 MAD)``) and
``T = max_j z_j``. The exchangeable units are the ``m`` validation subjects, each by its most extreme volume: the case
is flagged when ``1 + #{s: max_{i in s} T_i >= T_case} <= k = floor(alpha (m + 1))``, so a case of a new
exchangeable subject is flagged with probability at most ``k / (m + 1) <= alpha`` (Vovk et al. 2005, "Algorithmic
Learning in a Random World"); ``k = 0``: the flag is ``None``. With ``volume_factor`` > 0 an expected volume outside
``[min / f, max * f]`` of the validation volumes' also flags.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from monai.data import MetaTensor
from monai.transforms import MapTransform

from calib_monai.bundle.manifest import file_sha256
from calib_monai.defaults import LOW_CONFIDENCE
from calib_monai.metrics.case_quality import case_quality
from calib_monai.metrics.image_statistics import input_statistics
from calib_monai.metrics.network_features import BottleneckFeatures
from calib_monai.metrics.report_table import voxel_spacing
from calib_monai.metrics.segmentation import label_map_dice
from calib_monai.review.anchor import CaseScoreAnchor, anchor_quality
from calib_monai.review.rule import STORED_FIELDS, ValidatedRange
from calib_monai.review.signals import CASE_SCORE_OFFSETS

__all__ = [
    "VALIDATED_RANGE_FILE",
    "CaseQualityd",
    "ValidatedRange",
    "load_validated_range",
    "read_validated_range",
    "review_case",
    "voxel_volume_ml",
]

logger = logging.getLogger("calib_monai")
VALIDATED_RANGE_FILE = "validated_range.json"
_FIX = "delete it and run the bundle's calibrate step again"


def read_validated_range(
    path: str | os.PathLike, weights: str | os.PathLike | None = None
) -> tuple[ValidatedRange | None, str]:
    """``(range, "")``, or ``(None, why not)`` when ``path`` (or ``<path>/validated_range.json``) is missing or was
    measured with other weights than ``weights`` (a warning says so); a file that is not a validated range raises a
    one-line ValueError naming it."""
    path = Path(path)
    if path.is_dir():
        path = path / VALIDATED_RANGE_FILE
    if not path.is_file():
        return None, f"no validated range at {path}: run the bundle's calibrate step to get review flags"
    try:
        record = json.loads(path.read_text())
    except ValueError as err:  # UnicodeDecodeError too
        raise ValueError(f"{path} is not valid JSON ({err}); {_FIX}") from err
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a {type(record).__name__}, not a validated range; {_FIX}")
    missing = [k for k in ("scores", "volumes", "alpha", "volume_factor", "info") if k not in record]
    if missing:
        raise ValueError(f"{path} lacks {missing}: not a validated range of calib_monai; {_FIX}")
    missing = [k for k in STORED_FIELDS if k not in record]
    if missing:  # every field is written by ValidatedRange.save: a file without one was written by an older calibrate
        raise ValueError(f"{path} lacks {missing} (written by an older calib_monai): {_FIX}")
    if weights is not None and Path(weights).is_file() and record.get("weights_sha256") != file_sha256(weights):
        why = (
            f"{path} was measured with other weights than {weights} (the model was trained again since): no review "
            "flags; run the bundle's calibrate step again"
        )
        logger.warning(why)
        return None, why
    try:
        validated = ValidatedRange(**{k: record[k] for k in STORED_FIELDS})
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(f"{path}: {err}; {_FIX}") from err
    return validated, ""


def load_validated_range(path: str | os.PathLike, weights: str | os.PathLike | None = None) -> ValidatedRange | None:
    """:func:`read_validated_range` without the reason: the range or None."""
    return read_validated_range(path, weights)[0]


def review_case(
    quality: Mapping[str, Any],
    validated: ValidatedRange | None,
    image_statistics: Sequence[float] | None = None,
    missing: str = "",
    features: Any = None,
    features_missing: str = "",
) -> dict[str, Any]:
    """``quality`` with its ``review`` verdict (``flag`` None and the reason, ``missing``, when no range applies);
    ``features``: the case's pooled network features (None: left out, ``features_missing`` says why)."""
    if validated is None:
        reason = missing or "no validated range stored next to the weights: run the bundle's calibrate step"
        review = {"flag": None, "reasons": [f"cannot judge: {reason}"]}
    else:
        review = validated.check(quality, image_statistics, features, features_missing)
    return {**quality, "review": review}


def voxel_volume_ml(image: Any) -> float:
    """The voxel volume in mL of an image's (preprocessed) grid, from its affine; 1.0 (voxels) without one."""
    spacing = voxel_spacing({"image": image})
    return math.prod(spacing) / 1000.0 if spacing else 1.0


class CaseQualityd(MapTransform):
    """The case quality of the probabilities under ``keys`` (softmax ``(C, *spatial)``, on the network's grid) and its
    review flag, as ``data[quality_key]`` (:func:`calib_monai.metrics.case_quality`, :func:`review_case`); a flagged
    case gets one warning line in the log.

    Args:
        keys: the probabilities (after the calibration and the softmax).
        validated_range: a :class:`ValidatedRange`, a ``validated_range.json`` path (or its folder) or None.
        weights: the network's weights file, to check the stored range was measured with them.
        label_names: ``{"0": "background", ...}``: the class names of the output.
        image_key: the preprocessed image (the input signal's statistics; its affine gives the voxel volume when the
            probabilities carry none).
        confidence_threshold: the confidence below which a predicted voxel counts as low confidence.
        network: the network the inferer runs (``@network``): a
            :class:`~calib_monai.metrics.network_features.BottleneckFeatures` hook pools each case's features for the
            feature signal (one case per forward batch). None, TorchScript or a network that did not run for the case:
            the feature signal is left out, with why.
        segmentation_key, confidence_key: the argmax and max that ``ConfidenceAndSegmentationd`` took of these
            probabilities just before (``<confidence_key>_of`` says so): used, not taken again.
    """

    def __init__(
        self,
        keys,
        validated_range: ValidatedRange | str | os.PathLike | None = None,
        weights: str | os.PathLike | None = None,
        label_names: Mapping | None = None,
        quality_key: str = "quality",
        image_key: str = "image",
        confidence_threshold: float = LOW_CONFIDENCE,
        allow_missing_keys: bool = False,
        network: torch.nn.Module | None = None,
        segmentation_key: str = "segmentation",
        confidence_key: str = "confidence",
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.segmentation_key, self.confidence_key = segmentation_key, confidence_key
        self.missing = ""
        self.features, self.features_missing = None, "no network was given to CaseQualityd (network=@network)"
        if network is not None:
            try:
                self.features = BottleneckFeatures(network).start()
            except ValueError as err:
                self.features_missing = str(err)
        if isinstance(validated_range, (str, os.PathLike)):
            validated_range, self.missing = read_validated_range(validated_range, weights)
        self.validated_range = validated_range
        self.anchor = CaseScoreAnchor.from_range(validated_range) if validated_range is not None else None
        self.class_names = [str(label_names[k]) for k in sorted(label_names, key=int)] if label_names else None
        self.quality_key, self.image_key = quality_key, image_key
        self.confidence_threshold = float(confidence_threshold)
        # None (not fitted): the interval of independent voxels, named as such
        self._volume_interval_scale = getattr(validated_range, "volume_interval_scale", None) or 1.0
        if validated_range is not None and validated_range.warnings:
            logger.warning("validated range: " + "; ".join(validated_range.warnings))

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            prob = d[key]
            names = self.class_names if self.class_names and len(self.class_names) == prob.shape[0] else None
            image = d.get(self.image_key)
            grid = prob if isinstance(prob, MetaTensor) else image
            segmentation, confidence = self._taken(d, key, prob)
            try:
                quality = case_quality(
                    prob,
                    segmentation,
                    voxel_volume=voxel_volume_ml(grid),
                    threshold=self.confidence_threshold,
                    class_names=names,
                    volume_interval_scale=self._volume_interval_scale,
                    confidence=confidence,
                )
            except ValueError as err:  # the probabilities of which case: the line names it
                raise ValueError(f"case {_case(d, self.image_key)}: {err}") from err
            if d.get(CASE_SCORE_OFFSETS) is not None:  # the case as each cross-fitted fold scores it (CalibrateLogitsd)
                quality[CASE_SCORE_OFFSETS] = [float(o) for o in d[CASE_SCORE_OFFSETS]]
            stats = input_statistics(image) if image is not None else None
            features, why = self._pop_features()
            quality = review_case(quality, self.validated_range, stats, self.missing, features, why)
            if self.validated_range is not None:  # the served estimate's lower bound (re-anchored by the site monitor)
                quality = anchor_quality(quality, self.anchor)
            if quality["review"]["flag"]:
                logger.warning(f"case {_case(d, self.image_key)}: review: " + "; ".join(quality["review"]["reasons"]))
            d[self.quality_key] = quality
        return d

    def _taken(self, d: Mapping, key: Hashable, prob: Any) -> tuple:
        """``(segmentation, confidence)`` that ``ConfidenceAndSegmentationd`` took of ``d[key]`` just before, in its
        dtype and on its grid, else ``(None, None)`` (they are taken again)."""
        taken = [d.get(k) for k in (self.segmentation_key, self.confidence_key)]
        ours = d.get(f"{self.confidence_key}_of") == key and all(t is not None for t in taken)
        if ours and taken[1].dtype == prob.dtype and all(t.shape[1:] == prob.shape[1:] for t in taken):
            return tuple(taken)
        return None, None

    def _pop_features(self) -> tuple[Any, str]:
        """The pooled features of the case the network just ran on (None and why when there are none)."""
        if self.features is None:
            return None, self.features_missing
        try:
            return self.features.pop().vector, ""
        except RuntimeError:
            return None, (
                "the hooked network did not run for this case (a TorchScript model.ts, or a batch of several cases "
                "whose features were taken by the first)"
            )


class DeliveredDiced(MapTransform):
    """The true DSC of the delivered segmentation per foreground class, beside the served case score: the label map
    under ``keys`` (``(1, *spatial)`` on the input grid; probabilities ``(C, *spatial)``: their argmax) against the
    label as read (``label_key``; a class absent from it: NaN, left out of the mean), into
    ``data[quality_key]["delivered"]``: ``{"mean_dice", "dice": {name: value}}``."""

    def __init__(
        self, keys, label_key: str = "input_label", quality_key: str = "quality", label_names: Mapping | None = None
    ) -> None:
        super().__init__(keys)
        self.label_key, self.quality_key = label_key, quality_key
        self.class_names = [str(label_names[k]) for k in sorted(label_names, key=int)] if label_names else None

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            prob = torch.as_tensor(d[key])
            label = torch.as_tensor(d[self.label_key]).to(prob.device)  # the batch's copy stays on the CPU
            if tuple(prob.shape[1:]) != tuple(label.shape[1:]):
                raise ValueError(
                    f"DeliveredDiced: {key} is {tuple(prob.shape[1:])}, {self.label_key} {tuple(label.shape[1:])}: "
                    "both must be on the input grid (Invertd the segmentation; keep_input_label true)"
                )
            label_map = prob.shape[0] == 1 and self.class_names is not None
            classes = len(self.class_names) if label_map else prob.shape[0]
            pred = prob.as_subclass(torch.Tensor)[0].long() if label_map else prob.as_subclass(torch.Tensor).argmax(0)
            dice = label_map_dice(pred, label.as_subclass(torch.Tensor), classes).tolist()  # no truth: NaN
            names = self.class_names[1:] if self.class_names else [f"class_{c}" for c in range(1, classes)]
            finite = [v for v in dice if v == v]
            delivered = {"mean_dice": sum(finite) / len(finite) if finite else math.nan, "dice": dict(zip(names, dice))}
            d[self.quality_key] = {**(d.get(self.quality_key) or {}), "delivered": delivered}
        return d


def _case(d: Mapping, image_key: str) -> str:
    case = d.get("case")
    if isinstance(case, (list, tuple)) and len(case) == 1:
        case = case[0]
    if case:
        return str(case)
    meta = getattr(d.get(image_key), "meta", {}) or {}
    name = meta.get("filename_or_obj")
    return os.path.basename(str(name)) if name else "(unnamed)"
