"""The PROMISE12 prostate MRI component (MbLS, Murugesan et al.)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from calib_monai.data import preprocessing as steps
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.volumes import VolumeSegmentationData, data_component

__all__ = ["PROMISE12", "PROMISE12_LAYOUTS"]

logger = logging.getLogger("calib_monai.data")

PROMISE12_LAYOUTS = (
    "PROMISE12: <dataset_dir>/**/CaseNN.mhd with CaseNN_segmentation.mhd beside it (MetaImage, .raw/.zraw data "
    "files), e.g. TrainingData_Part1/ ... TrainingData_Part3/ as downloaded",
)
_PROMISE_CASE = re.compile(r"^Case\d+\.mhd$")


_SCAN_SUFFIXES = (".mhd", ".mha", ".nii.gz", ".nii")


def _scan_name(name: str) -> str | None:
    """``name`` without its image extension, or None when it is not a scan (e.g. a ``.raw`` data file)."""
    return next((name[: -len(s)] for s in _SCAN_SUFFIXES if name.lower().endswith(s) and len(name) > len(s)), None)


@data_component
class PROMISE12(VolumeSegmentationData):
    """PROMISE12 (MICCAI 2012 prostate MR segmentation challenge): the prostate in transversal T2-weighted MRI from
    four centres; 1 input channel. Images without a segmentation (the challenge's test cases) are skipped.

    Preprocessing: RAS; in-plane resampling to ``in_plane_spacing`` mm keeping each scan's slice spacing; scaling to
    [0, 1] per volume, by default between the 0.5th and 99.5th percentiles (endorectal-coil scans have a few very
    bright voxels that would squeeze min-max scaling); centre crop/pad of the slices to ``roi_size``.

    Split: MbLS (Murugesan et al., MedIA 2023) splits the 50 training cases by patient without counts in the text we
    have; the default (30, 5, 15) keeps the 60/10/30 proportions of its other small data sets.

    Citation: Litjens G. et al., "Evaluation of prostate segmentation algorithms for MRI: the PROMISE12 challenge",
    Medical Image Analysis 18(2), 2014.

    Args:
        dataset_dir: the PROMISE12 training data folder; None: preprocessing only.
        others: see ``VolumeSegmentationData``.
        in_plane_spacing: in-plane voxel size (mm) to resample to, or None to keep each scan's.
        intensity: "percentile" (default), "minmax" or a (low, high) window.
    """

    source = "promise12"
    facts = DatasetFacts({"0": "background", "1": "prostate"}, channel_names=("image",), roi_size=(256, 256, -1))
    preprocessing_args = ("in_plane_spacing", "intensity")
    layouts = PROMISE12_LAYOUTS

    roi_size: Sequence[int] = facts.roi_size
    split: Sequence[int] = (30, 5, 15)
    in_plane_spacing: float | None = 0.625
    intensity: str | Sequence[float] = "percentile"

    def __post_init__(self) -> None:
        if self.in_plane_spacing is not None and float(self.in_plane_spacing) <= 0:
            raise ValueError(f"in_plane_spacing must be a positive size in mm or None, got {self.in_plane_spacing}")
        super().__post_init__()

    def _read_cases(self, root: Path) -> list[dict]:
        images = sorted(p for p in root.rglob("Case*.mhd") if _PROMISE_CASE.match(p.name))
        labels = [image.with_name(image.stem + "_segmentation.mhd") for image in images]
        cases = [{"image": str(i), "label": str(lb)} for i, lb in zip(images, labels) if lb.is_file()]
        if not cases:
            raise self._layout_error(root, "has no CaseNN.mhd image with a CaseNN_segmentation.mhd beside it")
        if len(cases) < len(images):
            logger.info("PROMISE12: skipped %d image(s) without a segmentation", len(images) - len(cases))
        logger.info("PROMISE12: %d labelled cases in %s", len(cases), root)
        return cases

    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        """min/max_pixdim: an axis whose spacing lies in [min, max] keeps it; the slice axis always does."""
        in_plane = "@data.in_plane_spacing"
        return [
            *steps.read_as_ras(),
            {
                **steps.resample(),
                "pixdim": f"$[float({in_plane})] * 2 + [1.0]",
                "min_pixdim": f"$[float({in_plane})] * 2 + [1e-6]",
                "max_pixdim": f"$[float({in_plane})] * 2 + [1e6]",
                "_disabled_": f"${in_plane} is None",
            },
            steps.scale_to_unit(),
            steps.pad_or_crop(),
        ]

    def inference_items(self, path: Path) -> list[dict]:
        """``{"image": scan, "case": <name>}`` for one ``.mhd``/``.mha``/NIfTI scan, or every scan under a folder
        (searched recursively, ``*_segmentation.*`` and hidden files skipped)."""
        scans = self._input_files(
            Path(path),
            lambda p: bool(_scan_name(p.name)) and not _scan_name(p.name).endswith("_segmentation"),
            "a PROMISE12 scan to segment: pass a .mhd/.mha/.nii.gz scan (not a *_segmentation.mhd) or a folder of them",
            "has no .mhd scan (other than *_segmentation.mhd; searched recursively)",
        )
        return [{"image": str(p), "case": _scan_name(p.name)} for p in scans]

    def inference_case(self, image) -> str | None:
        return _scan_name(Path(str(image)).name)
