"""The PROMISE12 prostate MRI component (MbLS, Murugesan et al.)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from calib_monai.data import preprocessing as steps
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.helpers import intensity_scaling
from calib_monai.data.layouts import layout_error
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
    four centres; 2 classes (background, prostate), 1 input channel.

    Layout (``PROMISE12_LAYOUTS``): ``CaseNN.mhd`` + ``CaseNN_segmentation.mhd`` anywhere under ``dataset_dir``
    (read by ITK); images without a segmentation (the challenge's test cases) are skipped.

    Preprocessing: RAS orientation; in-plane resampling to ``in_plane_spacing`` mm (the scans range from 0.27 to
    0.75 mm) keeping each scan's slice spacing (2.2-4 mm); intensities scaled to [0, 1] per volume, by default
    between the 0.5th and 99.5th percentiles with clipping, since endorectal-coil scans have a few very bright
    voxels next to the coil that would squeeze plain min-max scaling; centre crop/pad of the slices to ``roi_size``
    (256x256 at 0.625 mm = 160 mm, every slice kept).

    Split: MbLS (Murugesan et al., "Calibrating segmentation networks with margin-based label smoothing", MedIA
    2023) splits the 50 training cases by patient into training/validation/testing, but the counts are lost in the
    text we have; the default (30, 5, 15) keeps the 60/10/30 proportions of the paper's other small data sets.
    Pass the paper's counts as ``split`` if you know them.

    Citation: Litjens G. et al., "Evaluation of prostate segmentation algorithms for MRI: the PROMISE12 challenge",
    Medical Image Analysis 18(2), 2014.

    Args:
        dataset_dir: the PROMISE12 training data folder; None: preprocessing only.
        output_dir, seed, cache_rate, num_workers: see ``VolumeSegmentationData``.
        roi_size: preprocessed size (H, W, D); ``-1`` keeps an axis.
        split: (train, val, test) counts, or their ratios for another number of cases.
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
        intensity_scaling(self.intensity)  # fails early on a bad value
        super().__post_init__()

    def _read_cases(self, root: Path) -> list[dict]:
        self.root = root
        images = sorted(p for p in root.rglob("Case*.mhd") if _PROMISE_CASE.match(p.name))
        labels = [image.with_name(image.stem + "_segmentation.mhd") for image in images]
        cases = [{"image": str(i), "label": str(lb)} for i, lb in zip(images, labels) if lb.is_file()]
        if not cases:
            raise layout_error(
                root, "has no CaseNN.mhd image with a CaseNN_segmentation.mhd beside it", PROMISE12_LAYOUTS
            )
        if len(cases) < len(images):
            logger.info("PROMISE12: skipped %d image(s) without a segmentation", len(images) - len(cases))
        logger.info("PROMISE12: %d labelled cases in %s", len(cases), root)
        return cases

    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        """In-plane resampling to ``in_plane_spacing`` keeping each scan's slice spacing (min/max_pixdim: an axis
        whose spacing lies in [min, max] keeps it; the slice axis always does); off when it is None."""
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
        """The scans at ``path``: ``{"image": scan, "case": <name>}`` for one ``.mhd``/``.mha``/NIfTI file, or
        every such file under a folder (searched recursively: a folder of scans or the release root, test cases
        included), ``*_segmentation.*`` and hidden files skipped."""
        path = Path(path)
        if path.is_file():
            if not _scan_name(path.name) or _scan_name(path.name).endswith("_segmentation"):
                raise ValueError(
                    f"{path} is not a PROMISE12 scan to segment: pass a .mhd/.mha/.nii.gz scan (not a "
                    "*_segmentation.mhd) or a folder of them"
                )
            scans = [path]
        else:
            scans = sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and not p.name.startswith(".")
                and _scan_name(p.name)
                and not _scan_name(p.name).endswith("_segmentation")
            )
        if not scans:
            raise layout_error(
                path, "has no .mhd scan (other than *_segmentation.mhd; searched recursively)", PROMISE12_LAYOUTS
            )
        return [{"image": str(p), "case": _scan_name(p.name)} for p in scans]

    def inference_case(self, image) -> str | None:
        return _scan_name(Path(str(image)).name)
