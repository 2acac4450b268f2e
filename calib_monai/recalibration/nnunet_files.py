"""What nnU-Net v2 writes beside a ``<case>.npz`` (``nnunetv2/inference/export_prediction.py``), checked against the
array: ``<case>.pkl`` holds the image's geometry (``sitk_stuff``, or ``nibabel_stuff``'s ``original_affine`` /
``reoriented_affine``) and ``shape_before_cropping`` / ``bbox_used_for_cropping`` in the planner's transposed axis
order (outside the box the probabilities are background 1); ``<case>.nii.gz`` is their argmax in the image's geometry.
The ``.pkl`` names no file, so another case's ``.pkl`` is recognised by its shape or box only.
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
    """nnU-Net's properties dict from ``<case>.pkl`` (nnU-Net's own, trusted output); ``{}`` when there is none."""
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
    """A ValueError naming both files when the ``.pkl`` is not the one of the ``.npz`` ``stored`` ``(C, z, y, x)``:
    another shape (in ``plans.json``'s ``transpose_backward``, else any axis order), foreground outside its crop box,
    or (nnU-Net v1) other files named."""
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
    """The affine of the probabilities from the segmentation beside them (``<case>.nii.gz``, as stored or reoriented
    to RAS by ``NibabelIOWithReorient``) when the ``.pkl`` has no geometry; a ValueError when it is not their argmax."""
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
