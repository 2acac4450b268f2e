"""The KiTS19 kidney tumour CT component (NACL journal, following Islam and Glocker's SVLS setup)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import nibabel as nib

from calib_monai.data import preprocessing as steps
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.volumes import VolumeSegmentationData, data_component

__all__ = ["KITS_LAYOUTS", "KiTS"]

logger = logging.getLogger("calib_monai.data")

KITS_LAYOUTS = (
    "KiTS19: <dataset_dir>/case_NNNNN/imaging.nii.gz with segmentation.nii.gz (or <dataset_dir>/data/case_NNNNN/...)"
    " as in github.com/neheller/kits19",
)


@data_component
class KiTS(VolumeSegmentationData):
    """KiTS19 (Kidney Tumor Segmentation challenge 2019): kidney (1) and tumour (2) in contrast-enhanced abdominal
    CT; 1 input channel. Cases without a segmentation (the challenge's test cases) are skipped. KiTS19 stores
    (slices, H, W) with an affine mapping array axis 0 to S/I, so RAS moves the slices last; a file whose affine
    does not (a re-saved copy) is refused, as its slices would not be axial.

    Preprocessing (NACL journal, after Islam and Glocker, 2021: "resampled ... to a common resolution of
    3.22x1.62x1.62 mm and center crop to image size 80x160x160"): RAS, resampling to ``spacing`` (x, y, z), the CT
    ``window`` scaled to [0, 1], an image-centre crop/pad to ``roi_size``. The paper gives no window: [-79, 304] HU
    is nnU-Net's KiTS19 foreground range (Isensee et al., Nat. Methods 2021). Split 150/25/40 (NACL); the 210
    labelled cases of the public release give 147/24/39.

    Citation: Heller N. et al., "The KiTS19 challenge data: 300 kidney tumor cases with clinical context, CT semantic
    segmentations, and surgical outcomes", arXiv:1904.00445, 2019.

    Args:
        dataset_dir: the KiTS19 data folder (``case_NNNNN/`` folders, or their parent); None: preprocessing only.
        others: see ``VolumeSegmentationData``.
        spacing: resampling voxel spacing in mm (x, y, z after RAS orientation).
    """

    source = "kits19"
    facts = DatasetFacts(
        {"0": "background", "1": "kidney", "2": "tumor"}, channel_names=("image",), roi_size=(160, 160, 80)
    )
    preprocessing_args = ("spacing", "window")
    layouts = KITS_LAYOUTS

    roi_size: Sequence[int] = facts.roi_size
    spacing: Sequence[float] | None = (1.62, 1.62, 3.22)
    split: Sequence[int] = (150, 25, 40)
    window: Sequence[float] = (-79.0, 304.0)

    def _read_cases(self, root: Path) -> list[dict]:
        self.root = root / "data" if not any(root.glob("case_*")) and (root / "data").is_dir() else root
        folders = sorted(p for p in self.root.glob("case_*") if p.is_dir())
        if not folders:
            raise self._layout_error(self.root, "has no case_NNNNN folders")
        cases = []
        for folder in folders:
            image, label = folder / "imaging.nii.gz", folder / "segmentation.nii.gz"
            if not image.is_file():
                raise ValueError(f"KiTS19 case folder {folder} has no imaging.nii.gz; restore it or remove the folder")
            if label.is_file():
                self._check_slice_axis(image)
                cases.append({"image": str(image), "label": str(label)})
        if not cases:
            raise self._layout_error(self.root, "has case folders but no segmentation.nii.gz in them")
        logger.info("KiTS19: %d labelled cases in %s", len(cases), self.root)
        return cases

    @staticmethod
    def _check_slice_axis(image) -> None:
        """KiTS19's affine maps array axis 0 (slices) to S/I; without it the "axial" slices would not be axial."""
        codes = nib.aff2axcodes(nib.load(str(image)).affine)
        if codes[0] not in ("S", "I"):
            raise ValueError(
                f"{image} has orientation {''.join(codes)}: KiTS19 stores (slices, H, W) with array axis 0"
                " along S/I, and this affine puts it along another axis, so the training slices would "
                "not be axial; use the original KiTS19 files (github.com/neheller/kits19)"
            )

    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        return [*steps.read_as_ras(), steps.resample(), steps.window(), steps.pad_or_crop()]
