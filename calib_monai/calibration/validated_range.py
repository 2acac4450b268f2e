"""The validated range: what the served model's case quality looked like on its validation volumes, stored next to
its weights, and the review flag of a new case against it.

The bundle's ``calibrate`` step scores every validation volume with the calibrated probabilities it serves
(:func:`calib_monai.metrics.case_quality`) and writes ``<models>/validated_range.json``: the case scores and the
expected volume of every class, the rule, and the SHA-256 of the ``model.pt`` they were measured with (a range is
never applied to other weights). At inference, :class:`CaseQualityd` scores each case the same way and flags it
for review when

* its case score (mean estimated DSC) is below the ``k``-th lowest validation score, ``k = max(1, floor(alpha (n +
  1)))``: for a case exchangeable with the ``n`` validation volumes this happens with probability ``k / (n + 1) <=
  alpha`` (a conformal bound; with ``n < 1 / alpha - 1`` volumes ``k`` is 1 and the bound is ``1 / (n + 1)``), or
* (``volume_factor`` > 0) the expected volume of a class is outside the validation volumes' range widened by that
  factor (``[min / f, max * f]``): a structure far larger or smaller than any validated one, or
* (``input_check``) its image's intensities are unlike the validation images': the largest standardised distance
  ``max_j |f_j - mean_j| / std_j`` of its per-channel mean and standard deviation
  (:func:`calib_monai.metrics.case_quality.image_statistics`) from the validation images' exceeds the ``k``-th
  largest leave-one-out distance of the validation images themselves (the same conformal rule).

Which rule and which ``alpha`` the bundles use is a measured choice (``docs/results``, the quality study).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from monai.transforms import MapTransform

from calib_monai.atomic import write_json_atomically
from calib_monai.calibration.stored import file_sha256
from calib_monai.metrics.case_quality import case_quality, image_statistics
from calib_monai.metrics.report_table import voxel_spacing

__all__ = [
    "VALIDATED_RANGE_FILE",
    "CaseQualityd",
    "ValidatedRange",
    "load_validated_range",
    "review_case",
    "voxel_volume_ml",
]

logger = logging.getLogger("calib_monai")
VALIDATED_RANGE_FILE = "validated_range.json"


@dataclass
class ValidatedRange:
    """The validation cases' case scores and per-class expected volumes (mL), and the flag rule's settings."""

    scores: list[float]
    volumes: dict[str, list[float]] = field(default_factory=dict)
    alpha: float = 0.05
    volume_factor: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)  # weights, calibration, volumes: what it was measured on
    inputs: list[list[float]] = field(default_factory=list)  # image_statistics of each validation image
    input_check: bool = False

    def __post_init__(self) -> None:
        if not 0 < float(self.alpha) < 1:
            raise ValueError(f"validated range alpha must be in (0, 1), got {self.alpha}")
        if float(self.volume_factor) != 0 and float(self.volume_factor) < 1:
            raise ValueError(f"validated range volume_factor must be 0 (off) or >= 1, got {self.volume_factor}")
        self.scores = [float(s) for s in self.scores if s == s]

    @classmethod
    def from_qualities(
        cls,
        qualities: Sequence[Mapping[str, Any]],
        alpha: float = 0.05,
        volume_factor: float = 0.0,
        inputs: Sequence[Sequence[float]] = (),
        input_check: bool = False,
        **info: Any,
    ) -> ValidatedRange:
        """From the :func:`~calib_monai.metrics.case_quality` dicts of the validation volumes (and the
        :func:`~calib_monai.metrics.case_quality.image_statistics` of their images)."""
        if not qualities:
            raise ValueError("a validated range needs at least one validation volume")
        names = list(qualities[0]["classes"])
        volumes = {name: [float(q["classes"][name]["volume"]) for q in qualities] for name in names}
        return cls(
            [float(q["case_score"]) for q in qualities],
            volumes,
            alpha,
            volume_factor,
            info,
            [list(map(float, f)) for f in inputs],
            bool(input_check),
        )

    @property
    def rank(self) -> int:
        """``k``: a case is flagged below the k-th lowest validation score."""
        return max(1, math.floor(self.alpha * (len(self.scores) + 1)))

    @property
    def score_threshold(self) -> float:
        return float(sorted(self.scores)[self.rank - 1]) if self.scores else float("nan")

    def _input_distance(self, features: Sequence[float], exclude: int | None = None) -> float:
        """Largest standardised distance of ``features`` from the validation images' (leaving one out)."""
        reference = np.array([f for i, f in enumerate(self.inputs) if i != exclude], dtype=np.float64)
        mean, std = reference.mean(0), reference.std(0)
        std = np.where(std > 0, std, np.finfo(np.float64).eps)
        return float(np.max(np.abs(np.asarray(features, dtype=np.float64) - mean) / std))

    @property
    def input_threshold(self) -> float:
        """The k-th largest leave-one-out distance of the validation images (NaN with fewer than 3)."""
        if len(self.inputs) < 3:
            return float("nan")
        distances = sorted((self._input_distance(f, i) for i, f in enumerate(self.inputs)), reverse=True)
        return distances[self.rank - 1]

    def check(self, quality: Mapping[str, Any], image_statistics: Sequence[float] | None = None) -> dict[str, Any]:
        """The review verdict of one case (``image_statistics`` of its image for the input rule):
        ``{"flag", "reasons", "score_threshold", "validation_volumes"}``."""
        reasons = []
        score = float(quality["case_score"])
        threshold = self.score_threshold
        if not score == score:
            reasons.append("no case score (the model predicts none of the structures and gives them no probability)")
        elif score < threshold:
            reasons.append(
                f"estimated mean DSC {score:.3f} is below the validated range ({threshold:.3f}, the "
                f"{_ordinal(self.rank)} lowest of {len(self.scores)} validation volumes)"
            )
        if self.volume_factor:
            for name, values in self.volumes.items():
                volume = float(quality["classes"].get(name, {}).get("volume", float("nan")))
                low, high = min(values) / self.volume_factor, max(values) * self.volume_factor
                if volume == volume and not low <= volume <= high:
                    reasons.append(f"{name} volume {volume:.3g} mL is outside the validated {low:.3g}-{high:.3g} mL")
        if self.input_check and image_statistics is not None and len(self.inputs) >= 3:
            distance, limit = self._input_distance(image_statistics), self.input_threshold
            if distance > limit:
                reasons.append(
                    f"the image's intensities are unlike the validation images' (distance {distance:.1f} "
                    f"standard deviations, validated up to {limit:.1f})"
                )
        return {
            "flag": bool(reasons),
            "reasons": reasons,
            "score_threshold": threshold,
            "validation_volumes": len(self.scores),
        }

    def save(self, path: str | os.PathLike, weights: str | os.PathLike) -> Path:
        """Write the range (with the SHA-256 of ``weights``) to ``path`` atomically."""
        path = Path(path)
        record = {
            **asdict(self),
            "rule": self.describe(),
            "weights": Path(weights).name,
            "weights_sha256": file_sha256(weights),
        }
        return write_json_atomically(path, record)

    def describe(self) -> str:
        rule = (
            f"flag a case whose estimated mean DSC is below the {_ordinal(self.rank)} lowest of the "
            f"{len(self.scores)} validation volumes' ({self.score_threshold:.3f})"
        )
        if self.volume_factor:
            rule += (
                f", or whose expected volume of a class is outside the validated range widened {self.volume_factor}x"
            )
        if self.input_check:
            rule += ", or whose image intensities lie further from the validation images' than all but k-1 of them"
        return rule


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def load_validated_range(path: str | os.PathLike, weights: str | os.PathLike | None = None) -> ValidatedRange | None:
    """The range stored at ``path`` (or ``<path>/validated_range.json``), None when there is none or when it was
    measured with other weights than ``weights`` (a warning says so)."""
    path = Path(path)
    if path.is_dir():
        path = path / VALIDATED_RANGE_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        fields = {k: record[k] for k in ("scores", "volumes", "alpha", "volume_factor", "info")}
        fields.update({k: record[k] for k in ("inputs", "input_check") if k in record})
    except (ValueError, KeyError) as err:
        raise ValueError(
            f"{path} is not a validated range of calib_monai ({type(err).__name__}: {err}); delete it "
            "and run the bundle's calibrate step again"
        ) from err
    if weights is not None and Path(weights).is_file() and record.get("weights_sha256") != file_sha256(weights):
        logger.warning(
            f"{path} was measured with other weights than {weights} (the model was trained again since): "
            "no review flags; run the bundle's calibrate step again"
        )
        return None
    return ValidatedRange(**fields)


def review_case(
    quality: Mapping[str, Any], validated: ValidatedRange | None, image_statistics: Sequence[float] | None = None
) -> dict[str, Any]:
    """``quality`` with its ``review`` verdict (``flag`` None and the reason when no range is stored)."""
    if validated is None:
        review = {
            "flag": None,
            "reasons": [
                "no validated range stored next to the weights: run the bundle's calibrate step to get review flags"
            ],
        }
    else:
        review = validated.check(quality, image_statistics)
    return {**quality, "review": review}


def voxel_volume_ml(image: Any) -> float:
    """The voxel volume in mL of an image's (preprocessed) grid, from its affine; 1.0 (voxels) without one."""
    spacing = voxel_spacing({"image": image})
    return math.prod(spacing) / 1000.0 if spacing else 1.0


class CaseQualityd(MapTransform):
    """The case quality of the probabilities under ``keys`` (softmax, ``(C, *spatial)``) and its review flag, as
    ``data[quality_key]`` (a plain dict of numbers, see :func:`calib_monai.metrics.case_quality` and
    :func:`review_case`); a flagged case gets one warning line in the log.

    Args:
        keys: the probabilities (after the calibration and the softmax).
        validated_range: a :class:`ValidatedRange`, a ``validated_range.json`` path (or its folder) or None.
        weights: the network's weights file, to check the stored range was measured with them.
        label_names: ``{"0": "background", ...}``: the class names of the output.
        image_key: the preprocessed image, whose affine gives the voxel volume (mL).
        confidence_threshold: the confidence below which a predicted voxel counts as low confidence.
    """

    def __init__(
        self,
        keys,
        validated_range: ValidatedRange | str | os.PathLike | None = None,
        weights: str | os.PathLike | None = None,
        label_names: Mapping | None = None,
        quality_key: str = "quality",
        image_key: str = "image",
        confidence_threshold: float = 0.8,
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        if isinstance(validated_range, (str, os.PathLike)):
            validated_range = load_validated_range(validated_range, weights)
        self.validated_range = validated_range
        self.class_names = [str(label_names[k]) for k in sorted(label_names, key=int)] if label_names else None
        self.quality_key, self.image_key = quality_key, image_key
        self.confidence_threshold = float(confidence_threshold)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            prob = d[key]
            names = self.class_names if self.class_names and len(self.class_names) == prob.shape[0] else None
            quality = case_quality(
                prob,
                voxel_volume=voxel_volume_ml(d.get(self.image_key)),
                threshold=self.confidence_threshold,
                class_names=names,
            )
            image = d.get(self.image_key)
            stats = image_statistics(image) if image is not None else None
            quality = review_case(quality, self.validated_range, stats)
            if quality["review"]["flag"]:
                logger.warning(f"case {_case(d, self.image_key)}: review: " + "; ".join(quality["review"]["reasons"]))
            d[self.quality_key] = quality
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
