"""The MONAI Label infer tasks of a served bundle (imports MONAI Label).

- ``<bundle>``: the uint8 label map; its JSON has ``label_names``, ``confidence_summary``, ``quality`` and ``source``.
- ``<bundle>_review``: each structure's confident (``"liver"``) and uncertain (``"liver (uncertain)"``) parts.
- ``<bundle>_margins``: each structure's outer contour, prediction and inner contour as nested segments
  (:mod:`calib_monai.label.margins`); 409 without a contour set.
- ``<bundle>_confidence`` (``others``): the float32 max softmax probability.

All share one ``ServedBundle.predict`` per image and write only the file they return.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from monailabel.interfaces.tasks.infer_v2 import InferTask, InferType

from calib_monai.defaults import CONTOUR_ALPHA
from calib_monai.label.margins import margins_label_names
from calib_monai.label.serving import CONFIDENCE_THRESHOLDS, InputError, ServedBundle, review_label_names
from calib_monai.review.contours import read_contour_margins

__all__ = ["TASKS", "BundleTask"]

UNCERTAINTY_THRESHOLD = 0.8  # the Slicer files' "low confidence" threshold too
#: task name suffix -> (the output it returns, its MONAI Label type, its description after "<bundle>: ")
TASKS = {
    "": (
        "segmentation",
        InferType.SEGMENTATION,
        "segmentation (calib-monai bundle); JSON: confidence summary per label",
    ),
    "_review": (
        "review",
        InferType.SEGMENTATION,
        "review - each structure's confident and uncertain (confidence < threshold) parts as separate segments; "
        "JSON: case quality and review flag",
    ),
    "_margins": (
        "margins",
        InferType.SEGMENTATION,
        "margins - each structure's outer contour, prediction and inner contour as nested segments, with a per-case "
        "guarantee; JSON: the lambdas, alpha, epsilon and volumes",
    ),
    "_confidence": ("confidence", InferType.OTHERS, "confidence map (max softmax probability, float32, in [1/C, 1])"),
}


class BundleTask(InferTask):
    """The task ``<bundle><suffix>`` of :data:`TASKS`: valid when the weights are there; the request's ``image`` is a
    local file (upload or datastore)."""

    def __init__(self, served: ServedBundle, suffix: str = ""):
        self.keep, type, description = TASKS[suffix]
        labels = {name: value for value, name in sorted(served.label_names.items())}
        config = {}  # values stay scalars: Slicer's options table breaks on lists of numbers
        if self.keep == "review":
            labels, config = review_label_names(served.label_names), {"uncertainty_threshold": UNCERTAINTY_THRESHOLD}
        elif self.keep == "margins":
            try:
                margins, _ = read_contour_margins(served.bundle_dir / "models")
            except ValueError:  # a damaged contours.json: each answer says so (409), the names take the default alpha
                margins = None
            labels = margins_label_names(served.label_names, margins.alpha if margins else CONTOUR_ALPHA)
        description = f"{served.name}: {description}"
        super().__init__(type=type, labels=labels, dimension=3, description=description, config=config)
        self.served = served

    def is_valid(self) -> bool:
        return self.served.weights is not None

    def __call__(self, request: dict[str, Any]) -> tuple[str, dict]:
        start, threshold = time.time(), self._threshold(request)  # a bad setting is answered before inferring
        result = self.served.predict(request["image"])
        output = self.served.save(result, self.keep, threshold)
        info = {
            "model": self.served.name,
            # every label, in value order: Slicer names the segments by position
            "label_names": dict(self.labels),
            "confidence_summary": result.summary,
            "confidence_thresholds": list(CONFIDENCE_THRESHOLDS),
            "quality": result.quality,
            "source": result.source,
            "latencies": {"total": round(time.time() - start, 3)},
        }
        if self.keep == "margins":  # named with the alpha the answer's contours were chosen at
            alpha = ((result.quality or {}).get("contours") or {}).get("alpha", CONTOUR_ALPHA)
            info["label_names"] = margins_label_names(self.served.label_names, alpha)
        if self.keep == "confidence":
            info["confidence"] = dict(zip(("min", "mean", "max"), result.confidence_range))
        if self.keep == "review":
            info["uncertainty_threshold"] = threshold
            info["uncertain_fraction"] = {
                name: _below(result, entry["label"], info["uncertainty_threshold"])
                for name, entry in result.summary.items()
                if entry["label"] > 0
            }
        return output, info

    @staticmethod
    def _threshold(request: dict[str, Any]) -> float:
        given = request.get("uncertainty_threshold", UNCERTAINTY_THRESHOLD)
        try:
            value = float(given)
        except (TypeError, ValueError):
            value = float("nan")
        if not 0 < value <= 1:  # a 422 with this line, not MONAI Label's bare 500
            raise InputError(
                f"uncertainty_threshold must be a number in (0, 1], got {given!r}: set it in the task's options "
                f"(default {UNCERTAINTY_THRESHOLD})",
                status=422,
            )
        return value


def _below(result, value: int, threshold: float) -> float | None:
    """Share of the voxels predicted ``value`` whose confidence is below ``threshold`` (None when there are none)."""
    inside = result.confidence[0].numpy()[result.segmentation[0].numpy() == value]
    return float((inside < np.float32(threshold)).mean()) if inside.size else None
