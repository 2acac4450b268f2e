"""Inference on unlabelled images: file listing, image-only preprocessing and segmentation + confidence outputs."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from pathlib import Path

import torch
from monai.config import KeysCollection
from monai.transforms import (
    Activationsd,
    Compose,
    EnsureChannelFirstd,
    EnsureTyped,
    Invertd,
    MapTransform,
    Orientationd,
    SaveImaged,
    Spacingd,
)

from calib_monai.data.layouts import NIFTI_SUFFIXES
from calib_monai.data.transforms import CheckedLoadImaged

__all__ = ["ConfidenceAndSegmentationd", "image_datalist", "inference_preprocessing", "segmentation_and_confidence"]

IMAGE_FOLDERS = ("imagesTs", "imagesTr", "images", "TestImg", "TrainingImg", "ValidationImg")


def image_datalist(dataset_dir: str | os.PathLike, data=None) -> list[dict[str, str]]:
    """``[{"image": path}, ...]`` of the NIfTI images to segment, sorted.

    ``dataset_dir`` may be one NIfTI file, a folder of them, or a data set root holding one of ``IMAGE_FOLDERS``
    (the first found, test images first). An empty ``dataset_dir`` with a dataset component ``data`` lists the
    images of its test split (the phantoms by default); a component built with ``dataset_dir=None``
    (preprocessing only) has none, so the images must be given.
    """
    if not dataset_dir:
        if data is None or getattr(data, "inference_only", False):
            built = "" if data is None else (f" and {type(data).__name__} was built without a data set "
                                             "(dataset_dir=None), so it has no test images to fall back on")
            raise ValueError(f"dataset_dir is empty{built}: pass a NIfTI file or a folder of images to segment "
                             "(e.g. --dataset_dir /path/to/FLARE22/imagesTs)")  # fmt: skip
        return [{"image": item["image"]} for item in data.datalist()["test"]]
    path = Path(dataset_dir).expanduser()
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


def inference_preprocessing(component) -> Compose:
    """Image-only version of ``component.preprocessing()``: load, RAS, resampling, intensity scaling, no crop.

    Without a label there is no foreground to crop around; ``SliceInferer`` slides the 2D ``roi_size`` window over
    every axial slice instead. Memoised on the component so ``Invertd`` finds the same transform instances.
    """
    cached = getattr(component, "_inference_preprocessing", None)
    if cached is not None:
        return cached
    custom = getattr(component, "_image_only_transforms", None)  # components whose files are not NIfTI (BUSI PNGs)
    if callable(custom):
        component._inference_preprocessing = Compose(custom())
        return component._inference_preprocessing
    chain = [
        CheckedLoadImaged("image", image_only=True),
        EnsureChannelFirstd("image"),
        EnsureTyped("image", dtype=torch.float32, track_meta=True),
        Orientationd("image", axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
    ]
    if component.spacing is not None:
        chain.append(Spacingd("image", pixdim=component.spacing, mode="bilinear", dtype=torch.float32))
    spatial = getattr(component, "_spatial_transforms", None)
    chain += spatial(("image",)) if callable(spatial) else []
    chain += component._intensity_transforms()
    component._inference_preprocessing = Compose(chain)
    return component._inference_preprocessing


class ConfidenceAndSegmentationd(MapTransform):
    """From class probabilities ``p`` (C, ...) under ``key``: ``segmentation = argmax_c p`` and
    ``confidence = max_c p`` (the confidence that calibration is about), both (1, ...) with the meta data of ``p``."""

    def __init__(self, keys: KeysCollection = "pred", segmentation_key: str = "segmentation",
                 confidence_key: str = "confidence"):  # fmt: skip
        super().__init__(keys)
        self.segmentation_key, self.confidence_key = segmentation_key, confidence_key

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        for key in self.key_iterator(d):
            confidence, segmentation = d[key].max(dim=0, keepdim=True)
            d[self.confidence_key] = confidence.float()
            d[self.segmentation_key] = segmentation.to(torch.uint8)
        return d


def segmentation_and_confidence(preprocessing: Compose, output_dir: str | os.PathLike) -> Compose:
    """Post-processing of a ``SupervisedEvaluator`` over ``inference_preprocessing`` outputs.

    softmax -> ``segmentation`` (argmax) and ``confidence`` (max probability) -> ``Invertd`` back to each input
    file's grid (nearest for the segmentation) -> ``<output_dir>/<name>_seg.nii.gz`` and ``<name>_conf.nii.gz``.
    """
    keys = ("segmentation", "confidence")
    return Compose([
        Activationsd("pred", softmax=True),
        ConfidenceAndSegmentationd("pred"),
        Invertd(keys, transform=preprocessing, orig_keys="image", nearest_interp=(True, False), to_tensor=True),
        SaveImaged("segmentation", output_dir=str(output_dir), output_postfix="seg", output_dtype="uint8",
                   separate_folder=False, resample=False, print_log=False),
        SaveImaged("confidence", output_dir=str(output_dir), output_postfix="conf", output_dtype="float32",
                   separate_folder=False, resample=False, print_log=False),
    ])  # fmt: skip
