"""Dictionary transforms of the data sets' preprocessing: checks that turn bad input files into errors naming the case
file and the fix, the label-centred crop, the intensity scaling to [0, 1]."""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np
import torch
from monai.config import KeysCollection
from monai.data import MetaTensor
from monai.transforms import (
    EnsureChannelFirstd,
    InvertibleTransform,
    LoadImaged,
    MapTransform,
    ScaleIntensityd,
    ScaleIntensityRanged,
    ScaleIntensityRangePercentilesd,
)
from monai.transforms.croppad.array import Crop

from calib_monai.geometry import AFFINE_FIX, GEOMETRY_TOLERANCE, GridMismatch, grid_mismatch, nifti_affine_problem
from calib_monai.tensors import plain_tensor

__all__ = [
    "CaseDataError",
    "ChannelFirstd",
    "CheckedLoadImaged",
    "CropAroundForegroundd",
    "KeepInputLabeld",
    "ScaleIntensityToUnitd",
    "ValidateSegmentationd",
    "case_filename",
    "check_image_values",
    "intensity_scaling",
    "unwrap_case_error",
]


class CaseDataError(ValueError):
    """A case file that cannot be used (unreadable, shapes differ, NaN, unexpected labels); the message names it."""


def unwrap_case_error(err: BaseException) -> CaseDataError | None:
    """The ``CaseDataError`` behind MONAI's ``RuntimeError("applying transform ...")`` wrappers, if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, CaseDataError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def case_filename(data: Mapping[Hashable, object], key: Hashable) -> str:
    """The source file of ``data[key]``: its MetaTensor ``filename_or_obj``, or the path string before loading."""
    value = data.get(key)
    meta = getattr(value, "meta", None)
    if isinstance(meta, Mapping) and meta.get("filename_or_obj"):
        return str(meta["filename_or_obj"])
    return str(value) if isinstance(value, str) else f"<{key}>"


def _spatial_shape(image) -> tuple[int, ...]:
    meta = getattr(image, "meta", None)
    shape = meta.get("spatial_shape") if isinstance(meta, Mapping) else None
    return tuple(int(v) for v in (shape if shape is not None else image.shape))


def check_image_values(image, filename: str) -> None:
    """A ``CaseDataError`` naming ``filename`` for an image that cannot be judged: NaN or infinite voxels (every
    confidence would be NaN) or one value everywhere (nothing to segment; the scaling to [0, 1] divides by zero)."""
    values = plain_tensor(image).detach()
    finite = torch.isfinite(values)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise CaseDataError(
            f"image {filename} has {bad} NaN/Inf voxel(s) of {values.numel()}: it cannot be segmented (every "
            "probability would be NaN); replace them (e.g. by the background intensity) or remove the case"
        )
    low, high = torch.aminmax(values)
    if bool(low == high):
        size = "x".join(str(v) for v in _spatial_shape(image))
        raise CaseDataError(
            f"image {filename} is constant (every voxel of its {size} grid is {float(low):g}): there is nothing to "
            "segment; check the file (an empty or failed export?) or remove the case"
        )


class CheckedLoadImaged(MapTransform):
    """``monai.transforms.LoadImaged`` per key, re-raising any reader failure (truncated downloads, non-NIfTI files)
    as a ``CaseDataError`` that names the file. The ``"image"`` volume must be 3D, finite and not constant
    (:func:`check_image_values`), and every NIfTI read must have a usable affine (without one a reader guesses the
    orientation, and the segmentation is silently mirrored).
    """

    def __init__(self, keys: KeysCollection, allow_missing_keys: bool = False, **load_kwargs):
        super().__init__(keys, allow_missing_keys)
        self.image_key = "image"
        self.loaders = {key: LoadImaged(key, allow_missing_keys=allow_missing_keys, **load_kwargs) for key in self.keys}

    def _check_image(self, d: Mapping[Hashable, object], source: object) -> None:
        image = d[self.image_key]
        filename = case_filename(d, self.image_key)
        filename = filename if not filename.startswith("<") else str(source)
        spatial = _spatial_shape(image)
        if len(spatial) < 3:
            raise CaseDataError(
                f"image {filename} is {len(spatial)}D (shape {tuple(spatial)}), but this bundle segments 3D volumes "
                "(x, y, z): pass the 3D volume (one file per case, or a 4D file with channels last)"
            )
        check_image_values(image, filename)

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        d = dict(data)
        for key in self.key_iterator(d):
            _check_affine(key, d[key])  # before the reader, which would fix the header silently
            try:
                d = self.loaders[key](d)
            except Exception as err:  # any reader failure: report the file, keep the original as the cause
                raise CaseDataError(
                    f"cannot read {key} file {d[key]} ({type(err).__name__}: {err}); the file is truncated or not "
                    "NIfTI: re-download or re-convert it, or remove the case"
                ) from err
            if key == self.image_key:
                self._check_image(d, data[key])
        return d


def _check_affine(key: Hashable, source: object) -> None:
    """A ``CaseDataError`` naming the file when a NIfTI to be read under ``key`` has no usable affine (other formats
    carry their geometry otherwise, or none: a PNG)."""
    for path in source if isinstance(source, (list, tuple)) else [source]:
        if isinstance(path, (str, os.PathLike)) and str(path).endswith((".nii", ".nii.gz")):
            try:
                problem = nifti_affine_problem(path)
            except Exception:  # a file nibabel cannot read: the reader's error, which names it, comes next
                continue
            if problem:
                raise CaseDataError(f"{key} {path} has no usable affine: {problem}; {AFFINE_FIX}")


class ChannelFirstd(EnsureChannelFirstd):
    """``EnsureChannelFirstd``, then the ``"image"`` channels counted against ``image_channels`` (the data set's
    channel names; None: not checked): another number raises a ``CaseDataError`` naming the file and ``source``."""

    def __init__(self, keys: KeysCollection, image_channels: Iterable[str] | None = None, source: str = "", **kwargs):
        super().__init__(keys, **kwargs)
        self.image_key, self.source = "image", source
        self.image_channels = None if image_channels is None else tuple(str(c) for c in image_channels)

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        d = super().__call__(data)
        if self.image_channels is not None and self.image_key in d:
            channels = int(d[self.image_key].shape[0])
            if channels != len(self.image_channels):
                expected = len(self.image_channels)
                raise CaseDataError(
                    f"image {case_filename(d, self.image_key)} has {channels} channel(s), but the {self.source} images "
                    f"this bundle takes have {expected} ({', '.join(self.image_channels)}): its network reads "
                    f"{expected}; pass an image with {expected} channel(s) (a 4D NIfTI's last axis, or one file per "
                    "channel)"
                )
        return d


def _grid_problem(image, label):
    """What differs between the voxel grids of ``image`` and ``label`` (``calib_monai.geometry.grid_mismatch``, in
    RAS order); without 3D affines (plain tensors, 2D images) the shapes alone."""
    affines = [getattr(x, "affine", None) for x in (image, label)]
    if image.ndim != 4 or label.ndim != 4 or any(a is None or tuple(a.shape) != (4, 4) for a in affines):
        same = tuple(image.shape[1:]) == tuple(label.shape[1:])
        return None if same else GridMismatch("shape", f"{tuple(image.shape[1:])} against {tuple(label.shape[1:])}")
    image_affine, label_affine = (np.asarray(plain_tensor(a).detach().cpu(), dtype=np.float64) for a in affines)
    return grid_mismatch(image_affine, tuple(image.shape[1:]), label_affine, tuple(label.shape[1:]))


class ValidateSegmentationd(MapTransform):
    """Check the ``"image"``, ``"label"`` pair after ``EnsureChannelFirstd``, raising a ``CaseDataError`` naming the
    case file: the label on the image's voxel grid (``calib_monai.geometry``; another orientation passes,
    ``Orientationd`` reorients both), one label channel, integer label values within ``allowed_labels``.
    """

    def __init__(self, allowed_labels: Iterable[int] | None = None, label_description: str = ""):
        super().__init__(["image", "label"])
        self.image_key, self.label_key = "image", "label"
        self.allowed = None if allowed_labels is None else sorted({int(v) for v in allowed_labels})
        self.label_description = label_description

    def __call__(self, data: Mapping[Hashable, object]) -> Mapping[Hashable, object]:
        image, label = data[self.image_key], data[self.label_key]
        image_file, label_file = case_filename(data, self.image_key), case_filename(data, self.label_key)
        problem = _grid_problem(image, label)
        if problem is not None and (problem.kind == "shape" or tuple(image.shape[1:]) != tuple(label.shape[1:])):
            raise CaseDataError(
                f"image {image_file} has spatial shape {tuple(image.shape[1:])} but its label {label_file} has "
                f"{tuple(label.shape[1:])}: they must match voxel for voxel; re-export the mask on the image grid or "
                "fix the image/label pairing"
            )
        if problem is not None:
            raise CaseDataError(
                f"label {label_file} does not lie on the grid of its image {image_file}: {problem.text} (tolerance "
                f"{GEOMETRY_TOLERANCE:g} voxel): it would be trained and scored against other voxels; re-export the "
                "label on the image grid (or fix its header), or remove the case"
            )
        if label.shape[0] != 1:
            raise CaseDataError(
                f"label {label_file} has {label.shape[0]} channels; expected one channel of integer class values "
                "(not one-hot)"
            )
        labels = plain_tensor(label).detach().reshape(-1)
        rounded = labels.round()
        if not torch.equal(labels, rounded):
            odd = labels[labels != rounded].unique()[:5].tolist()
            raise CaseDataError(
                f"label {label_file} has non-integer values {odd}; expected integer class values: was the mask "
                "resampled with linear interpolation?"
            )
        if self.allowed is not None:
            low = int(rounded.min())
            # bincount over the shifted values: the set of values present, without sorting the whole volume
            present = (torch.bincount((rounded - low).long()).nonzero().reshape(-1) + low).tolist()
            unexpected = sorted(set(present) - set(self.allowed))
            if unexpected:
                raise CaseDataError(
                    f"label {label_file} has values {unexpected} outside the expected set {self.allowed}"
                    f"{self.label_description}; check that the data set is the one named, or remap its labels"
                )
        return data


class KeepInputLabeld(MapTransform):
    """Keep a copy of the label as read (``keys`` -> ``names``): the truth on the input grid, the grid the delivered
    segmentation is on; uint8 when the classes fit (a cached volume's copy costs memory)."""

    def __init__(self, keys: KeysCollection, names: str | Iterable[str] = "input_label") -> None:
        super().__init__(keys)
        self.names = [names] if isinstance(names, str) else list(names)
        if len(self.names) != len(self.keys):
            raise ValueError(f"KeepInputLabeld: {len(self.keys)} keys but {len(self.names)} names")

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        for key, name in zip(self.key_iterator(d), self.names):
            label = d[key]
            dtype = torch.uint8 if float(plain_tensor(label).max()) < 256 else torch.int32
            copy = plain_tensor(label).detach().to(dtype)
            d[name] = MetaTensor(copy, meta=dict(label.meta)) if isinstance(label, MetaTensor) else copy
        return d


class CropAroundForegroundd(MapTransform, InvertibleTransform):
    """Crop a fixed ``roi_size`` window centred on the bounding box of ``data[source_key] > 0``.

    Unlike ``CropForegroundd`` and a pad, the window keeps the image context: its start along each axis is
    ``clip(c - r // 2, 0, max(n - r, 0))`` (``c`` the bounding-box centre, ``r`` the ROI size, ``n`` the image size),
    sliding inward at the borders. Axes whose ROI size is ``<= 0`` or not smaller than the image are not cropped; an
    empty foreground centres the window. Invertible (MONAI ``Crop``), for ``Invertd``.
    """

    def __init__(
        self, keys: KeysCollection, source_key: str, roi_size: Iterable[int], allow_missing_keys: bool = False
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.source_key = source_key
        self.roi_size = [int(r) for r in roi_size]
        self.cropper = Crop()

    def slices(self, source: torch.Tensor) -> tuple[slice, ...]:
        shape = source.shape[1:]
        if len(self.roi_size) != len(shape):
            raise ValueError(f"roi_size {tuple(self.roi_size)} has {len(self.roi_size)} axes, the image {len(shape)}")
        foreground = plain_tensor(source).detach().gt(0).any(0)
        start, end = [], []
        for axis in range(foreground.ndim):  # bounding box from per-axis projections (cheaper than MONAI's generic one)
            hits = foreground.any(dim=[a for a in range(foreground.ndim) if a != axis]).nonzero().reshape(-1)
            start.append(int(hits[0]) if len(hits) else 0)
            end.append(int(hits[-1]) + 1 if len(hits) else 0)
        out = []
        for n, r, lo, hi in zip(shape, self.roi_size, start, end):
            if r <= 0 or r >= n:
                out.append(slice(0, n))
                continue
            centre = (lo + hi) // 2 if hi > lo else n // 2
            first = int(np.clip(centre - r // 2, 0, n - r))
            out.append(slice(first, first + r))
        return tuple(out)

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        slices = self.slices(d[self.source_key])
        for key in self.key_iterator(d):
            d[key] = self.cropper(d[key], slices)
        return d

    def inverse(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.cropper.inverse(d[key])
        return d


def intensity_scaling(intensity: str | Sequence[float], keys: KeysCollection = "image") -> MapTransform:
    """Per volume and channel scaling to [0, 1]; a ValueError for another ``intensity`` than:

    - ``"minmax"``: ``x' = (x - min x) / (max x - min x)``;
    - ``"percentile"``: ``x' = clip((x - p_0.5) / (p_99.5 - p_0.5), 0, 1)``, robust to a few hot voxels;
    - ``(low, high)``: a fixed window, ``x' = clip((x - low) / (high - low), 0, 1)``.
    """
    if isinstance(intensity, str):
        if intensity == "minmax":
            return ScaleIntensityd(keys, minv=0.0, maxv=1.0, channel_wise=True)
        if intensity == "percentile":
            return ScaleIntensityRangePercentilesd(keys, 0.5, 99.5, b_min=0.0, b_max=1.0, clip=True, channel_wise=True)
        raise ValueError(f"intensity must be 'minmax', 'percentile' or a (low, high) window, got {intensity!r}")
    window = [float(v) for v in intensity]
    if len(window) != 2 or window[0] >= window[1]:
        raise ValueError(f"an intensity window must be (low, high) with low < high, got {tuple(intensity)}")
    return ScaleIntensityRanged(keys, a_min=window[0], a_max=window[1], b_min=0.0, b_max=1.0, clip=True)


class ScaleIntensityToUnitd(MapTransform):
    """Scale ``keys`` to [0, 1] by the ``intensity`` rule (``intensity_scaling``): one config item whose argument
    picks the MONAI transform, so that ``--data#intensity percentile`` switches it."""

    def __init__(
        self, keys: KeysCollection, intensity: str | Sequence[float] = "minmax", allow_missing_keys: bool = False
    ):
        super().__init__(keys, allow_missing_keys)
        self.intensity = intensity
        self.scaler = intensity_scaling(intensity, self.keys)
        self.scaler.allow_missing_keys = allow_missing_keys

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> Mapping[Hashable, torch.Tensor]:
        return self.scaler(data)
