"""The ACDC cardiac cine-MRI component (NACL journal and MbLS, Murugesan et al.)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from calib_monai.data import preprocessing as steps
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.layouts import split_groups
from calib_monai.data.volumes import VolumeSegmentationData, data_component

__all__ = ["ACDC", "ACDC_LABEL_NAMES", "ACDC_LAYOUTS"]

logger = logging.getLogger("calib_monai.data")

ACDC_LABEL_NAMES = {"0": "background", "1": "RV", "2": "Myo", "3": "LV"}
ACDC_LAYOUTS = (
    "ACDC: <dataset_dir>/database/training/patientNNN/patientNNN_frameNN.nii.gz with patientNNN_frameNN_gt.nii.gz "
    "(or <dataset_dir>/training/patientNNN/... or <dataset_dir>/patientNNN/...); optional "
    "<dataset_dir>/splits/{train,val,test}.list of patient ids",
)
_GT = re.compile(r"^(patient\d+)_frame(\d+)_gt\.nii(\.gz)?$")
_SPLIT_FILES = {"training": "train.list", "validation": "val.list", "test": "test.list"}


@data_component
class ACDC(VolumeSegmentationData):
    """ACDC (Automated Cardiac Diagnosis Challenge 2017): RV (1), Myo (2), LV (3) in short-axis cine-MRI; 1 channel.

    Every annotated frame (end-diastole, end-systole) of a patient is a case (``ACDC_LAYOUTS``). The split is by
    patient: ``splits/{train,val,test}.list`` (one patient id per line) when present and ``use_split_lists``, else a
    seeded 70/10/20 patient split.

    Preprocessing (NACL journal: "we extract 2D slices, which are resized to 224x224"): RAS, in-plane resize of every
    slice to ``resize``, per-volume min-max scaling to [0, 1], centre crop/pad to ``roi_size`` (the authors' loader,
    github.com/Bala93/MarginLoss, crops the central 192x192: ``roi_size=(192, 192, -1)``). No resampling: the shared
    copy stores a 1 mm placeholder spacing.

    Citation: Bernard O. et al., "Deep learning techniques for automatic MRI cardiac multi-structures segmentation
    and diagnosis: is the problem solved?", IEEE TMI 37(11), 2018.

    Args:
        dataset_dir: the ACDC folder (holding ``database/`` and optionally ``splits/``); None: preprocessing only.
        others: see ``VolumeSegmentationData``.
        roi_size: final size (H, W, D) after the resize; ``-1`` keeps the slices of each volume.
        seed: seed of the patient split (when no split lists are used).
        resize: in-plane size (H, W) every slice is resized to.
        use_split_lists: use ``splits/*.list`` when the folder has them.
    """

    source = "acdc"
    facts = DatasetFacts(ACDC_LABEL_NAMES, channel_names=("image",), roi_size=(224, 224, -1))
    preprocessing_args = ("resize",)
    layouts = ACDC_LAYOUTS

    roi_size: Sequence[int] = facts.roi_size
    resize: Sequence[int] = (224, 224)
    split: Sequence[int] = (70, 10, 20)
    use_split_lists: bool = True

    def __post_init__(self) -> None:
        resize, self.resize = self.resize, tuple(int(s) for s in self.resize)
        if len(self.resize) != 2 or min(self.resize) <= 0:
            raise ValueError(f"resize must be the in-plane size (H, W), two positive ints, got {tuple(resize)}")
        self.patients_dir, self.split_lists = None, None
        super().__post_init__()

    def _read_cases(self, root: Path) -> list[dict]:
        candidates = (root / "database" / "training", root / "training", root)
        self.patients_dir = next((d for d in candidates if d.is_dir() and any(d.glob("patient*"))), None)
        if self.patients_dir is None:
            raise self._layout_error(root, "has no patientNNN folders")
        files = {k: root / "splits" / name for k, name in _SPLIT_FILES.items()}
        self.split_lists = None
        if self.use_split_lists and all(f.is_file() for f in files.values()):
            self.split_lists = {
                k: [n.strip() for n in f.read_text().splitlines() if n.strip()] for k, f in files.items()
            }
        cases = self._pair_frames()
        logger.info(
            "ACDC: %d annotated frames of %d patients in %s (%s split)",
            len(cases),
            len({self.subject_of(c) for c in cases}),
            self.patients_dir,
            "splits/*.list" if self.split_lists else "seeded",
        )
        return cases

    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        return [
            *steps.read_as_ras(),
            steps.resize("$list(@data.resize) + [-1]"),
            {"_target_": "ScaleIntensityd", "keys": "image", "minv": 0.0, "maxv": 1.0, "channel_wise": True},
            steps.pad_or_crop(),
        ]

    def _datalist_info(self) -> dict:
        return {**super()._datalist_info(), "split_by": "splits/*.list" if self.split_lists else "seeded patients"}

    def subject_of(self, case: dict) -> str:
        return Path(case["image"]).parent.name  # end-diastole and end-systole of one patient: one subject

    def _pair_frames(self) -> list[dict[str, str]]:
        cases = []
        for folder in sorted(p for p in self.patients_dir.iterdir() if p.is_dir() and p.name.startswith("patient")):
            for gt in sorted(folder.iterdir()):
                match = _GT.match(gt.name)
                if not match or match.group(1) != folder.name:
                    continue
                image = gt.with_name(gt.name.replace("_gt.nii", ".nii"))
                if not image.is_file():
                    raise ValueError(f"ACDC label {gt} has no image: expected {image}; restore it or remove the label")
                cases.append({"image": str(image), "label": str(gt)})
        if not cases:
            raise self._layout_error(
                self.patients_dir, "has patient folders but no patientNNN_frameNN_gt.nii.gz labels"
            )
        return cases

    def _split_cases(self, cases: list[dict], split: Sequence[int], seed: int) -> dict[str, list[dict]]:
        patients = [self.subject_of(c) for c in cases]
        if self.split_lists is None:
            return split_groups(cases, patients, split, seed)
        subset_of = {p: k for k, names in self.split_lists.items() for p in names}
        unlisted = sorted(set(patients) - set(subset_of))
        if unlisted:
            raise ValueError(
                f"{self.root / 'splits'} lists no subset for patient(s) {unlisted[:5]}"
                f"{' ...' if len(unlisted) > 5 else ''}: add them to train/val/test.list or pass "
                "use_split_lists=False for a seeded patient split"
            )
        absent = sorted(set(subset_of) - set(patients))
        if absent:
            logger.warning(
                "ACDC: %d patient(s) of %s are not in %s (e.g. %s)",
                len(absent),
                self.root / "splits",
                self.patients_dir,
                absent[0],
            )
        return split_groups(cases, patients, split, seed, subset_of)
