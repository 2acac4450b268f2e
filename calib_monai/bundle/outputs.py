"""Where a bundle's inference outputs go: the one naming rule of ``<case>_seg.nii.gz``, ``<case>_conf.nii.gz`` and
``<case>_quality.json`` (the case quality and review flag; every case of a run also gets a row of ``quality.csv``).

The bundle's ``inferring`` run (``calib_monai.data.segmentation_and_confidence``), ``TrainedBundle.write``, MONAI Label
serving and the 3D Slicer files (``calib_monai.export.slicer``) all name and find the files through here.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from calib_monai.atomic import write_json_atomically, write_text_atomically

__all__ = [
    "OUTPUT_EXT",
    "OUTPUT_KEYS",
    "OUTPUT_POSTFIXES",
    "QUALITY_TABLE",
    "OutputFiles",
    "OutputWriter",
    "Prediction",
    "output_case",
    "output_path",
    "output_paths",
    "quality_path",
    "quality_row",
    "write_case_quality",
]

OUTPUT_KEYS = ("segmentation", "confidence")  # the item keys of the two outputs (``ConfidenceAndSegmentationd``)
OUTPUT_POSTFIXES = {"segmentation": "seg", "confidence": "conf"}  # <case>_<postfix><ext>
OUTPUT_EXT = ".nii.gz"
QUALITY_POSTFIX = "quality.json"  # <case>_quality.json
QUALITY_TABLE = "quality.csv"  # one row per case of the folder


class OutputWriter:
    """Marks a postprocessing transform that writes files: ``TrainedBundle.predict`` leaves it out (outputs stay in
    memory), the ``inferring`` run keeps it."""


class Prediction(NamedTuple):
    """One case segmented in memory (``TrainedBundle.predict``)."""

    segmentation: Any  # (1, *spatial) uint8 MetaTensor on the input's grid
    confidence: Any  # (1, *spatial) float32 MetaTensor, the max softmax probability
    quality: dict | None = None  # case quality and review flag (calib_monai.calibration.CaseQualityd), if configured


class OutputFiles(NamedTuple):
    """The two output files of one case (``None`` for one that was not written)."""

    segmentation: Path | None  # <case>_seg.nii.gz: uint8 label values on the input's grid
    confidence: Path | None  # <case>_conf.nii.gz: float32 max softmax probability on the input's grid
    quality: Path | None = None  # <case>_quality.json: case quality and review flag


def output_path(output_dir: str | os.PathLike, case: str, key: str, ext: str = OUTPUT_EXT) -> Path:
    """``<output_dir>/<case>_<postfix><ext>`` of the output ``key`` ("segmentation" or "confidence")."""
    if key not in OUTPUT_POSTFIXES:
        raise KeyError(f"unknown output {key!r}: expected one of {list(OUTPUT_POSTFIXES)}")
    return Path(output_dir) / f"{case}_{OUTPUT_POSTFIXES[key]}{ext}"


def output_paths(output_dir: str | os.PathLike, case: str) -> OutputFiles:
    """The output files of ``case`` in ``output_dir`` (what an ``inferring`` run writes there)."""
    return OutputFiles(*(output_path(output_dir, case, key) for key in OUTPUT_KEYS), quality_path(output_dir, case))


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


def quality_path(output_dir: str | os.PathLike, case: str) -> Path:
    """``<output_dir>/<case>_quality.json``."""
    return Path(output_dir) / f"{case}_{QUALITY_POSTFIX}"


def quality_row(case: str, quality: Mapping[str, Any]) -> dict[str, Any]:
    """The ``quality.csv`` row of one case: the case score and review flag first, then per class."""
    review = quality.get("review", {})
    flag = review.get("flag")
    row: dict[str, Any] = {
        "case": case,
        "case_score": quality["case_score"],
        "review": "" if flag is None else ("yes" if flag else "no"),
        "reasons": "; ".join(review.get("reasons", [])),
    }
    names = {
        "est_dice": "est_dice",
        "volume": "volume_ml",
        "volume_low": "volume_ml_low",
        "volume_high": "volume_ml_high",
        "volume_predicted": "predicted_volume_ml",
        "low_confidence_fraction": "low_confidence",
    }
    for name, values in quality["classes"].items():
        row.update({f"{column}_{name}": values[key] for key, column in names.items()})
    return row


def write_case_quality(output_dir: str | os.PathLike, case: str, quality: Mapping[str, Any]) -> Path:
    """Write ``<case>_quality.json`` and put the case's row into ``<output_dir>/quality.csv`` (replacing an earlier
    row of the same case), each atomically; returns the JSON's path."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = quality_path(folder, case)
    write_json_atomically(path, {"case": case, **quality})
    table = folder / QUALITY_TABLE
    rows = []
    if table.is_file():
        with open(table, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("case") != case]
    rows.append(quality_row(case, quality))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomically(table, buffer.getvalue())
    return path
