"""Do two voxel grids describe the same place? The one geometry check wherever a label meets an image or a prediction.

A grid is an array shape and its affine (voxel index -> RAS world mm). Grids differing only in the order and direction
of their voxels are the same (:func:`reorientation`); :func:`grid_mismatch` compares both reoriented to RAS, within
:data:`GEOMETRY_TOLERANCE` of the smallest voxel. A grid without a usable affine is refused, never guessed.
Floor 0: NumPy and nibabel only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import nibabel as nib
import numpy as np
from nibabel.openers import ImageOpener
from nibabel.orientations import apply_orientation, inv_ornt_aff, io_orientation, ornt_transform

__all__ = [
    "AFFINE_FIX",
    "GEOMETRY_TOLERANCE",
    "GridMismatch",
    "affine_problem",
    "nifti_affine_problem",
    "grid_mismatch",
    "reorient",
    "reorientation",
]

GEOMETRY_TOLERANCE = 0.01  # of the smallest voxel: float32 headers differ by ~1e-5 mm, a one-voxel shift by 1
AFFINE_FIX = (
    "write it again with its scanner geometry (convert it again from the DICOM series, or set it with nibabel's "
    "set_sform(affine, code=1))"
)


def affine_problem(affine) -> str | None:
    """None when ``affine`` (voxel -> world mm) places the voxels, else what is wrong, in words: a matrix that is
    not a finite 4 x 4 one, a zero voxel size or a singular matrix."""
    matrix = np.asarray(affine, dtype=np.float64)
    if matrix.shape != (4, 4) or not np.isfinite(matrix).all():
        return f"its affine is not a finite 4 x 4 matrix ({matrix.round(4).tolist()})"
    spacing = np.linalg.norm(matrix[:3, :3], axis=0)
    if spacing.min() <= 1e-6 or abs(np.linalg.det(matrix[:3, :3])) <= 1e-9 * float(np.prod(spacing)):
        return f"its affine is singular (voxel size {_vector(spacing)} mm): a zero spacing or two parallel axes"
    return None


def nifti_affine_problem(path: str | os.PathLike) -> str | None:
    """:func:`affine_problem` of a NIfTI file's header as stored (nibabel's reader fixes it silently: a zero pixdim
    becomes 1 mm, and both codes 0 give a guessed orientation with x mirrored): None when it places the voxels."""
    header_class = type(nib.load(str(path)).header)
    with ImageOpener(str(path)) as f:
        header = header_class.from_fileobj(f, check=False)  # as written, not as nibabel would fix it
    if int(header["sform_code"]) > 0:
        return affine_problem(header.get_sform())
    if int(header["qform_code"]) <= 0:
        return "it records no orientation (qform_code and sform_code are both 0), so a reader would guess one"
    zooms = np.asarray(header["pixdim"][1:4], dtype=np.float64)
    if not np.isfinite(zooms).all() or (zooms == 0).any():
        return f"its qform has a zero voxel size (pixdim {_vector(zooms)}), which a reader would take as 1 mm"
    return affine_problem(header.get_qform())


@dataclass(frozen=True)
class GridMismatch:
    """What differs between two grids: ``kind`` is ``"shape"``, ``"spacing"``, ``"axes"`` or ``"position"``."""

    kind: str
    text: str


def _ras(affine: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...]]:
    """The grid reoriented to RAS: its affine and shape."""
    affine = np.asarray(affine, dtype=np.float64)
    ornt = io_orientation(affine)
    ras_affine = affine @ inv_ornt_aff(ornt, shape)
    ras_shape = tuple(int(shape[int(axis)]) for axis in np.argsort(ornt[:, 0]))
    return ras_affine, ras_shape


def _vector(values: np.ndarray) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


def grid_mismatch(
    reference_affine, reference_shape, other_affine, other_shape, tolerance: float = GEOMETRY_TOLERANCE
) -> GridMismatch | None:
    """None when the two 3D grids cover the same voxels (up to the order they are stored in), else what differs,
    in words, "reference" first (e.g. the image) and "other" second (e.g. its label)."""
    ref_affine, ref_shape = _ras(reference_affine, tuple(reference_shape)[:3])
    oth_affine, oth_shape = _ras(other_affine, tuple(other_shape)[:3])
    if ref_shape != oth_shape:
        return GridMismatch("shape", f"{ref_shape} voxels against {oth_shape} (in RAS order)")
    ref_spacing = np.linalg.norm(ref_affine[:3, :3], axis=0)
    oth_spacing = np.linalg.norm(oth_affine[:3, :3], axis=0)
    limit = tolerance * float(min(ref_spacing.min(), oth_spacing.min()))
    if np.abs(ref_spacing - oth_spacing).max() > limit:
        return GridMismatch("spacing", f"voxel size {_vector(ref_spacing)} mm against {_vector(oth_spacing)} mm")
    if np.abs(ref_affine[:3, :3] - oth_affine[:3, :3]).max() > limit:
        return GridMismatch(
            "axes",
            f"axes (direction x voxel size) {ref_affine[:3, :3].round(4).tolist()} against "
            f"{oth_affine[:3, :3].round(4).tolist()}",
        )
    shift = oth_affine[:3, 3] - ref_affine[:3, 3]
    if np.abs(shift).max() > limit:
        return GridMismatch(
            "position",
            f"{np.linalg.norm(shift):.4g} mm apart (first voxel at "
            f"{_vector(ref_affine[:3, 3])} against {_vector(oth_affine[:3, 3])} mm, RAS)",
        )
    return None


def reorientation(from_affine, to_affine) -> np.ndarray | None:
    """The nibabel orientation transform that stores an array of the grid ``from_affine`` in the voxel order of
    ``to_affine`` (same grid, see :func:`grid_mismatch`); None when they are stored alike."""
    transform = ornt_transform(io_orientation(np.asarray(from_affine)), io_orientation(np.asarray(to_affine)))
    identity = np.array([[axis, 1.0] for axis in range(len(transform))])
    return None if np.array_equal(transform, identity) else transform


def reorient(array: np.ndarray, transform: np.ndarray | None, channel_axis: int | None = None) -> np.ndarray:
    """``array`` (3D, or 4D with a ``channel_axis``) stored by ``transform`` (:func:`reorientation`)."""
    if transform is None:
        return array
    if channel_axis is None:
        return np.ascontiguousarray(apply_orientation(array, transform))
    moved = np.moveaxis(array, channel_axis, -1)  # apply_orientation works on the first axes
    return np.ascontiguousarray(np.moveaxis(apply_orientation(moved, transform), -1, channel_axis))
