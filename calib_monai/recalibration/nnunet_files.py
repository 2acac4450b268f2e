"""What nnU-Net writes beside a ``<case>.npz`` says about its geometry and its case; checked against the array.

nnU-Net v2's ``export_prediction_from_logits`` (MIC-DKFZ/nnUNet, ``nnunetv2/inference/export_prediction.py``) writes,
per case, ``<case>.npz`` (``probabilities``, ``(C, z, y, x)``), ``<case>.pkl`` (the properties dict of the image
reader and the preprocessing) and ``<case>.nii.gz`` (the segmentation, the argmax of the probabilities, in the
image's own geometry); ``plans.json`` is copied to the folder. What the ``.pkl`` holds:

* the geometry: ``sitk_stuff`` (``SimpleITKIO``: spacing, origin, direction, ITK's LPS world) or ``nibabel_stuff``
  (``NibabelIO``: ``original_affine``; ``NibabelIOWithReorient``: also ``reoriented_affine``);
* ``shape_before_cropping`` and ``bbox_used_for_cropping``, in the planner's transposed axis order
  (``transpose_forward``): ``label_manager.revert_cropping_on_probabilities`` fills every voxel outside the box with
  background probability 1 before the array is transposed back (``transpose_backward``) and saved;
* no file name (v1's ``list_of_data_files`` / ``seg_file`` are gone), so a ``.pkl`` of another case of the same
  geometry is recognised by its box only: foreground probabilities outside it.
"""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
from nibabel.orientations import io_orientation

__all__ = ["check_properties", "nnunet_affine", "read_properties", "segmentation_affine"]

_SOURCE = "copy it from the nnUNetv2_predict --save_probabilities output folder"
OUTSIDE_TOLERANCE = 1e-3  # background probability outside the crop box: exactly 1 (float16 files: within 1e-3)
ARGMAX_AGREEMENT = 0.999  # the segmentation is the argmax of the probabilities (ties aside)


def read_properties(pkl: Path) -> dict[str, Any]:
    """nnU-Net's properties dict from ``<case>.pkl`` (nnU-Net's own, trusted output); ``{}`` when there is none; a
    ValueError naming the file when it does not load as a dict."""
    if not pkl.is_file():
        return {}
    try:
        properties = pickle.loads(pkl.read_bytes())
    except Exception as err:  # truncated, not a pickle, a class that is not installed
        raise ValueError(
            f"cannot read nnU-Net's properties file {pkl} ({type(err).__name__}: {' '.join(str(err).split())}): "
            f"it is cut off or not a .pkl of nnUNetv2_predict; {_SOURCE} again, or remove it (the <case>.nii.gz "
            "segmentation beside it then gives the geometry)"
        ) from None  # (pickle's own error, raised from C inside this function, would count as the innermost line)
    if not isinstance(properties, dict):
        raise ValueError(f"{pkl} holds a {type(properties).__name__}, not nnU-Net's properties dict; {_SOURCE}")
    return properties


def nnunet_affine(properties: dict) -> np.ndarray | None:
    """The RAS affine of the image nnU-Net predicted, from its ``.pkl``: NibabelIO(WithReorient)'s affine, or
    SimpleITKIO's spacing, origin and direction (ITK's LPS world: x and y flipped); None when it holds neither."""
    nibabel_stuff = properties.get("nibabel_stuff") or {}
    for key in ("reoriented_affine", "original_affine"):
        if key in nibabel_stuff:
            return np.asarray(nibabel_stuff[key], dtype=np.float64)
    sitk = properties.get("sitk_stuff") or {}
    if not all(k in sitk for k in ("spacing", "origin", "direction")):
        return None
    affine = np.eye(4)
    affine[:3, :3] = np.asarray(sitk["direction"], dtype=np.float64).reshape(3, 3) * np.asarray(sitk["spacing"])
    affine[:3, 3] = sitk["origin"]
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ affine


def _transpose_backward(folder: Path) -> tuple[int, ...] | None:
    try:
        plans = json.loads((folder / "plans.json").read_text())
        return tuple(int(i) for i in plans["transpose_backward"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_properties(npz: Path, stored: np.ndarray, properties: dict, case: str) -> None:
    """The ``.pkl`` against the ``.npz`` ``stored`` (``(C, z, y, x)``): a ValueError naming both files when its
    ``shape_before_cropping`` is not the array's shape (in any axis order, or ``plans.json``'s ``transpose_backward``
    when the folder has it), when the array holds foreground probability outside its ``bbox_used_for_cropping``
    (the ``.pkl`` of another case), or when an nnU-Net v1 ``.pkl`` names the files of another case."""
    pkl = npz.with_suffix(".pkl")
    files = [str(properties.get("seg_file") or ""), *map(str, properties.get("list_of_data_files") or [])]
    names = [Path(f).name for f in files if f]
    if names and not any(n == f"{case}.nii.gz" or n.startswith(f"{case}_") or n.startswith(f"{case}.") for n in names):
        raise ValueError(
            f"{pkl} is the properties file of another case (it names {', '.join(names[:3])}), not of {npz.name}; "
            f"{_SOURCE}"
        )
    before = properties.get("shape_before_cropping")
    if before is None or stored.ndim != 4:
        return
    before = tuple(int(v) for v in before)
    spatial = tuple(stored.shape[1:])
    backward = _transpose_backward(npz.parent)
    orders = [backward] if backward and len(backward) == 3 else list(itertools.permutations(range(len(before))))
    orders = [p for p in orders if len(p) == len(before) and tuple(before[i] for i in p) == spatial]
    if not orders:
        raise ValueError(
            f"{pkl} says the image had shape {before} (shape_before_cropping, nnU-Net's transposed order) but the "
            f"probabilities {npz} have shape {spatial}: the .pkl is not this array's (another case, or another "
            f"run); {_SOURCE}"
        )
    box = properties.get("bbox_used_for_cropping")
    if box is None or len(box) != len(before):
        return
    outside = np.ones(before, dtype=bool)
    outside[tuple(slice(int(lo), int(hi)) for lo, hi in box)] = False
    for order in orders:
        mask = outside.transpose(order)
        if not mask.any() or np.abs(stored[0][mask] - 1).max() <= OUTSIDE_TOLERANCE:
            return
    raise ValueError(
        f"{npz} holds foreground probabilities outside the crop box of {pkl} (bbox_used_for_cropping "
        f"{[list(map(int, b)) for b in box]}, where nnU-Net writes background 1): the .pkl is another case's; "
        f"{_SOURCE}"
    )


def _geometry_lacking(pkl: Path, properties: dict) -> str:
    """What the ``.pkl`` lacks of the geometry :func:`nnunet_affine` reads, in words (the file may be missing)."""
    if not pkl.is_file():
        return f"has no {pkl.name} (nnU-Net's properties: the image's geometry)"
    sitk = properties.get("sitk_stuff")
    lacking = (
        f"sitk_stuff lacks {[k for k in ('spacing', 'origin', 'direction') if k not in sitk]}"
        if isinstance(sitk, dict)
        else "neither nibabel_stuff (original_affine) nor sitk_stuff (spacing, origin, direction)"
    )
    return f"has a {pkl.name} without the image's geometry (it holds {lacking}; keys {sorted(map(str, properties))})"


def segmentation_affine(npz: Path, stored: np.ndarray, properties: dict | None = None) -> np.ndarray:
    """Without the geometry in a ``.pkl`` (``properties``: what it holds, if anything): the affine of the
    probabilities from the segmentation nnU-Net wrote beside them (``<case>.nii.gz``, the argmax in the image's
    geometry, as stored or reoriented to RAS by ``NibabelIOWithReorient``); a ValueError when there is none or it is
    not their argmax."""
    segmentation = npz.with_name(npz.name[: -len(".npz")] + ".nii.gz")
    lacking = _geometry_lacking(npz.with_suffix(".pkl"), properties or {})
    missing = (
        f"{npz} {lacking} and no segmentation {segmentation.name} beside it: without the geometry a mirrored (e.g. "
        f"LAS) image would be scored against the wrong voxels; {_SOURCE}"
    )
    if not segmentation.is_file() or stored.ndim != 4:
        raise ValueError(missing)
    image = nib.load(str(segmentation))
    argmax = stored.argmax(0).transpose(2, 1, 0)  # (x, y, z)
    for candidate in (image, image.as_reoriented(io_orientation(image.affine))):
        data = np.asanyarray(candidate.dataobj)
        data = data[..., 0] if data.ndim == 4 and data.shape[3] == 1 else data
        if data.shape == argmax.shape and np.mean(np.rint(data) == argmax) >= ARGMAX_AGREEMENT:
            return np.asarray(candidate.affine, dtype=np.float64)
    raise ValueError(
        f"{npz} {lacking}, and the segmentation {segmentation} beside it is not the "
        f"argmax of its probabilities (shape (x, y, z) {argmax.shape} against {image.shape}): the geometry of the "
        f"probabilities is unknown; {_SOURCE}"
    )
