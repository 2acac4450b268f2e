"""The site's labels: a served case, labelled afterwards, tells how far the served case score was from the truth here.

Each label is recorded in the deployment's ``site.json`` (:meth:`~calib_monai.review.SiteMonitor.label`) with the
raw case score the case was served with and the true mean DSC of its delivered segmentation against the label (a
structure absent from the label left out, as ``evaluating``'s ``DeliveredDiced``). From ``SITE_LABELS_MIN`` of them
on, every answer is re-anchored (:mod:`calib_monai.review.anchor`). A label only counts for the weights and range
that served its case: Train or a new ``calibrate`` starts a new record.

- ``inferring``: ``calib-monai site label OUTPUT_DIR LABELS_DIR`` pairs ``<case>_seg.nii.gz`` and
  ``<case>_quality.json`` with ``LABELS_DIR/<case>.nii.gz`` (or ``<case>_gt``, ``.nii``).
- MONAI Label: each submitted final label (``calib_monai.label.main``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calib_monai.geometry import grid_mismatch, reorient, reorientation
from calib_monai.metrics.segmentation import label_map_dice
from calib_monai.review.site_martingale import SiteMartingale
from calib_monai.review.site_monitor import SITE_FILE, SiteMonitor, read_state

__all__ = ["delivered_dice", "label_site", "record_site_label"]

LABEL_NAMES = ("{case}.nii.gz", "{case}.nii", "{case}_gt.nii.gz", "{case}_gt.nii")
QUALITY_SUFFIX = "_quality.json"


def delivered_dice(segmentation: Any, label: Any, classes: int) -> float:
    """The true mean DSC of a delivered label map against a label of the same grid (classes absent from the label
    left out; NaN when none is present)."""
    arrays = [np.asarray(a) for a in (segmentation, label)]
    for what, values in zip(("segmentation", "label"), arrays):
        if values.size and not np.array_equal(values, np.round(values)):
            raise ValueError(
                f"the {what} holds non-integer values (e.g. {values[values != np.round(values)].flat[0]:g}): is it "
                "a label map? write class values, resampled with nearest-neighbour interpolation"
            )
    seg, lab = (torch.as_tensor(a).long().squeeze() for a in arrays)
    if seg.shape != lab.shape:
        raise ValueError(f"the segmentation is {tuple(seg.shape)} and the label {tuple(lab.shape)}: not one grid")
    for what, values in (("label", lab), ("segmentation", seg)):
        wrong = values[(values < 0) | (values >= classes)]
        if wrong.numel():
            raise ValueError(
                f"the {what} holds the value {int(wrong.max())}, the model's classes are 0-{classes - 1}: write the "
                "label in the values of the delivered segmentation (<case>_seg.nii.gz)"
            )
    return float(label_map_dice(seg, lab, classes).nanmean())


def record_site_label(folder: str | os.PathLike, case: str, quality: Mapping[str, Any], truth: float) -> dict:
    """Record that ``case``, served with ``quality`` (its ``<case>_quality.json``), has the true mean DSC ``truth``;
    returns the site's state. Refused in one line when ``folder`` has no served stream or its record names other
    weights or another range than the case's answer."""
    path = Path(folder) / SITE_FILE
    state = read_state(path)
    if state is None:
        raise ValueError(f"{path} does not exist: serve the site's cases into {folder} first, then add their labels")
    source = quality.get("source") or {}
    served_by = (source.get("weights_sha256"), source.get("validated_range_sha256"))
    if served_by != (state["weights_sha256"], state["range_sha256"]):
        raise ValueError(
            f"case {case} was served by weights {str(served_by[0])[:12]} and range {str(served_by[1])[:12]}, {path} "
            f"records weights {state['weights_sha256'][:12]} and range {state['range_sha256'][:12]}: serve the case "
            "again with the current model, then add its label"
        )
    raw = (quality.get("level") or {}).get("raw_case_score", quality.get("case_score"))
    if raw is None or not math.isfinite(float(raw)) or not math.isfinite(truth):
        raise ValueError(f"case {case}: no case score or no structure in its label: it cannot re-anchor the level")
    test = SiteMartingale.from_settings(state)
    monitor = SiteMonitor(
        folder, state["weights_sha256"], state["range_sha256"], test.m, test.signals, test.delta, test.ks
    )
    return monitor.label(case, float(raw), float(truth))


def _on_one_grid(segmentation, label, seg_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The arrays of the served segmentation and its label, the label stored in the segmentation's voxel order (a
    label saved in another orientation covers the same voxels); a ValueError when the label lies on another grid."""
    if label.ndim == 3 and segmentation.ndim == 3:
        mismatch = grid_mismatch(segmentation.affine, segmentation.shape, label.affine, label.shape)
        if mismatch is not None:
            raise ValueError(
                f"the label does not lie on the grid of the served segmentation {seg_path} ({mismatch.text}): write "
                "the label on the grid of the image that was served"
            )
        onto = reorientation(label.affine, segmentation.affine)
        return np.asarray(segmentation.dataobj), reorient(np.asarray(label.dataobj), onto)
    return np.asarray(segmentation.dataobj), np.asarray(label.dataobj)  # delivered_dice names the shapes


def label_site(folder: str | os.PathLike, labels: str | os.PathLike) -> dict[str, Any]:
    """``calib-monai site label FOLDER LABELS``: add the labels in ``LABELS`` of the cases served into ``FOLDER``
    (``inferring``'s output folder); returns the site's state and the cases labelled."""
    import nibabel as nib

    folder, labels = Path(folder), Path(labels)
    for what, path in (("output folder", folder), ("labels folder", labels)):
        if not path.is_dir():
            raise FileNotFoundError(f"{what} {path} does not exist or is not a folder")
    added, state = {}, None
    for answer in sorted(folder.glob(f"*{QUALITY_SUFFIX}")):
        case = answer.name[: -len(QUALITY_SUFFIX)]
        found = [labels / n.format(case=case) for n in LABEL_NAMES if (labels / n.format(case=case)).is_file()]
        if not found:
            continue
        quality = json.loads(answer.read_text())
        seg_path = folder / f"{case}_seg.nii.gz"
        if not seg_path.is_file():
            raise FileNotFoundError(f"{seg_path} is missing: the served segmentation of {case} is needed")
        classes = len(quality.get("classes", {})) + 1
        try:
            truth = delivered_dice(*_on_one_grid(nib.load(seg_path), nib.load(found[0]), seg_path), classes)
        except ValueError as err:
            raise ValueError(f"{found[0]}: {err}") from None
        state = record_site_label(folder, case, quality, truth)
        added[case] = round(truth, 4)
    if not added:
        raise FileNotFoundError(
            f"no label in {labels} names a case served into {folder} (looked for {', '.join(LABEL_NAMES)} of each "
            f"<case>{QUALITY_SUFFIX})"
        )
    return {**state, "labelled": added}
