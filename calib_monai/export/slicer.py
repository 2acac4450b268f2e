"""3D Slicer review files of a bundle's inference outputs (or of arrays with their NIfTI affine), on the reference
image's grid: ``<case>.seg.nrrd``, a labelmap NRRD with the ``Segmentation_*`` / ``Segment<N>_*`` fields of Slicer's
storage node (one segment per foreground label, the overlapping segment "low confidence", and with the contours
``"<name> (outer 90%)"`` / ``"<name> (inner 90%)"``: :mod:`calib_monai.export.slicer_contours`), and
``<case>_confidence.nrrd`` (float32). The case's quality goes into ``calib_monai_*`` header fields and segment tags.

Slicer's NRRD space is left-posterior-superior (RAS with x and y negated); the array axes keep the NIfTI order.
Needs ``pynrrd``, imported when a file is written.
"""

from __future__ import annotations

import colorsys
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calib_monai.atomic import ensure_folder, write_durably, write_text_durably
from calib_monai.bundle import TrainedBundle, output_paths, quality_path
from calib_monai.checks import check_number
from calib_monai.defaults import LOW_CONFIDENCE

from .slicer_contours import contour_segments, contour_stack
from .slicer_fields import quality_fields, quality_tags, source_fields
from .slicer_inputs import ArrayOrPath, check_same_source, load_volume, reference_geometry, spatial_volume

__all__ = [
    "LOW_CONFIDENCE_SEGMENT_ID",
    "LOW_CONFIDENCE_SEGMENT_NAME",
    "LOW_CONFIDENCE_COLOR",
    "SEGMENT_PALETTE",
    "SlicerFiles",
    "bundle_label_names",
    "lps_geometry",
    "segment_color",
    "slicer_files_from_inference",
    "write_slicer_files",
]

LOW_CONFIDENCE_SEGMENT_ID = "low_confidence"
LOW_CONFIDENCE_SEGMENT_NAME = "low confidence"
LOW_CONFIDENCE_COLOR = (1.0, 1.0, 0.0)  # yellow: not in SEGMENT_PALETTE
LOW_CONFIDENCE_LABEL_VALUE = 1
LOW_CONFIDENCE_LAYER = 1
LABEL_LAYER = 0

# Segment colours (RGB in 0..1) of label values 1, 2, ...: Tableau 10 without its olive (too close to the
# low-confidence yellow), then the light Tableau 20 tints.
SEGMENT_PALETTE: tuple[tuple[float, float, float], ...] = (
    (0.121569, 0.466667, 0.705882),  # blue
    (1.000000, 0.498039, 0.054902),  # orange
    (0.172549, 0.627451, 0.172549),  # green
    (0.839216, 0.152941, 0.156863),  # red
    (0.580392, 0.403922, 0.741176),  # purple
    (0.549020, 0.337255, 0.294118),  # brown
    (0.890196, 0.466667, 0.760784),  # pink
    (0.090196, 0.745098, 0.811765),  # cyan
    (0.498039, 0.498039, 0.498039),  # grey
    (0.682353, 0.780392, 0.909804),  # light blue
    (1.000000, 0.733333, 0.470588),  # light orange
    (0.596078, 0.874510, 0.541176),  # light green
    (1.000000, 0.596078, 0.588235),  # light red
    (0.772549, 0.690196, 0.835294),  # light purple
    (0.768627, 0.611765, 0.580392),  # light brown
    (0.968627, 0.713725, 0.823529),  # light pink
    (0.619608, 0.854902, 0.898039),  # light cyan
)

# NIfTI (RAS) <-> NRRD "left-posterior-superior": negate x and y.
_RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0])
_NRRD_SPACE = "left-posterior-superior"


@dataclass(frozen=True)
class SlicerFiles:
    """The files written by :py:func:`write_slicer_files`."""

    segmentation: Path  # <case>.seg.nrrd
    confidence: Path  # <case>_confidence.nrrd
    quality: Path | None = None  # <case>_quality.json (when the case's quality was given)


def segment_color(label_value: int) -> tuple[float, float, float]:
    """Display colour of the segment of ``label_value`` (>= 1): ``SEGMENT_PALETTE`` in order, then golden-ratio hues."""
    if label_value < 1:
        raise ValueError(f"segment label values start at 1, got {label_value}")
    if label_value <= len(SEGMENT_PALETTE):
        return SEGMENT_PALETTE[label_value - 1]
    hue = ((label_value - len(SEGMENT_PALETTE)) * 0.618033988749895) % 1.0
    return tuple(round(c, 6) for c in colorsys.hsv_to_rgb(hue, 0.65, 0.85))  # type: ignore[return-value]


def lps_geometry(affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NRRD ``space directions`` (rows: one vector per array axis) and ``space origin`` in LPS of a NIfTI RAS affine."""
    affine = np.asarray(affine, dtype=np.float64)
    if affine.shape != (4, 4):
        raise ValueError(f"expected a 4x4 affine, got shape {affine.shape}")
    directions = (_RAS_TO_LPS @ affine[:3, :3]).T  # row i = LPS vector of one step along array axis i
    origin = _RAS_TO_LPS @ affine[:3, 3]
    return directions + 0.0, origin + 0.0  # + 0.0: no "-0" in the header


def bundle_label_names(bundle_dir: str | os.PathLike) -> dict[int, str]:
    """``label_names`` of a bundle (``configs/train.json``) as ``{label value: name}``."""
    names = TrainedBundle(bundle_dir, ("train.json",)).label_names
    if not names:
        raise KeyError(f"{bundle_dir}/configs/train.json has no 'label_names'")
    return names


def _label_names(label_names: Mapping | Sequence[str] | None) -> dict[int, str]:
    if label_names is None:
        return {}
    if isinstance(label_names, Mapping):
        return {int(k): str(v) for k, v in label_names.items()}
    if isinstance(label_names, (str, bytes)):
        raise TypeError("label_names must be a mapping {label value: name} or a sequence of names, not a string")
    return {i: str(name) for i, name in enumerate(label_names)}


def _nrrd():
    try:
        import nrrd
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("writing Slicer files needs pynrrd: pip install pynrrd") from e
    return nrrd


def write_slicer_files(
    segmentation: ArrayOrPath,
    confidence: ArrayOrPath,
    reference_image: ArrayOrPath | None,
    label_names: Mapping | Sequence[str] | None,
    output_dir: str | os.PathLike,
    case: str,
    low_confidence: float = LOW_CONFIDENCE,
    quality: Mapping[str, Any] | None = None,
    contours: Mapping[str, ArrayOrPath] | None = None,
) -> SlicerFiles:
    """Write ``<case>.seg.nrrd`` and ``<case>_confidence.nrrd`` into ``output_dir`` for review in 3D Slicer.

    Args:
        segmentation: integer labels, ``(I, J, K)`` (or 2D, or with a singleton channel axis): a NIfTI path
            (e.g. ``<case>_seg.nii.gz``), a nibabel image or an array.
        confidence: the max softmax probability on the same grid, same kinds of input; stored as float32.
        reference_image: the geometry: a NIfTI path or nibabel image (its affine and shape), a 4x4 RAS affine, or
            ``None`` to use the affine of ``segmentation`` (then a file or a nibabel image). NIfTI inputs must have
            the reference's affine: they are not resampled.
        label_names: ``{label value: name}`` (string keys too, as in ``configs/train.json``) or names by value;
            every label but 0 gets a segment (empty if absent), an unnamed one found in the data ``"label <value>"``.
        output_dir: created if needed.
        case: file name stem.
        low_confidence: voxels with ``confidence < low_confidence`` (compared in float32, as stored) form the
            segment "low confidence" (its own layer, so it overlaps the organs).
        quality: the case's quality and review flag (``calib_monai.review.CaseQualityd``), put into the
            segmentation's header and segment tags and written as ``<case>_quality.json``.
        contours: ``{"inner", "outer"}``: ``<case>_inner/_outer.nii.gz`` (structure last) or ``Prediction.contours``
            (structure first) on the segmentation's grid: the segments ``"<name> (inner/outer 90%)"``, tagged.

    Returns:
        The paths written.
    """
    low_confidence = _check_low_confidence(low_confidence)
    nrrd = _nrrd()
    seg, seg_affine = load_volume(segmentation, "segmentation")
    conf, conf_affine = load_volume(confidence, "confidence")
    seg, conf = spatial_volume(seg, "segmentation"), spatial_volume(conf, "confidence")
    affine, ref_shape = reference_geometry(reference_image)
    if affine is None:
        if seg_affine is None:
            raise ValueError("reference_image is None and segmentation has no affine: pass a reference image or affine")
        affine = seg_affine
    for what, own_affine in (("segmentation", seg_affine), ("confidence", conf_affine)):
        if own_affine is not None and not np.allclose(own_affine, affine, atol=1e-4):
            raise ValueError(
                f"{what} is not on the reference grid (affine\n{own_affine}\nvs\n{affine}); resample it first"
            )
    if seg.shape != conf.shape:
        raise ValueError(f"segmentation {seg.shape} and confidence {conf.shape} have different shapes")
    if ref_shape is not None and seg.shape != ref_shape:
        raise ValueError(f"segmentation {seg.shape} and reference image {ref_shape} have different shapes")

    if not (np.issubdtype(seg.dtype, np.integer) or np.issubdtype(seg.dtype, np.bool_)):
        if not np.array_equal(seg, np.round(seg)):
            raise ValueError("segmentation must hold integer labels")
    labels = seg.astype(np.int64)
    if labels.size and labels.min() < 0:
        raise ValueError("segmentation labels must be >= 0")
    dtype = np.min_scalar_type(int(labels.max()) if labels.size else 0)  # uint8, uint16 or uint32

    names = _label_names(label_names)
    present = {int(v) for v in np.unique(labels)}
    values = sorted(v for v in set(names) | present if v != 0)
    if any(v < 0 for v in values):
        raise ValueError(f"label_names has negative label values: {sorted(v for v in values if v < 0)}")

    conf32 = np.asarray(conf, dtype=np.float32)
    low = conf32 < np.float32(low_confidence)

    directions, origin = lps_geometry(affine)
    extent = " ".join(f"0 {n - 1}" for n in seg.shape)
    header: dict[str, Any] = {
        "space": _NRRD_SPACE,
        "kinds": ["list", "domain", "domain", "domain"],
        "space directions": np.vstack([np.full((1, 3), np.nan), directions]),  # "none" for the list axis
        "space origin": origin,
        "encoding": "gzip",
        "Segmentation_MasterRepresentation": "Binary labelmap",
        "Segmentation_ContainedRepresentationNames": "Binary labelmap|",
        "Segmentation_ReferenceImageExtentOffset": "0 0 0",
    }
    if quality is not None:
        header.update(quality_fields(quality))
        header.update(source_fields(quality.get("source")))
    per_class = (quality or {}).get("classes", {})
    segments = [
        (
            f"label_{v}",
            names.get(v, f"label {v}"),
            segment_color(v),
            v,
            LABEL_LAYER,
            quality_tags(per_class.get(names.get(v, ""), {})),
        )
        for v in values
    ]
    segments.append(
        (
            LOW_CONFIDENCE_SEGMENT_ID,
            LOW_CONFIDENCE_SEGMENT_NAME,
            LOW_CONFIDENCE_COLOR,
            LOW_CONFIDENCE_LABEL_VALUE,
            LOW_CONFIDENCE_LAYER,
            f"calib_monai.confidence_threshold:{low_confidence:g}|",
        )
    )
    _segment_fields(header, segments, extent)

    layers = [labels.astype(dtype), low.astype(dtype) * LOW_CONFIDENCE_LABEL_VALUE]
    if contours is not None:
        inner, outer = (
            contour_stack(contours[kind], seg.shape, affine, f"the {kind} contours") for kind in ("inner", "outer")
        )
        structures = [(v, names.get(v, f"label {v}"), segment_color(v)) for v in range(1, len(inner) + 1)]
        more, contour_entries, fields = contour_segments(
            inner, outer, structures, (quality or {}).get("contours"), LOW_CONFIDENCE_LAYER + 1
        )
        layers += more
        header.update(fields)
        _segment_fields(header, contour_entries, extent, start=len(segments))
    layers = np.stack([layer.astype(dtype) for layer in layers])  # (layer, I, J, K)

    output_dir = ensure_folder(output_dir, "output_dir")  # a file there: one line, not FileExistsError
    seg_path = output_dir / f"{case}.seg.nrrd"
    conf_path = output_dir / f"{case}_confidence.nrrd"
    write_durably(seg_path, lambda tmp: nrrd.write(tmp, layers, header, index_order="F"))
    conf_header = {
        "space": _NRRD_SPACE,
        "kinds": ["domain", "domain", "domain"],
        "space directions": directions,
        "space origin": origin,
        "encoding": "gzip",
    }
    conf_header.update(source_fields((quality or {}).get("source")))
    write_durably(conf_path, lambda tmp: nrrd.write(tmp, conf32, conf_header, index_order="F"))
    written = None
    if quality is not None:
        written = quality_path(output_dir, case)
        text = json.dumps({"case": case, **quality}, indent=2) + "\n"
        write_text_durably(written, text)
    return SlicerFiles(segmentation=seg_path, confidence=conf_path, quality=written)


def _segment_fields(header: dict[str, Any], segments: Sequence[tuple], extent: str, start: int = 0) -> None:
    """The ``Segment<N>_*`` fields of ``segments`` ``(id, name, colour, label value, layer, tags)``, from N = start."""
    for index, (segment_id, name, color, value, layer, tags) in enumerate(segments, start=start):
        key = f"Segment{index}_"
        header[key + "ID"] = segment_id
        header[key + "Name"] = name
        header[key + "NameAutoGenerated"] = "0"
        header[key + "Color"] = " ".join(f"{c:.6g}" for c in color)
        header[key + "ColorAutoGenerated"] = "0"
        # Slicer gives a layer's segments the extent of the first one read: each carries the whole grid's extent
        header[key + "Extent"] = extent
        header[key + "LabelValue"] = str(value)
        header[key + "Layer"] = str(layer)
        if tags:
            header[key + "Tags"] = tags


def _check_low_confidence(value: Any) -> float:
    return check_number(
        "low_confidence", value, 0, 1, low_open=True, high_open=True,
        hint=f"the confidence below which a voxel is in the low-confidence segment; e.g. {LOW_CONFIDENCE}",
    )  # fmt: skip


def slicer_files_from_inference(
    inference_dir: str | os.PathLike,
    case: str,
    label_names: Mapping | Sequence[str] | None,
    output_dir: str | os.PathLike | None = None,
    low_confidence: float = LOW_CONFIDENCE,
) -> SlicerFiles:
    """Slicer files of one case of a bundle's inference run (``<case>_seg.nii.gz``, the reference, ``_conf``, and
    when written ``_quality.json``, ``_inner`` and ``_outer``) into ``output_dir`` (default: ``inference_dir``)."""
    _check_low_confidence(low_confidence)  # before any file is read
    files = output_paths(inference_dir, case)
    seg_path, conf_path, stored = files.segmentation, files.confidence, files.quality
    missing = [path.name for path in (seg_path, conf_path) if not Path(path).is_file()]
    if missing:
        found = sorted(p.name[: -len("_seg.nii.gz")] for p in Path(inference_dir).glob("*_seg.nii.gz"))
        cases = f"; it has the cases {found[:10]}" if found else ""
        raise FileNotFoundError(
            f"{inference_dir} has no {' or '.join(missing)}{cases}: run the bundle's inferring step on the image first "
            "(python -m monai.bundle run inferring --config_file <bundle>/configs/inference.json --dataset_dir "
            f"<image or folder>), or pass --inference_dir where it wrote {case}_seg.nii.gz"
        )
    try:
        quality = json.loads(stored.read_text()) if stored.is_file() else None
    except ValueError as err:
        raise ValueError(
            f"{stored} cannot be read as JSON ({err}): the file is cut off or damaged; run the bundle's inferring "
            "step on the image again, or delete it"
        ) from err
    if quality is not None:
        quality.pop("case", None)
    images = {"segmentation": Path(seg_path), "confidence": Path(conf_path)}
    contours = {"inner": files.inner, "outer": files.outer}
    contours = contours if all(Path(path).is_file() for path in contours.values()) else None
    check_same_source({**images, **(contours or {})}, quality)
    return write_slicer_files(
        seg_path,
        conf_path,
        seg_path,
        label_names,
        inference_dir if output_dir is None else output_dir,
        case,
        low_confidence,
        quality,
        contours,
    )
