"""The BraTS 2019 multi-modal brain tumour component (NACL journal, MbLS), and the ET/TC/WT evaluation regions."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from calib_monai.data import preprocessing as steps
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.layouts import require_file, strip_nifti
from calib_monai.data.volumes import VolumeSegmentationData, data_component

__all__ = ["BRATS_LABEL_NAMES", "BRATS_LAYOUTS", "BRATS_MODALITIES", "BRATS_REGION_CLASSES", "BraTS"]

logger = logging.getLogger("calib_monai.data")

BRATS_MODALITIES = ("flair", "t1", "t1ce", "t2")
# BraTS files: 1 necrotic / non-enhancing tumour core (NCR/NET), 2 peritumoral edema (ED), 4 GD-enhancing tumour (ET);
# 4 becomes 3 so that the classes are 0..3
BRATS_LABEL_NAMES = {"0": "background", "1": "NCR/NET", "2": "ED", "3": "ET"}
BRATS_TO_CLASSES = {0: 0, 1: 1, 2: 2, 4: 3}
# the evaluation regions as unions of classes (ET enhancing tumour, TC tumour core, WT whole tumour)
BRATS_REGION_CLASSES = {"ET": (3,), "TC": (1, 3), "WT": (1, 2, 3)}
BRATS_LAYOUTS = (
    "BraTS 2019: <dataset_dir>/MICCAI_BraTS_2019_Data_Training/{HGG,LGG}/<case>/<case>_{flair,t1,t1ce,t2,seg}.nii.gz "
    "(dataset_dir may also be MICCAI_BraTS_2019_Data_Training itself)",
)


def _modality_prefix(name: str) -> str | None:
    """``<case>`` of ``<case>_<modality>.nii[.gz]`` (modality one of ``BRATS_MODALITIES``), else None."""
    stem = strip_nifti(name) or ""
    for modality in BRATS_MODALITIES:
        if stem.endswith(f"_{modality}") and len(stem) > len(modality) + 1:
            return stem[: -len(modality) - 1]
    return None


def _case_file(folder: Path, case: str, modality: str) -> str:
    """``<folder>/<case>_<modality>.nii[.gz]``, or the error naming the missing file."""
    for suffix in (".nii.gz", ".nii"):
        path = folder / f"{case}_{modality}{suffix}"
        if path.is_file():
            return str(path)
    return require_file(folder / f"{case}_{modality}.nii.gz", f"BraTS {modality} file")


@data_component
class BraTS(VolumeSegmentationData):
    """BraTS 2019 glioma segmentation: FLAIR, T1, T1ce, T2 as 4 input channels; classes NCR/NET (1), ED (2), ET (3,
    stored as 4); DSC/HD are reported on the regions ET, TC, WT (``BRATS_REGION_CLASSES``). 335 cases
    (``BRATS_LAYOUTS``), split at random 235/35/65 (NACL journal).

    Preprocessing (NACL: "each volume of dimension 155x240x240 is resampled to 128x192x192"; "slices containing only
    background are removed from the training"): the modalities stacked as channels, labels 4 -> 3, RAS, resize to
    ``resize``, per-channel min-max scaling to [0, 1]; only the training slices with tumour are served.

    Citations: Menze B.H. et al., "The multimodal brain tumor image segmentation benchmark (BRATS)", IEEE TMI 34,
    2015; Bakas S. et al., "Advancing The Cancer Genome Atlas glioma MRI collections with expert segmentation labels
    and radiomic features", Sci. Data 4, 2017; Bakas S. et al., arXiv:1811.02629, 2018.

    Args:
        dataset_dir: the BraTS 2019 training folder (or its parent); None: preprocessing only.
        others: see ``VolumeSegmentationData``.
        resize: size (H, W, D) every volume is resized to.
    """

    source = "brats"
    drop_empty_training_slices = True
    facts = DatasetFacts(
        BRATS_LABEL_NAMES,
        channel_names=("FLAIR", "T1", "T1ce", "T2"),
        roi_size=(192, 192, 128),
        regions=BRATS_REGION_CLASSES,
    )
    preprocessing_args = ("resize", "intensity")
    layouts = BRATS_LAYOUTS
    label_mapping = BRATS_TO_CLASSES

    roi_size: Sequence[int] = facts.roi_size
    resize: Sequence[int] = (192, 192, 128)
    split: Sequence[int] = (235, 35, 65)
    intensity: str | Sequence[float] = "minmax"

    def __post_init__(self) -> None:
        resize, self.resize = self.resize, tuple(int(s) for s in self.resize)
        if len(self.resize) != 3 or min(self.resize) <= 0:
            raise ValueError(f"resize must be (H, W, D), three positive ints, got {tuple(resize)}")
        super().__post_init__()

    def _read_cases(self, root: Path) -> list[dict]:
        inner = root / "MICCAI_BraTS_2019_Data_Training"
        self.root = inner if not any((root / g).is_dir() for g in ("HGG", "LGG")) and inner.is_dir() else root
        grades = [self.root / g for g in ("HGG", "LGG") if (self.root / g).is_dir()]
        if not grades:
            raise self._layout_error(self.root, "has no HGG/ or LGG/ folder")
        cases = []
        for grade in grades:
            for folder in sorted(p for p in grade.iterdir() if p.is_dir() and not p.name.startswith(".")):
                files = {m: _case_file(folder, folder.name, m) for m in (*BRATS_MODALITIES, "seg")}
                cases.append({"image": [files[m] for m in BRATS_MODALITIES], "label": files["seg"]})
        if not cases:
            raise self._layout_error(self.root, "has HGG/LGG folders but no case folders in them")
        logger.info("BraTS: %d cases in %s", len(cases), self.root)
        return cases

    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        return [
            *steps.read_as_ras(BRATS_TO_CLASSES),
            steps.resize("$@data.resize"),
            steps.scale_to_unit(),
            steps.pad_or_crop(),
        ]

    def inference_items(self, path: Path) -> list[dict]:
        """``{"image": [flair, t1, t1ce, t2], "case": <case>}`` for every ``<case>_flair.nii[.gz]`` under ``path``
        (searched recursively) or for the case of one modality file; another NIfTI file is a 4-channel image."""
        path = Path(path)
        if path.is_file():
            prefix = _modality_prefix(path.name)
            if prefix is None:
                return super().inference_items(path)
            flairs = [Path(_case_file(path.parent, prefix, "flair"))]
        else:
            flairs = self._input_files(
                path,
                lambda p: p.name.endswith(("_flair.nii.gz", "_flair.nii")),
                "a folder",
                "has no <case>_flair.nii.gz file (searched recursively); expected one case folder "
                "<case>/<case>_{flair,t1,t1ce,t2}.nii.gz, a folder of them, or the release root",
            )
        items = []
        for flair in flairs:
            case = _modality_prefix(flair.name)
            files = [str(flair)] + [_case_file(flair.parent, case, m) for m in BRATS_MODALITIES[1:]]
            items.append({"image": files, "case": case})
        return sorted(items, key=lambda item: item["case"])

    def inference_case(self, image) -> str | None:
        first = Path(image[0] if isinstance(image, (list, tuple)) else image).name
        return _modality_prefix(first)

    def _label_convention(self) -> str:
        return "BraTS labels: 0 background, 1 NCR/NET, 2 edema, 4 enhancing tumour"
