"""The BUSI breast ultrasound component (MbLS, Murugesan et al.): 2D PNG images served as depth-1 volumes."""

from __future__ import annotations

import logging
import re
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

import torch
from monai.data import MetaTensor
from monai.transforms import LoadImage, MapTransform

from calib_monai.data import preprocessing as steps
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.transforms import CaseDataError
from calib_monai.data.volumes import VolumeSegmentationData, data_component

__all__ = ["BUSI", "BUSI_LAYOUTS", "LoadBUSId"]

logger = logging.getLogger("calib_monai.data")

BUSI_LAYOUTS = (
    "BUSI: <dataset_dir>/Dataset_BUSI_with_GT/{benign,malignant}/<name> (N).png with <name> (N)_mask.png (and "
    "optional <name> (N)_mask_1.png, ...); dataset_dir may also be Dataset_BUSI_with_GT itself",
)
BUSI_CLASSES = ("benign", "malignant")
_MASK = re.compile(r"_mask(_\d+)?$")


class LoadBUSId(MapTransform):
    """Read a BUSI image and the union of its masks as depth-1 volumes ``(1, H, W, 1)`` (PNG via MONAI's PILReader).

    RGB(A) becomes grey (the mean of R, G, B); mask pixels > 0 in any ``label`` file get 1, or ``malignant_value``
    for a case under ``malignant/``; ``label_key=None`` reads the image only. A reader failure is a ``CaseDataError``.
    """

    def __init__(self, image_key: str = "image", label_key: str | None = "label", malignant_value: int = 1):
        super().__init__([k for k in (image_key, label_key) if k])
        self.image_key, self.label_key, self.malignant_value = image_key, label_key, int(malignant_value)
        self.reader = LoadImage(reader="PILReader", image_only=True, reverse_indexing=False)  # (H, W) as in the PNG

    def _read(self, path: str) -> MetaTensor:
        try:
            array = self.reader(path)
        except Exception as err:  # any reader failure: name the file, keep the cause
            raise CaseDataError(
                f"cannot read {path} ({type(err).__name__}: {err}); the PNG is truncated or not an "
                "image: re-download it or remove the case"
            ) from err
        if array.ndim == 3:
            array = array[..., :3].float().mean(-1)
        return array

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        d = dict(data)
        image_path = str(d[self.image_key])
        image = self._read(image_path)
        d[self.image_key] = MetaTensor(image[None, ..., None].float(), meta={"filename_or_obj": image_path})
        if self.label_key and self.label_key in d:
            paths = d[self.label_key] if isinstance(d[self.label_key], (list, tuple)) else [d[self.label_key]]
            union = torch.zeros(image.shape, dtype=torch.bool)
            for path in paths:
                mask = self._read(str(path))
                if tuple(mask.shape) != tuple(image.shape):
                    raise CaseDataError(
                        f"mask {path} is {tuple(mask.shape)} pixels but its image {image_path} is "
                        f"{tuple(image.shape)}: they must match; fix the mask or remove the case"
                    )
                union |= mask.as_tensor() > 0
            value = self.malignant_value if Path(image_path).parent.name == "malignant" else 1
            d[self.label_key] = MetaTensor((union.float() * value)[None, ..., None], meta={"filename_or_obj": paths[0]})
        return d


@data_component
class BUSI(VolumeSegmentationData):
    """BUSI (Breast UltraSound Images): breast lesions in 2D ultrasound, the 437 benign and 210 malignant images
    (normal ones have no lesion); 1 input channel. ``BUSI_LAYOUTS``: the label is the union of an image's masks.

    Classes: background / lesion (``classes="lesion"``, MbLS' one "Tumor" class) or background / benign / malignant
    (``classes="type"``).

    Preprocessing (MbLS: "resized to a resolution of 256x256"; 445/65/137 images): each image a grey volume of depth
    1, ``(1, H, W, 1)`` (``LoadBUSId``), so the slice / volume machinery works unchanged; resized in-plane to
    ``roi_size``, per-image min-max scaling to [0, 1]. No orientation or spacing: PNGs carry none.

    Citation: Al-Dhabyani W., Gomaa M., Khaled H., Fahmy A., "Dataset of breast ultrasound images", Data in Brief 28,
    104863, 2020.

    Args:
        dataset_dir: the ``Dataset_BUSI_with_GT`` folder (or its parent); None: preprocessing only.
        others: see ``VolumeSegmentationData``.
        roi_size: preprocessed size (H, W, 1).
        classes: "lesion" (background / lesion) or "type" (background / benign / malignant).
    """

    source = "busi"
    facts = DatasetFacts({"0": "background", "1": "lesion"}, channel_names=("image",), roi_size=(256, 256, 1))
    preprocessing_args = ("classes",)
    layouts = BUSI_LAYOUTS

    roi_size: Sequence[int] = facts.roi_size
    split: Sequence[int] = (445, 65, 137)
    classes: str = "lesion"

    def __post_init__(self) -> None:
        if len(self.roi_size) != 3 or int(self.roi_size[2]) != 1:
            raise ValueError(f"BUSI images are 2D: roi_size must be (H, W, 1), got {tuple(self.roi_size)}")
        if self.classes not in ("lesion", "type"):
            raise ValueError(
                "classes must be 'lesion' (background/lesion) or 'type' (background/benign/malignant), got "
                f"{self.classes!r}"
            )
        super().__post_init__()

    @property
    def label_names(self) -> dict[str, str]:
        if self.classes == "type":
            return {"0": "background", "1": "benign", "2": "malignant"}
        return dict(self.facts.label_names)

    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        return [
            {
                "_target_": "calib_monai.data.LoadBUSId",
                "image_key": "image",
                "label_key": "label",
                "malignant_value": "$2 if @data.classes == 'type' else 1",
            },
            steps.check_labels(),
            steps.keep_input_label(),
            steps.to_float32(),
            steps.resize("$list(@roi_size[:2]) + [1]"),
            {"_target_": "ScaleIntensityd", "keys": "image", "minv": 0.0, "maxv": 1.0, "channel_wise": True},
            steps.pad_or_crop(),
        ]

    def _read_cases(self, root: Path) -> list[dict]:
        inner = root / "Dataset_BUSI_with_GT"
        self.root = inner if inner.is_dir() and not (root / "benign").is_dir() else root
        folders = [self.root / c for c in BUSI_CLASSES if (self.root / c).is_dir()]
        if not folders:
            raise self._layout_error(self.root, "has no benign/ or malignant/ folder")
        cases = []
        for folder in folders:
            pngs = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".png" and not p.name.startswith("."))
            masks: dict[str, list[str]] = {}
            for p in pngs:
                match = _MASK.search(p.stem)
                if match:
                    masks.setdefault(p.stem[: match.start()], []).append(str(p))
            for image in (p for p in pngs if not _MASK.search(p.stem)):
                if image.stem not in masks:
                    raise ValueError(
                        f"BUSI image {image} has no mask: expected {image.with_name(image.stem)}_mask.png;"
                        " add it or remove the image"
                    )
                cases.append({"image": str(image), "label": sorted(masks[image.stem])})
        if not cases:
            raise self._layout_error(self.root, "has benign/malignant folders but no <name> (N).png images")
        logger.info("BUSI: %d benign/malignant images in %s", len(cases), self.root)
        return cases

    def inference_items(self, path: Path) -> list[dict]:
        """``{"image": png, "case": <name>}`` for one PNG, or every PNG under a folder (searched recursively, masks
        and hidden files skipped)."""
        images = self._input_files(
            Path(path),
            lambda p: p.suffix.lower() == ".png" and not _MASK.search(p.stem),
            "a BUSI image to segment: pass a .png image (not a *_mask.png) or a folder of them",
            "has no .png image (other than *_mask.png; searched recursively)",
        )
        return [{"image": str(p), "case": p.stem} for p in images]

    def inference_case(self, image) -> str | None:
        return Path(str(image)).stem
