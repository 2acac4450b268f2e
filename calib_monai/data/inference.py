"""Inference on unlabelled images: file listing, image-only preprocessing and segmentation + confidence outputs."""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import torch
from monai.config import KeysCollection
from monai.data import MetaTensor
from monai.transforms import Activationsd, Compose, MapTransform

from calib_monai.bundle.manifest import NOT_APPLICABLE
from calib_monai.bundle.outputs import (
    CONTOUR_POSTFIXES,
    OUTPUT_POSTFIXES,
    SOURCE_KEY,
    SOURCE_META,
    OutputWriter,
    check_output_folder,
    output_case,
    quality_path,
    write_case_quality,
)
from calib_monai.checks import clip_probability_rounding
from calib_monai.data.input_grid import ToInputGridd
from calib_monai.data.layouts import NIFTI_SUFFIXES
from calib_monai.data.writers import image_savers

__all__ = [
    "CaseNamed",
    "ClipProbabilityRoundingd",
    "ConfidenceAndSegmentationd",
    "CheckOutputFolderd",
    "RecordSourced",
    "SaveCaseQualityd",
    "image_datalist",
    "inference_preprocessing",
    "nifti_items",
    "segmentation_and_confidence",
]

logger = logging.getLogger("calib_monai.data")

IMAGE_FOLDERS = ("imagesTs", "imagesTr", "images", "TestImg", "TrainingImg", "ValidationImg")


def nifti_items(path: Path) -> list[dict[str, str]]:
    """``[{"image": path}, ...]`` of the NIfTI images at ``path``: one NIfTI file, a folder of them, or a data set
    root holding one of ``IMAGE_FOLDERS`` (the first found, test images first); sorted, hidden files skipped. The
    default ``VolumeSegmentationData.inference_items``."""
    path = Path(path)
    if path.is_file() and path.name.endswith(NIFTI_SUFFIXES):
        return [{"image": str(path)}]
    if not path.is_dir():
        raise ValueError(f"dataset_dir {str(path)!r} is neither a NIfTI file nor a folder")
    folder = next((path / f for f in IMAGE_FOLDERS if (path / f).is_dir()), path)
    images = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(NIFTI_SUFFIXES))
    images = [p for p in images if not p.name.startswith(".")]  # macOS resource forks in MSD archives
    if not images:
        raise ValueError(f"no .nii/.nii.gz images in {folder} (looked for {', '.join(IMAGE_FOLDERS)} in {path} first)")
    return [{"image": str(p)} for p in images]


def image_datalist(dataset_dir: str | os.PathLike, data=None) -> list[dict]:
    """The items to segment, ``[{"image": path or [paths], "case": name (optional)}, ...]``.

    With a dataset component ``data`` the listing is ``data.inference_items(dataset_dir)``: each component knows
    its own inputs (BraTS: the 4 modality files of each case folder; MRBrainS: ``<subject>/pre/*``; BUSI: PNGs
    without ``_mask``; PROMISE12: ``.mhd`` without ``_segmentation``), by default NIfTI files (``nifti_items``:
    one file, a folder of them, or a data set root holding one of ``IMAGE_FOLDERS``). ``"case"`` names the
    outputs of ``segmentation_and_confidence`` (else the first input file does).

    An empty ``dataset_dir`` with a dataset component ``data`` lists the images of its test split (the phantoms by
    default); a component built with ``dataset_dir=None`` (preprocessing only) has none, so the images must be
    given.
    """
    if not dataset_dir:
        if data is None or getattr(data, "inference_only", False):
            built = (
                ""
                if data is None
                else (
                    f" and {type(data).__name__} was built without a data set "
                    "(dataset_dir=None), so it has no test images to fall back on"
                )
            )
            raise ValueError(
                f"dataset_dir is empty{built}: pass a NIfTI file or a folder of images to segment "
                "(e.g. --dataset_dir /path/to/FLARE22/imagesTs)"
            )
        items = []
        for item in data.datalist()["test"]:
            case = data.inference_case(item["image"]) if hasattr(data, "inference_case") else None
            items.append({"image": item["image"], **({"case": case} if case else {})})
        return items
    path = Path(dataset_dir).expanduser()
    if not path.exists():
        raise ValueError(f"dataset_dir {str(path)!r} does not exist: pass a file or a folder of images to segment")
    lister = getattr(data, "inference_items", None)
    items = _without_outputs(lister(path) if callable(lister) else nifti_items(path), path)
    if not items:
        raise ValueError(f"no images to segment in {path}")
    outputs: dict[str, Any] = {}  # the case each item's outputs are named after (bundle.outputs.output_case)
    for item in items:
        case = output_case({"case_name": item.get("case"), "filename_or_obj": item["image"]})
        if case in outputs:
            raise ValueError(
                f"{_first(outputs[case])} and {_first(item['image'])} under {path} are both the case {case!r}: "
                f"one would overwrite the other's outputs ({case}_seg.nii.gz...); keep one of them, or segment the "
                "folders one at a time"
            )
        outputs[case] = item["image"]
    return items


def _without_outputs(items: list[dict], path: Path) -> list[dict]:
    """``items`` without the files an earlier ``inferring`` run wrote among the images (``<case>_seg.nii.gz``, ...
    beside its ``<case>_quality.json``: --output_dir was the image folder): segmented, they would be scored and counted
    by the site monitor as images of the site."""
    postfixes = (*OUTPUT_POSTFIXES.values(), *CONTOUR_POSTFIXES.values())
    kept, outputs = [], []
    for item in items:
        image = Path(_first(item["image"]))
        case, _, postfix = output_case({"filename_or_obj": str(image)}).rpartition("_")
        is_output = postfix in postfixes and case and quality_path(image.parent, case).is_file()
        (outputs if is_output else kept).append(image.name if is_output else item)
    if outputs:
        logger.warning(
            "left out %d file(s) in %s that an inferring run wrote there (%s): outputs, not images; keep them apart "
            "with another --output_dir",
            len(outputs),
            path,
            ", ".join(outputs[:4]) + (", ..." if len(outputs) > 4 else ""),
        )
    return kept


def _first(image: Any) -> str:
    return str(image[0] if isinstance(image, (list, tuple)) else image)


def inference_preprocessing(component) -> Compose:
    """The image-only chain of a dataset component, ``component.inference_preprocessing()``: its
    ``preprocessing_steps()`` without label checks and crops (``calib_monai.data.preprocessing``), as bundle
    ``inference.json`` writes it. One instance per component, so ``Invertd`` finds the same transform instances."""
    return component.inference_preprocessing()


class ConfidenceAndSegmentationd(MapTransform):
    """From class probabilities ``p`` (C, ...) under ``key``: ``segmentation = argmax_c p`` and
    ``confidence = max_c p`` (the confidence that calibration is about), both (1, ...) with the meta data of ``p``;
    ``<confidence_key>_of`` names ``key``, so that ``CaseQualityd`` reuses them for these probabilities only."""

    def __init__(
        self, keys: KeysCollection = "pred", segmentation_key: str = "segmentation", confidence_key: str = "confidence"
    ):
        super().__init__(keys)
        self.segmentation_key, self.confidence_key = segmentation_key, confidence_key

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        for key in self.key_iterator(d):
            confidence, segmentation = d[key].max(dim=0, keepdim=True)
            d[self.confidence_key] = confidence.float()
            d[self.segmentation_key] = segmentation.to(torch.uint8)
            d[f"{self.confidence_key}_of"] = key  # CaseQualityd reuses both only for the probabilities they came from
        return d


class ClipProbabilityRoundingd(MapTransform):
    """Clip the float rounding of probabilities under ``keys`` into [0, 1] where they are made (``Invertd``'s
    interpolation of a softmax or of its confidence reaches 1 + 1.2e-7), so that the exact checks downstream accept
    them; values further out are an error (:func:`calib_monai.checks.clip_probability_rounding`)."""

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = clip_probability_rounding(d[key], f"the probabilities {key!r} mapped back to the input grid")
        return d


class CaseNamed(MapTransform):
    """Record the item's case name (``data[case_key]``, from ``image_datalist``) as ``"case_name"`` in the meta data
    of ``keys``, so ``SaveImaged`` with ``case_name_formatter`` names the outputs after the case (e.g. the BraTS
    case folder) rather than after the first of several input files. Items without a case name are left alone."""

    def __init__(self, keys: KeysCollection, case_key: str = "case"):
        super().__init__(keys, allow_missing_keys=True)
        self.case_key = case_key

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        case = d.get(self.case_key)
        if isinstance(case, (list, tuple)) and len(case) == 1:  # a batch of one that was not decollated
            case = case[0]
        if not case:
            return d
        for key in self.key_iterator(d):
            if isinstance(d[key], MetaTensor):
                d[key].meta = {**d[key].meta, "case_name": str(case)}  # a new dict: the input's meta is untouched
        return d


class RecordSourced(MapTransform):
    """Put the item's source (``source_key``: the weights, recalibration and validated range SHA-256s that
    ``CalibrateLogitsd`` records) into the case quality (``quality["source"]``) and the meta data of the output
    images ``keys`` (``SOURCE_META``, which the writer puts into the NIfTI header). Without a recalibration a stored
    validated range (measured on recalibrated probabilities) is not applicable: the review flag is null with the
    reason ``NOT_APPLICABLE``, whatever ``CaseQualityd`` made of the range."""

    def __init__(self, keys: KeysCollection, quality_key: str = "quality", source_key: str = SOURCE_KEY) -> None:
        super().__init__(keys, allow_missing_keys=True)
        self.quality_key, self.source_key = quality_key, source_key

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        source = d.get(self.source_key)
        if not source:
            return d
        quality = d.get(self.quality_key)
        if isinstance(quality, Mapping):
            quality = {**quality, "source": dict(source)}
            if source.get("validated_range") == NOT_APPLICABLE:
                quality["review"] = {"flag": None, "reasons": [NOT_APPLICABLE]}
            d[self.quality_key] = quality
        for key in self.key_iterator(d):
            if isinstance(d[key], MetaTensor):
                d[key].meta = {**d[key].meta, SOURCE_META: dict(source)}
        return d


class CheckOutputFolderd(MapTransform, OutputWriter):
    """Before anything is written: refuse an ``output_dir`` whose ``quality.csv`` holds another source's results
    (:func:`calib_monai.bundle.outputs.check_output_folder`); checked once per source."""

    def __init__(self, output_dir: str | os.PathLike, source_key: str = SOURCE_KEY) -> None:
        super().__init__(source_key, allow_missing_keys=True)
        self.output_dir, self.source_key = output_dir, source_key
        self._checked: set[str] = set()

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        source = data.get(self.source_key) or {}
        stamp = repr(sorted(source.items()))
        if stamp not in self._checked:
            check_output_folder(self.output_dir, source)
            self._checked.add(stamp)
        return dict(data)


class SaveCaseQualityd(MapTransform, OutputWriter):
    """Write the case quality under ``keys`` (``CaseQualityd``'s dict) to ``<output_dir>/<case>_quality.json`` and
    its row to ``<output_dir>/quality.csv`` (:func:`calib_monai.bundle.outputs.write_case_quality`); the case is
    named as the images are (``CaseNamed``'s case name, else the input file), read from ``name_key``'s meta data."""

    def __init__(self, keys: KeysCollection, output_dir: str | os.PathLike, name_key: str = "segmentation") -> None:
        super().__init__(keys)
        self.output_dir, self.name_key = output_dir, name_key

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        meta = getattr(d.get(self.name_key), "meta", {}) or {}
        for key in self.key_iterator(d):
            write_case_quality(self.output_dir, output_case(meta), d[key])
        return d


def segmentation_and_confidence(
    preprocessing: Compose,
    output_dir: str | os.PathLike,
    case_quality: MapTransform | None = None,
    site_monitor: MapTransform | None = None,
    contours: MapTransform | None = None,
) -> Compose:
    """Post-processing of a ``SupervisedEvaluator`` over ``inference_preprocessing`` outputs.

    softmax -> ``segmentation`` (argmax) and ``confidence`` (max probability) on the network's grid -> the case
    quality there -> only those two mapped back to each input's grid (``ToInputGridd``: the label map nearest, the
    confidence linearly; with several input files per case, the grid of the first, which they share) ->
    ``<output_dir>/<name>_seg.nii.gz`` and ``<name>_conf.nii.gz`` (NIfTI with the input's affine; a PNG's outputs
    are 2D, ``(H, W)``, with an identity affine), where ``<name>`` is the item's ``"case"``
    (``image_datalist``: the BraTS case, the MRBrainS subject, the BUSI/PROMISE12 image name) or else the input
    file's name without extension. Two channels cross to the input grid, not C probability channels (a full-size CT's
    input grid holds about 30x the network's voxels). With ``case_quality`` (``calib_monai.review.CaseQualityd`` on
    ``"pred"``) each case also gets ``<name>_quality.json`` and a row of ``<output_dir>/quality.csv``: its estimated
    DSC, volumes (mL, from the network grid's affine) and review flag, scored on the network's grid, the grid whose
    labels the delivered segmentation carries (each input voxel takes its nearest network voxel's), as ``calibrate``
    scores the validated range. With ``site_monitor`` (``calib_monai.review.SiteMonitord``) each case also feeds the
    deployment's site monitor, and after its alarm every case's outputs say so. With ``contours``
    (``calib_monai.review.ContourMarginsd``, after the verdict it reads) each case also gets ``<name>_inner.nii.gz``
    and ``<name>_outer.nii.gz`` (uint8, 4D: one volume per foreground class, in label order), made on the network's
    grid as ``calibrate`` chose their margins and mapped back nearest as the segmentation, and their volumes in its
    quality.
    """
    keys = ("segmentation", "confidence")
    delivered = (*keys, *CONTOUR_POSTFIXES)  # what crosses to the input grid
    quality = [] if case_quality is None else [case_quality]
    saved = [] if case_quality is None else [SaveCaseQualityd(case_quality.quality_key, output_dir)]
    return Compose(
        [
            Activationsd("pred", softmax=True),
            ConfidenceAndSegmentationd("pred"),
            *quality,  # after: it scores the case with the segmentation and confidence just taken
            CaseNamed(keys),
            RecordSourced(keys, quality_key=getattr(case_quality, "quality_key", "quality")),
            *([] if site_monitor is None or case_quality is None else [site_monitor]),
            *([] if contours is None else [contours]),  # after the verdict: a flagged case's contours say so
            # only what is delivered crosses to the input grid: the label maps nearest, as their uint8
            ToInputGridd(delivered, preprocessing, nearest=(True, False, True, True), allow_missing_keys=True),
            ClipProbabilityRoundingd("confidence"),
            CheckOutputFolderd(output_dir),
            image_savers(output_dir, contours=contours is not None),
            *saved,
        ]
    )
