"""The MRBrainS18 brain tissue component (NACL journal, MbLS): GM, WM, CSF with leave-one-subject-out folds."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calib_monai.data import preprocessing as steps
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.layouts import require_file
from calib_monai.data.volumes import VolumeSegmentationData, data_component

__all__ = ["MRBRAINS18_TO_TISSUE", "MRBRAINS_LAYOUTS", "MRBRAINS_MODALITIES", "MRBrainS"]

logger = logging.getLogger("calib_monai.data")

MRBRAINS_MODALITIES = ("reg_T1.nii.gz", "FLAIR.nii.gz", "reg_IR.nii.gz")  # T1, T2-FLAIR, T1-IR (registered to FLAIR)
# MRBrainS18 labels (segm.nii.gz): 0 background, 1 cortical gray matter, 2 basal ganglia, 3 white matter, 4 white
# matter lesions, 5 cerebrospinal fluid in the extracerebral space, 6 ventricles, 7 cerebellum, 8 brain stem,
# 9 infarction, 10 other. The challenge's 3-tissue evaluation merges 1+2 -> GM, 3+4 -> WM, 5+6 -> CSF and leaves out
# cerebellum, brain stem, infarction and other, which therefore become background here.
MRBRAINS18_TO_TISSUE = {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3, 7: 0, 8: 0, 9: 0, 10: 0}
MRBRAINS_LAYOUTS = (
    "MRBrainS18: <dataset_dir>/training/<id>/pre/{reg_T1.nii.gz, reg_IR.nii.gz, FLAIR.nii.gz} with "
    "<dataset_dir>/training/<id>/segm.nii.gz (dataset_dir may also be training/ itself)",
)


def _subject_order(name: str) -> tuple[int, str]:
    return (int(name), name) if name.isdigit() else (1 << 30, name)


@data_component
class MRBrainS(VolumeSegmentationData):
    """MRBrainS18 brain tissue segmentation: GM (1), WM (2), CSF (3); T1, T2-FLAIR and T1-IR as 3 input channels
    (the paper's "T1, T2 and T1-IR"); the release's 10 labels reduced by ``MRBRAINS18_TO_TISSUE``.

    Folds (NACL: "leave-one-out-cross-validation"): subjects sorted by id, ``fold`` k holds out subject k for
    testing, one other subject (chosen with ``seed``) validates, the rest train; ``datalist.json`` records the fold.

    Preprocessing: the modalities stacked as channels, RAS, no resampling (240x240x48 at 0.96x0.96x3 mm),
    per-channel min-max scaling to [0, 1], centre crop/pad to ``roi_size``.

    Citation: Mendrik A.M. et al., "MRBrainS challenge: online evaluation framework for brain image segmentation in
    3T MRI scans", Computational Intelligence and Neuroscience, 2015; MRBrainS18: https://mrbrains18.isi.uu.nl.

    Args:
        dataset_dir: the MRBrainS18 folder holding ``training/`` (or ``training/`` itself); None: preprocessing
            only (``fold`` is then not checked against the subjects).
        others: see ``VolumeSegmentationData``.
        seed: seed of the choice of the validation subject.
        fold: index (0..n-1) of the held-out test subject in id order.
    """

    source = "mrbrains18"
    facts = DatasetFacts(
        {"0": "background", "1": "GM", "2": "WM", "3": "CSF"},
        channel_names=("T1", "FLAIR", "IR"),
        roi_size=(240, 240, 48),
    )
    preprocessing_args = ("intensity",)
    layouts = MRBRAINS_LAYOUTS
    label_mapping = MRBRAINS18_TO_TISSUE
    split = (1, 1, 1)  # leave-one-subject-out: set from the subjects found (_read_cases)

    roi_size: Sequence[int] = facts.roi_size
    fold: int = 0
    intensity: str | Sequence[float] = "minmax"

    def __post_init__(self) -> None:
        self.fold = int(self.fold)
        self.subjects: list[str] = []
        super().__post_init__()

    def _read_cases(self, root: Path) -> list[dict]:
        self.root = root / "training" if (root / "training").is_dir() else root
        subjects = sorted(
            (p for p in self.root.iterdir() if p.is_dir() and (p / "pre").is_dir()),
            key=lambda p: _subject_order(p.name),
        )
        if len(subjects) < 3:
            raise self._layout_error(
                self.root,
                f"has {len(subjects)} subject folder(s) with a pre/ folder; leave-one-"
                "out needs at least 3 (training, validation, test)",
            )
        if not 0 <= self.fold < len(subjects):
            raise ValueError(
                f"fold must be in 0..{len(subjects) - 1} (one per subject: "
                f"{[p.name for p in subjects]}), got {self.fold}"
            )
        self.subjects = [p.name for p in subjects]
        self.split = (len(subjects) - 2, 1, 1)
        cases = [
            {
                "image": [require_file(p / "pre" / m, "MRBrainS18 scan") for m in MRBRAINS_MODALITIES],
                "label": require_file(p / "segm.nii.gz", "MRBrainS18 label"),
            }
            for p in subjects
        ]
        logger.info(
            "MRBrainS18: %d subjects in %s, fold %d tests subject %s",
            len(subjects),
            self.root,
            self.fold,
            self.subjects[self.fold],
        )
        return cases

    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        return [*steps.read_as_ras(MRBRAINS18_TO_TISSUE), steps.scale_to_unit(), steps.pad_or_crop()]

    def inference_items(self, path: Path) -> list[dict]:
        """``{"image": [pre/reg_T1, pre/FLAIR, pre/reg_IR], "case": <subject id>}`` for every ``<id>/pre/`` folder at
        ``path`` (a subject, its ``pre/`` or a file in it, or a folder searched recursively); another NIfTI file is a
        3-channel image."""
        path = Path(path)
        if path.is_file():
            if path.parent.name != "pre":
                return super().inference_items(path)
            subjects = [path.parent.parent]
        elif path.name == "pre" and any((path / m).is_file() for m in MRBRAINS_MODALITIES):
            subjects = [path.parent]
        elif (path / "pre").is_dir():
            subjects = [path]
        else:
            subjects = sorted(
                (p.parent for p in path.rglob("pre") if p.is_dir() and not p.parent.name.startswith(".")),
                key=lambda p: (_subject_order(p.name), str(p)),
            )
        if not subjects:
            raise self._layout_error(
                path,
                "has no <id>/pre/ subject folder (searched recursively); expected one subject "
                f"folder <id>/pre/{{{', '.join(MRBRAINS_MODALITIES)}}}, a folder of them or the "
                "release root",
            )
        return [
            {"image": [require_file(p / "pre" / m, "MRBrainS18 scan") for m in MRBRAINS_MODALITIES], "case": p.name}
            for p in subjects
        ]

    def inference_case(self, image) -> str | None:
        first = Path(image[0] if isinstance(image, (list, tuple)) else image)
        return first.parent.parent.name if first.parent.name == "pre" else None

    def _datalist_info(self) -> dict:
        return {**super()._datalist_info(), "fold": self.fold, "test_subject": self.subjects[self.fold]}

    def _split_cases(self, cases: list[dict], split: Sequence[int], seed: int) -> dict[str, list[dict]]:
        by_subject = {Path(c["label"]).parent.name: c for c in cases}
        test = self.subjects[self.fold]
        rest = [s for s in self.subjects if s != test]
        validation = rest[int(np.random.default_rng(int(seed)).integers(len(rest)))]
        return {
            "training": [by_subject[s] for s in rest if s != validation],
            "validation": [by_subject[validation]],
            "test": [by_subject[test]],
        }

    def _label_convention(self) -> str:
        return "MRBrainS18 labels 0..10: 1 cortical GM, 2 basal ganglia, 3 WM, 4 WM lesions, 5 CSF, 6 ventricles, ..."
