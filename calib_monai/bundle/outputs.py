"""Where a bundle's inference outputs go: the one naming rule of ``<case>_seg.nii.gz`` and ``<case>_conf.nii.gz``.

The bundle's ``inferring`` run (``calib_monai.data.segmentation_and_confidence``), ``TrainedBundle.write``, MONAI Label
serving and the 3D Slicer files (``calib_monai.export.slicer``) all name and find the files through here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

__all__ = ["OUTPUT_EXT", "OUTPUT_KEYS", "OUTPUT_POSTFIXES", "OutputFiles", "output_case", "output_path", "output_paths"]

OUTPUT_KEYS = ("segmentation", "confidence")  # the item keys of the two outputs (``ConfidenceAndSegmentationd``)
OUTPUT_POSTFIXES = {"segmentation": "seg", "confidence": "conf"}  # <case>_<postfix><ext>
OUTPUT_EXT = ".nii.gz"


class OutputFiles(NamedTuple):
    """The two output files of one case (``None`` for one that was not written)."""

    segmentation: Path | None  # <case>_seg.nii.gz: uint8 label values on the input's grid
    confidence: Path | None  # <case>_conf.nii.gz: float32 max softmax probability on the input's grid


def output_path(output_dir: str | os.PathLike, case: str, key: str, ext: str = OUTPUT_EXT) -> Path:
    """``<output_dir>/<case>_<postfix><ext>`` of the output ``key`` ("segmentation" or "confidence")."""
    if key not in OUTPUT_POSTFIXES:
        raise KeyError(f"unknown output {key!r}: expected one of {list(OUTPUT_POSTFIXES)}")
    return Path(output_dir) / f"{case}_{OUTPUT_POSTFIXES[key]}{ext}"


def output_paths(output_dir: str | os.PathLike, case: str) -> OutputFiles:
    """Both output files of ``case`` in ``output_dir`` (what an ``inferring`` run writes there)."""
    return OutputFiles(*(output_path(output_dir, case, key) for key in OUTPUT_KEYS))


def output_case(meta: Mapping) -> str:
    """The ``<case>`` of an output from its meta data: the ``"case_name"`` that ``CaseNamed`` recorded (the item's
    ``"case"``), else the input file's name without its extension (``.nii.gz`` counts as one), as MONAI's
    ``SaveImage`` names a file after its input."""
    if meta.get("case_name"):
        return str(meta["case_name"])
    source = meta.get("filename_or_obj")
    if isinstance(source, (list, tuple)):  # several input files per case (BraTS modalities): the first names it
        source = source[0] if source else None
    if not source:
        raise ValueError("the output has no case name and no source file in its meta data: pass case=...")
    name, ext = os.path.splitext(os.path.basename(str(source)))
    return os.path.splitext(name)[0] if ext == ".gz" else name
