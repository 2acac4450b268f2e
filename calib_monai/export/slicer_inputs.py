"""The inputs of the 3D Slicer files: volumes from a path, a nibabel image or an array (an unreadable file is an error
naming it), and the check that a case's files come from one source."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

__all__ = ["check_same_source", "load_volume", "reference_geometry", "spatial_volume"]

ArrayOrPath = Union[str, os.PathLike, np.ndarray, Any]  # a path, an array, or a nibabel image
FIX = "run the bundle's inferring step on the image again"


def _read_nifti(path: str | os.PathLike, data: bool = True):
    """A nibabel image of ``path`` (its voxels read now with ``data``); a cut-off or damaged file is a ValueError
    naming it."""
    import nibabel as nib

    try:
        image = nib.load(os.fspath(path))
        if data:
            image = nib.Nifti1Image(np.asanyarray(image.dataobj), image.affine, image.header)
        return image
    except FileNotFoundError:
        raise
    except Exception as err:
        raise ValueError(
            f"{path} cannot be read ({type(err).__name__}: {err or 'no detail'}): the file is cut off or damaged "
            f"(written by a run that was killed?); {FIX}, or delete it"
        ) from err


def nifti_descrip(path: str | os.PathLike) -> str:
    """The NIfTI header's ``descrip`` (where inferring records the source: ``calib_monai w=... c=... r=...``)."""
    descrip = _read_nifti(path, data=False).header.get("descrip")
    return (
        bytes(np.asarray(descrip).item() or b"").decode(errors="replace").strip("\x00 ") if descrip is not None else ""
    )


def check_same_source(paths: Mapping[str, Path], quality: Mapping[str, Any] | None) -> None:
    """Refuse a case whose files (``{"segmentation": path, "confidence": path}`` and the quality JSON) record
    different sources (another model's, or another calibration's, outputs mixed in one folder)."""
    from calib_monai.bundle.outputs import source_descrip

    found = {str(path): nifti_descrip(path) for path in paths.values()}
    if quality and quality.get("source"):
        found["quality JSON"] = source_descrip(quality["source"])
    recorded = {value for value in found.values() if value}
    if len(recorded) > 1:
        detail = "; ".join(f"{name}: {value or 'no source'}" for name, value in found.items())
        raise ValueError(f"the outputs of one case come from different models ({detail}): {FIX} into a new folder")


def load_volume(volume: ArrayOrPath, what: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(array, affine or None) of a path (read with nibabel), a nibabel image or an array."""
    if isinstance(volume, (str, os.PathLike)):
        volume = _read_nifti(volume)
    if hasattr(volume, "affine") and hasattr(volume, "dataobj"):  # nibabel image
        return np.asanyarray(volume.dataobj), np.asarray(volume.affine, dtype=np.float64)
    if hasattr(volume, "detach"):  # a torch tensor (MetaTensor included): no torch import here
        volume = volume.detach().cpu().numpy()
    array = np.asarray(volume)
    if array.dtype == object:
        raise TypeError(f"{what}: expected a file path, a nibabel image or an array, got {type(volume).__name__}")
    return array, None


def spatial_volume(array: np.ndarray, what: str) -> np.ndarray:
    """The 3D (i, j, k) array: singleton channel axes dropped (trailing first, then a leading one), 2D -> depth 1."""
    while array.ndim > 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim == 4 and array.shape[0] == 1:
        array = array[0]
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3:
        raise ValueError(f"{what}: expected a 2D or 3D volume (optionally with a singleton channel), got {array.shape}")
    return array


def reference_geometry(reference_image: ArrayOrPath | None) -> tuple[np.ndarray | None, tuple[int, ...] | None]:
    """(affine, spatial shape or None) of the reference: a path, a nibabel image, or a 4x4 affine."""
    if reference_image is None:
        return None, None
    if isinstance(reference_image, (str, os.PathLike)) or hasattr(reference_image, "affine"):
        if isinstance(reference_image, (str, os.PathLike)):
            reference_image = _read_nifti(reference_image, data=False)
        shape = tuple(int(s) for s in reference_image.shape)[:3]  # NIfTI: spatial axes first (then time/channels)
        shape = shape + (1,) * (3 - len(shape))  # a 2D image is one slice deep
        return np.asarray(reference_image.affine, dtype=np.float64), shape
    affine = np.asarray(reference_image, dtype=np.float64)
    if affine.shape != (4, 4):
        raise ValueError(f"reference_image: expected a path, a nibabel image or a 4x4 affine, got {affine.shape}")
    return affine, None
