"""Submitted labels to the label maps a bundle trains on (no MONAI Label import).

Slicer gives the i-th segment of the saved ``label_info`` the value i + 1: ``value_map`` maps those back to the
bundle's values by segment name (``"liver (uncertain)"`` as liver); ``remap_label`` writes the label in the values
the bundle's data files use, ``check_label`` checks without writing. A refusal is a ValueError naming the case, the
segment or values or both grids, and the fix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np

from calib_monai.geometry import grid_mismatch

__all__ = ["UNCERTAIN_SUFFIX", "check_label", "remap_label", "stored_values", "value_map"]

UNCERTAIN_SUFFIX = " (uncertain)"


def value_map(
    label_info: Sequence[Mapping[str, Any]] | None, label_names: Mapping[int, str], case: str
) -> dict[int, int]:
    """Submitted value -> bundle value, from the segment names (see the module); identity without ``label_info``."""
    if not label_info:
        return {v: v for v in label_names}
    by_name = {name.lower(): value for value, name in label_names.items()}
    mapping = {0: 0}
    for position, entry in enumerate(label_info):
        name = str(entry.get("name", "")).strip()
        key = name[: -len(UNCERTAIN_SUFFIX)] if name.endswith(UNCERTAIN_SUFFIX) else name
        if key.lower() not in by_name:
            known = [n for v, n in sorted(label_names.items()) if v > 0]
            raise ValueError(
                f"the label of {case} has a segment {name!r}, which this bundle does not segment (it "
                f"knows {known}): rename or delete that segment in Slicer and submit again"
            )
        mapping[position + 1] = by_name[key.lower()]
    return mapping


def stored_values(bundle_dir: str | os.PathLike) -> dict[int, int]:
    """Bundle value -> the value the bundle's data files hold it as: the inverse of its training chain's
    ``MapLabelValued`` (BraTS stores class 3 as 4), the smallest when several map to one; empty for none."""
    config = json.loads((Path(bundle_dir) / "configs" / "train.json").read_text())
    train = config.get("train") or {}
    transforms = train.get("deterministic_transforms") or (train.get("preprocessing") or {}).get("transforms", [])
    transforms = transforms if isinstance(transforms, list) else []
    out: dict[int, int] = {}
    for item in transforms:
        if isinstance(item, dict) and str(item.get("_target_", "")).endswith("MapLabelValued"):
            for stored, value in sorted(zip(item["orig_labels"], item["target_labels"])):
                out.setdefault(int(value), int(stored))
    return out


def _read_label(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """The label's values and affine (None for a PNG: no geometry), trailing singleton axes past the third dropped."""
    try:
        if path.suffix.lower() == ".png":
            from PIL import Image

            with Image.open(path) as png:
                return np.asarray(png), None
        image = nib.load(str(path))
        values = np.asarray(image.dataobj)
    except Exception as err:  # nibabel, gzip, zlib, PIL: any reader failure is the file's
        raise ValueError(
            f"the label {path.name} cannot be read as a NIfTI or PNG label map ({type(err).__name__}: {err}): save "
            "it as .nii.gz (Slicer's MONAI Label module does) and submit again"
        ) from err
    while values.ndim > 3 and values.shape[-1] == 1:
        values = values[..., 0]
    return values, image.affine


def _check_grid(case: str, label: Path, values: np.ndarray, affine, image: Path | None) -> np.ndarray:
    """``values`` on ``image``'s grid (a 2D PNG image: the same rows and columns); a ValueError naming both files."""
    if image is None or not image.is_file():
        return values
    fix = "save the label on its image's own grid (Slicer: the segmentation's geometry is the image) and submit again"
    if image.suffix.lower() == ".png":
        from PIL import Image

        with Image.open(image) as png:
            shape = (png.height, png.width)
        flat = values.reshape(values.shape[:2]) if values.ndim == 3 and values.shape[2] == 1 else values
        if flat.shape != shape:
            raise ValueError(
                f"the label of {case} ({label.name}) is {tuple(values.shape)} pixels, its image {image.name} is "
                f"{shape} (rows, columns): {fix}"
            )
        return flat
    if not image.name.endswith((".nii", ".nii.gz")) or affine is None:
        return values
    header = nib.load(str(image))
    mismatch = grid_mismatch(header.affine, header.shape[:3], affine, values.shape)
    if mismatch is not None:
        raise ValueError(
            f"the label of {case} ({label.name}) is not on the grid of its image {image.name}: {mismatch.text}; {fix}"
        )
    return values


def check_label(
    label: str | os.PathLike,
    image: str | os.PathLike | None,
    label_info: Sequence[Mapping[str, Any]] | None,
    label_names: Mapping[int, str],
    case: str,
) -> dict[int, int]:
    """The train task's checks of a submitted label, without writing (when it is submitted): segment names known,
    values named, grid the image's. Returns the value map."""
    mapping = value_map(label_info, label_names, case)
    _mapped_values(Path(label), mapping, case, None if image is None else Path(image))
    return mapping


def _mapped_values(source: Path, mapping: Mapping[int, int], case: str, image: Path | None):
    values, affine = _read_label(source)
    values = _check_grid(case, source, values, affine, image)
    if not np.array_equal(values, np.round(values)):
        raise ValueError(f"the label of {case} ({source.name}) holds non-integer values: submit a label map")
    values = values.astype(np.int64)
    unknown = sorted(set(np.unique(values).tolist()) - set(mapping))
    if unknown:
        raise ValueError(
            f"the label of {case} ({source.name}) has values {unknown[:5]} that no segment of its label_info "
            f"names (known: {sorted(mapping)}): submit it again from Slicer"
        )
    return values, affine


def _lookup(mapping: Mapping[int, int], stored: Mapping[int, int] | None = None) -> np.ndarray:
    lookup = np.zeros(max(mapping) + 1, dtype=np.uint8)
    for value, bundle_value in mapping.items():
        lookup[value] = (stored or {}).get(bundle_value, bundle_value)
    return lookup


def bundle_label(
    label: str | os.PathLike, mapping: Mapping[int, int], case: str, image: str | os.PathLike | None = None
) -> np.ndarray:
    """A submitted label map in the bundle's values (``mapping``: :func:`value_map`) on ``image``'s grid."""
    values, _ = _mapped_values(Path(label), mapping, case, None if image is None else Path(image))
    return _lookup(mapping)[values]


def remap_label(
    source: str | os.PathLike,
    target: str | os.PathLike,
    mapping: Mapping[int, int],
    case: str,
    image: str | os.PathLike | None = None,
    stored: Mapping[int, int] | None = None,
) -> None:
    """Write ``source``'s label map with its values mapped (uint8), on ``image``'s grid when given; ``stored``:
    :func:`stored_values`. A ``.png`` target is written as PNG."""
    source, target = Path(source), Path(target)
    values, affine = _mapped_values(source, mapping, case, None if image is None else Path(image))
    values = _lookup(mapping, stored)[values]
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.suffix.lower() == ".png":
        from PIL import Image

        Image.fromarray(values).save(target)
    else:
        nib.save(nib.Nifti1Image(values, affine if affine is not None else np.eye(4)), str(target))
