"""The two MONAI Label infer tasks of a served bundle (imports MONAI Label: the label environment only).

- ``<bundle>`` (type ``segmentation``): the label map, uint8 NIfTI on the input's grid. Its JSON carries
  ``label_names`` (``{name: value}`` of the labels present, which 3D Slicer's MONAI Label module uses to name the
  segments), ``confidence_summary`` (per label: voxels, mean confidence, fractions below 0.5 and 0.8) and
  ``quality`` (the case quality: estimated DSC per structure and of the case, volumes with their 95% interval, and
  ``review``: whether the case falls outside the model's validated range, with the reasons).
- ``<bundle>_confidence`` (type ``others``, so Slicer's segmentation model list leaves it out): the confidence (max
  softmax probability, in ``[1/C, 1]``), float32 NIfTI on the input's grid, with the same JSON plus its min/mean/max.

Both take the prediction from ``ServedBundle.predict`` (one inference per image: the second task of a request pair
reuses the first one's prediction) and write only the file they return.
"""

from __future__ import annotations

import time
from typing import Any

from monailabel.interfaces.tasks.infer_v2 import InferTask, InferType

from calib_monai.label.serving import CONFIDENCE_THRESHOLDS, ServedBundle

__all__ = ["CONFIDENCE_SUFFIX", "BundleConfidence", "BundleSegmentation"]

CONFIDENCE_SUFFIX = "_confidence"


class _BundleTask(InferTask):
    """Shared part: validity = weights present; the request's ``image`` is a local file (upload or datastore)."""

    keep = "segmentation"  # which output file the task returns

    def __init__(self, served: ServedBundle, type: InferType, description: str):
        labels = {name: value for value, name in sorted(served.label_names.items())}
        super().__init__(type=type, labels=labels, dimension=3, description=description,
                         config={"confidence_thresholds": list(CONFIDENCE_THRESHOLDS)})  # fmt: skip
        self.served = served

    def is_valid(self) -> bool:
        return self.served.weights is not None

    def __call__(self, request: dict[str, Any]) -> tuple[str, dict]:
        start = time.time()
        result = self.served.predict(request["image"])
        output = self.served.save(result, self.keep)
        info = {
            "model": self.served.name,
            # only the labels present: Slicer's MONAI Label module names the segments it imports, in label value
            # order, after this list (less "background"), so an absent organ would shift the names of the others
            "label_names": {name: entry["label"] for name, entry in result.summary.items() if entry["voxels"]},
            "confidence_summary": result.summary,
            "confidence_thresholds": list(CONFIDENCE_THRESHOLDS),
            "quality": result.quality,
            "latencies": {"total": round(time.time() - start, 3)},
        }
        if self.keep == "confidence":
            info["confidence"] = dict(zip(("min", "mean", "max"), result.confidence_range))
        return output, info


class BundleSegmentation(_BundleTask):
    """``<bundle>``: the segmentation (uint8 label values) with a confidence summary per label in its JSON."""

    def __init__(self, served: ServedBundle):
        super().__init__(served, InferType.SEGMENTATION,
                         f"{served.name}: segmentation (calib-monai bundle); JSON: confidence summary per label")


class BundleConfidence(_BundleTask):
    """``<bundle>_confidence``: the float32 confidence map (max softmax probability)."""

    keep = "confidence"

    def __init__(self, served: ServedBundle):
        super().__init__(served, InferType.OTHERS,
                         f"{served.name}: confidence map (max softmax probability, float32, in [1/C, 1])")
