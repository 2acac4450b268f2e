"""Readers and writers of saved probabilities for :mod:`calib_monai.recalibration.external` (formats described there),
in the label's voxel order: probabilities ``(C, x, y, z)``, label ``(x, y, z)`` and the label image's affine."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
from nibabel.orientations import io_orientation

from calib_monai.atomic import copy_atomically, save_atomically
from calib_monai.checks import PROBABILITY_ROUNDING
from calib_monai.data.layouts import files_by_case
from calib_monai.geometry import (
    AFFINE_FIX,
    GEOMETRY_TOLERANCE,
    grid_mismatch,
    nifti_affine_problem,
    reorient,
    reorientation,
)
from calib_monai.recalibration.nnunet_files import check_properties, nnunet_affine, read_properties, segmentation_affine

__all__ = [
    "FORMATS",
    "CaseFiles",
    "Volume",
    "detect_format",
    "label_names_from",
    "match_cases",
    "read_case",
    "write_calibrated",
]

logger = logging.getLogger("calib_monai")
FORMATS = ("nnunet", "nifti")
_NIFTI = (".nii.gz", ".nii")
_CHANNEL_SUFFIX = re.compile(r"_\d{4}$")  # nnU-Net's image channel suffix, absent from label names
SUM_TOLERANCE = 1e-2  # float16 files (older nnU-Net) sum to 1 within ~1e-3


@dataclass(frozen=True)
class CaseFiles:
    name: str  # the label's case name
    probabilities: Path
    label: Path
    format: str


@dataclass
class Volume:
    probabilities: np.ndarray  # (C, x, y, z) float32, channels summing to 1
    label: np.ndarray  # (x, y, z) int64
    affine: np.ndarray  # of the label image, in the frame of the arrays
    nifti_ndim: int = 0  # 4 or 5 for a NIfTI probability map (its layout is written back)
    header: Any = None
    stored_order: Any = None  # the orientation transform back to the prediction's own voxel order (None: the same)


def _stem(path: Path) -> str:
    return next(path.name[: -len(e)] for e in (*_NIFTI, ".npz") if path.name.endswith(e))


def _files(folder: Path, endings: tuple[str, ...]) -> dict[str, Path]:
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder (it does not exist, or it is a file)")
    found = (p for p in sorted(folder.iterdir()) if p.is_file() and p.name.endswith(endings))
    return files_by_case(found, _stem)


_SAVE_PROBABILITIES = (
    "nnU-Net writes probabilities only when asked: run nnUNetv2_predict again with "
    "--save_probabilities (it adds <case>.npz and <case>.pkl beside each <case>.nii.gz) and pass "
    "that output folder"
)


def detect_format(predictions: Path) -> str:
    """``"nnunet"`` when the folder holds ``.npz`` files, ``"nifti"`` when it holds NIfTI probability maps only; a
    folder of nnU-Net segmentations without probabilities says how to get them."""
    if _files(predictions, (".npz",)):
        return "nnunet"
    niftis = _files(predictions, _NIFTI)
    if niftis and len(nib.load(str(next(iter(niftis.values())))).shape) == 3:  # label maps, not probabilities
        raise FileNotFoundError(
            f"{predictions} holds segmentations ({len(niftis)} <case>.nii.gz label maps) but no "
            f"probabilities (<case>.npz): {_SAVE_PROBABILITIES}"
        )
    if niftis:
        return "nifti"
    raise FileNotFoundError(f"no probabilities in {predictions}: expected nnU-Net's <case>.npz or <case>.nii.gz maps")


def _listing(names: list[str], limit: int = 20) -> str:
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def match_cases(predictions: Path, labels: Path, fmt: str, ignore_extra_labels: bool = True) -> list[CaseFiles]:
    """Pair ``<case>.npz`` or ``<case>.nii.gz`` predictions (also ``<case>_0000``) with ``labels/<case>.nii.gz``;
    unpaired predictions raise, labels without a prediction are left out (raise with ``ignore_extra_labels=False``)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or 'auto', got {fmt!r}")
    preds = _files(predictions, (".npz",) if fmt == "nnunet" else _NIFTI)
    label_files = _files(labels, _NIFTI)
    if not preds:
        raise FileNotFoundError(f"no {fmt} probabilities in {predictions}")
    pairs, missing = {}, []
    for name, path in preds.items():  # the exact case name first; <case>_0000 only for a label <case>
        key = name if name in label_files else _CHANNEL_SUFFIX.sub("", name)
        if key not in label_files:
            missing.append(name)
        elif key in pairs:
            first = pairs[key].probabilities
            raise ValueError(
                f"{predictions} is ambiguous: both {first.name} and {path.name} are predictions of the label "
                f"{label_files[key]}; keep one of them in the folder (move the other out)"
            )
        else:
            pairs[key] = CaseFiles(key, path, label_files[key], fmt)
    if missing:
        raise ValueError(
            f"{len(missing)} prediction(s) in {predictions} have no label <case>.nii.gz in {labels}: "
            f"{_listing(missing)}"
        )
    extra = sorted(set(label_files) - set(pairs))
    if extra and not ignore_extra_labels:
        raise ValueError(
            f"{len(extra)} label(s) in {labels} have no prediction in {predictions}: {_listing(extra)} "
            "(leave out --ignore_extra_labels=False to evaluate only the predicted cases)"
        )
    if extra:
        logger.info(
            f"{len(pairs)} predicted case(s) evaluated; {len(extra)} label(s) in {labels} without a "
            f"prediction in {predictions} are left out"
        )
    return [pairs[k] for k in sorted(pairs)]


def label_names_from(predictions: Path, num_classes: int) -> dict[str, str]:
    """Class names from the ``dataset.json`` nnU-Net writes beside its predictions (``{"background": 0, ...}``),
    else ``class_<i>``."""
    path = predictions / "dataset.json"
    labels = json.loads(path.read_text()).get("labels", {}) if path.is_file() else {}
    if any(isinstance(v, (list, tuple)) for v in labels.values()):
        raise ValueError(
            f"{path} defines regions: region-based nnU-Net models save sigmoid probabilities per region, "
            f"not one probability per class, and cannot be evaluated here"
        )
    names = {str(v): k for k, v in labels.items() if k != "ignore"}
    return {str(c): names.get(str(c), "background" if c == 0 else f"class_{c}") for c in range(num_classes)}


def _check_nifti_affine(path: Path, what: str) -> None:
    """Without a usable affine the voxels would be compared in a guessed orientation or size."""
    problem = nifti_affine_problem(path)
    if problem:
        raise ValueError(f"{what} {path} has no usable affine: {problem}; {AFFINE_FIX}")


def _read_label(path: Path, reorient: bool = False) -> tuple[np.ndarray, np.ndarray]:
    _check_nifti_affine(path, "label")
    image = nib.load(str(path))
    if reorient:  # nnU-Net's NibabelIOWithReorient works on the RAS-reoriented image
        image = image.as_reoriented(io_orientation(image.affine))
    data = np.asanyarray(image.dataobj)
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise ValueError(f"label {path} must be a 3D label map, got shape {data.shape}")
    label = np.rint(data).astype(np.int64)
    if not np.array_equal(label, data):
        raise ValueError(f"label {path} holds non-integer values: is it a label map?")
    return label, image.affine


def _check(probabilities: np.ndarray, label: np.ndarray, case: CaseFiles) -> np.ndarray:
    """Finite, non-negative, channels summing to 1 (renormalised within ``SUM_TOLERANCE``), labels in [0, C)."""
    if not np.isfinite(probabilities).all():
        raise ValueError(f"{case.probabilities} holds NaN or infinite values: softmax probabilities expected")
    lowest = float(probabilities.min())
    if lowest < -PROBABILITY_ROUNDING:
        raise ValueError(
            f"{case.probabilities} holds negative values (down to {lowest:.9g}): softmax probabilities expected "
            "(not logits; a map resampled with a spline overshoots: resample probabilities linearly)"
        )
    if lowest < 0:  # float rounding of the tool that made them
        probabilities = np.maximum(probabilities, 0)
    total = probabilities.sum(0)
    if np.abs(total - 1).max() > SUM_TOLERANCE:
        raise ValueError(
            f"the channels of {case.probabilities} do not sum to 1 (range {total.min():.3g} to "
            f"{total.max():.3g}): softmax probabilities expected (not logits, not sigmoid regions)"
        )
    values = np.unique(label)
    if values.min() < 0 or values.max() >= probabilities.shape[0]:
        raise ValueError(
            f"label {case.label} has values {values.tolist()} but {case.probabilities} has "
            f"{probabilities.shape[0]} classes (an nnU-Net 'ignore' label is not supported)"
        )
    return (probabilities / total).astype(np.float32, copy=False)


def _mismatch(case: CaseFiles, stored: tuple, expected: tuple, layout: str, cause: str) -> ValueError:
    return ValueError(
        f"case {case.name}: the probabilities {case.probabilities} have shape {stored} ({layout}) but "
        f"the label {case.label} read by nibabel has shape (x, y, z) = {expected}: {cause}"
    )


def _onto_label_grid(
    case: CaseFiles, probabilities: np.ndarray, affine: np.ndarray, label: np.ndarray, label_affine: np.ndarray
) -> tuple[np.ndarray | None, Any]:
    """``probabilities (C, x, y, z)`` in the label's voxel order and the transform back; None when the shapes
    differ (the caller explains them); a ValueError when they lie apart (:func:`calib_monai.geometry.grid_mismatch`)."""
    problem = grid_mismatch(label_affine, label.shape, affine, probabilities.shape[1:])
    if problem is not None and problem.kind == "shape":
        return None, None
    if problem is not None:
        raise ValueError(
            f"case {case.name}: the probabilities {case.probabilities} do not lie on the grid of the "
            f"label {case.label}: {problem.text} (label first; tolerance {GEOMETRY_TOLERANCE:g} voxel), "
            "so they would be scored against other voxels; use the labels of the images that were "
            "segmented, in their original geometry"
        )
    onto_label = reorientation(affine, label_affine)  # stored LAS against a RAS label: the same voxels, reordered
    return reorient(probabilities, onto_label, channel_axis=0), reorientation(label_affine, affine)


def _read_nnunet(case: CaseFiles) -> Volume:
    with np.load(case.probabilities) as f:
        if "probabilities" not in f:
            raise ValueError(
                f"{case.probabilities} has no 'probabilities' array (keys {list(f)}): not written by "
                f"nnU-Net's --save_probabilities"
            )
        stored = f["probabilities"]
    properties = read_properties(case.probabilities.with_suffix(".pkl"))
    check_properties(case.probabilities, stored, properties, case.name)
    reoriented = "reoriented_affine" in properties.get("nibabel_stuff", {})
    label, affine = _read_label(case.label, reoriented)
    if stored.ndim == 4:
        stored_affine = nnunet_affine(properties)
        if stored_affine is None:  # no .pkl (or one without geometry): the segmentation beside it, else refused
            stored_affine = segmentation_affine(case.probabilities, stored, properties)
        on_grid, back = _onto_label_grid(case, stored.transpose(0, 3, 2, 1), stored_affine, label, affine)
        if on_grid is not None and on_grid.shape[1:] == label.shape:
            probabilities = np.ascontiguousarray(on_grid.astype(np.float32))
            return Volume(_check(probabilities, label, case), label, affine, stored_order=back)
    spatial = tuple(stored.shape[1:])
    if stored.ndim == 4 and spatial[::-1] == label.shape:  # its geometry said the shapes differ in RAS order
        cause = (
            "its geometry (the .pkl, else the segmentation beside it) orders the axes otherwise than the label's, "
            "so the shapes match only as stored and each voxel would be scored against another: check that the "
            ".pkl belongs to this .npz and the label to the image nnU-Net segmented"
        )
    elif spatial == label.shape:
        cause = (
            "the array is in (x, y, z) order already, not nnU-Net's (z, y, x): was the .npz written by "
            "something other than nnU-Net's export? Use the NIfTI format for (x, y, z) maps"
        )
    elif sorted(spatial) == sorted(label.shape):
        cause = "the same sizes in another axis order: the probabilities' axes are permuted"
    else:
        before = properties.get("shape_before_cropping")
        cause = (
            "different grids: nnU-Net writes probabilities in the original image geometry"
            + (
                f" (its .pkl: shape_before_cropping {tuple(before)}, in nnU-Net's transposed order)"
                if before is not None
                else ""
            )
            + "; are the labels resampled or cropped (e.g. from nnUNet_preprocessed), or for another image?"
        )
    raise _mismatch(case, tuple(stored.shape), label.shape, "(C, z, y, x) as nnU-Net saves it", cause)


def _read_nifti(case: CaseFiles) -> Volume:
    _check_nifti_affine(case.probabilities, "probability map")
    image = nib.load(str(case.probabilities))
    data = np.asarray(image.dataobj, dtype=np.float32)
    if data.ndim == 3:
        raise ValueError(
            f"{case.probabilities} is a 3D label map, not a probability map (x, y, z, C): "
            f"{_SAVE_PROBABILITIES}; other tools: save one channel per class"
        )
    if data.ndim == 5 and data.shape[3] == 1:  # (x, y, z, 1, C): nibabel's view of an intent-vector image
        data = data[:, :, :, 0]
    elif data.ndim != 4:
        raise ValueError(
            f"{case.probabilities} has shape {data.shape}: a 4D (x, y, z, C) or 5D (x, y, z, 1, C) "
            f"probability map expected, one channel per class"
        )
    label, affine = _read_label(case.label)
    on_grid, back = _onto_label_grid(case, np.moveaxis(data, -1, 0), image.affine, label, affine)
    if on_grid is not None:
        data = np.moveaxis(on_grid, 0, -1)
    if data.shape[:3] != label.shape:
        if data.shape[1:] == label.shape:
            cause = "the channel axis comes first: NIfTI probability maps keep the classes on the last axis"
        elif sorted(data.shape[:3]) == sorted(label.shape):
            cause = "the same sizes in another axis order: the map was saved from a permuted, e.g. (z, y, x), array"
        else:
            cause = "different grids: resample the probabilities to the label image's geometry first"
        raise _mismatch(case, data.shape, label.shape, "(x, y, z, C)", cause)
    probabilities = np.ascontiguousarray(np.moveaxis(data, -1, 0))
    return Volume(_check(probabilities, label, case), label, affine, image.ndim, image.header, back)


def read_case(case: CaseFiles) -> Volume:
    """The case's probabilities ``(C, x, y, z)``, label ``(x, y, z)`` and affine; shapes and values checked."""
    return _read_nnunet(case) if case.format == "nnunet" else _read_nifti(case)


def write_calibrated(case: CaseFiles, volume: Volume, probabilities: np.ndarray, folder: Path) -> Path:
    """Write ``probabilities (C, x, y, z)`` in the input's format: nnU-Net's ``.npz`` (with its ``.pkl`` and
    segmentation copied: the argmax is unchanged) or a NIfTI map with the input's header."""
    stem = _stem(case.probabilities)
    probabilities = reorient(probabilities, volume.stored_order, channel_axis=0)  # in the input's own voxel order
    if case.format == "nnunet":
        out = folder / f"{stem}.npz"
        stored = probabilities.transpose(0, 3, 2, 1).astype(np.float32)
        save_atomically(stored, out, write=lambda a, tmp: np.savez_compressed(tmp, probabilities=a))  # tmp ends .npz
        for name in (f"{stem}.pkl", f"{stem}.nii.gz", "dataset.json", "plans.json"):  # an nnU-Net output folder
            src = case.probabilities.with_name(name)
            if src.is_file():
                copy_atomically(src, folder / name)
        return out
    data = np.moveaxis(probabilities, 0, -1).astype(np.float32)
    if volume.nifti_ndim == 5:
        data = data[:, :, :, None]
    header = volume.header.copy()
    header.set_data_dtype(np.float32)
    out = folder / case.probabilities.name
    image = nib.Nifti1Image(data, None, header)  # the input map's own affine, from its header
    save_atomically(image, out, write=lambda i, tmp: nib.save(i, tmp))
    return out
