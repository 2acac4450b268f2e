"""Where a bundle's inference outputs go: the one naming rule of ``<case>_seg.nii.gz``, ``<case>_conf.nii.gz`` and
``<case>_quality.json`` (plus a row of ``quality.csv`` per case). Every output records its source (the SHA-256s of
the weights, recalibration and range); a folder of another source's results is refused (:func:`check_output_folder`).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from calib_monai.atomic import write_text_durably

from .records import short_sha

__all__ = [
    "CONTOUR_POSTFIXES",
    "OUTPUT_EXT",
    "OUTPUT_KEYS",
    "OUTPUT_POSTFIXES",
    "QUALITY_TABLE",
    "OutputFiles",
    "OutputWriter",
    "Prediction",
    "SOURCE_KEY",
    "SOURCE_META",
    "check_output_folder",
    "source_descrip",
    "output_case",
    "output_path",
    "output_paths",
    "quality_path",
    "quality_row",
    "write_case_quality",
]

OUTPUT_KEYS = ("segmentation", "confidence")  # the item keys of the two outputs (``ConfidenceAndSegmentationd``)
OUTPUT_POSTFIXES = {"segmentation": "seg", "confidence": "conf"}  # <case>_<postfix><ext>
#: the contours (calib_monai.review.ContourMarginsd): <case>_inner.nii.gz, <case>_outer.nii.gz, uint8, 4D (one volume
#: per foreground class, in label order; a single structure: 3D)
CONTOUR_POSTFIXES = {"contour_inner": "inner", "contour_outer": "outer"}
OUTPUT_EXT = ".nii.gz"
QUALITY_POSTFIX = "quality.json"  # <case>_quality.json
QUALITY_TABLE = "quality.csv"  # one row per case of the folder
SOURCE_META = "calib_monai_source"  # the meta data key of an output image's source (written to the header)
SOURCE_KEY = "calib_monai_source"  # the item key of the outputs' source (CalibrateLogitsd -> the output writers)
SOURCE_COLUMNS = {"weights_sha256": "weights", "calibration_sha256": "calibration", "validated_range_sha256": "range"}


def source_descrip(source: Mapping[str, Any] | None) -> str:
    """The source in 80 bytes (the NIfTI ``descrip``): ``calib_monai w=<12 hex> c=<12 hex|none> r=<...|none>``, and
    `` site=ALARM`` once the deployment's site monitor has alarmed (``source["site_alarm"]``)."""
    if not source:
        return ""
    parts = [f"{key}={short_sha(source.get(name)) or 'none'}" for name, key in zip(SOURCE_COLUMNS, "wcr")]
    return "calib_monai " + " ".join(parts) + (" site=ALARM" if source.get("site_alarm") else "")


def _source_of_row(row: Mapping[str, Any]) -> tuple:
    return tuple(row.get(column) or "" for column in SOURCE_COLUMNS.values())


def check_output_folder(output_dir: str | os.PathLike, source: Mapping[str, Any] | None) -> None:
    """A ``ValueError`` naming the folder and the fix when its ``quality.csv`` holds rows of another (or no) source."""
    table = Path(output_dir) / QUALITY_TABLE
    if not table.is_file():
        return
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    mine = _source_of_row({c: short_sha((source or {}).get(k)) for k, c in SOURCE_COLUMNS.items()})
    others = sorted({_source_of_row(r) for r in rows} - {mine})
    if others:
        names = ", ".join("/".join(v or "-" for v in other) for other in others[:3])
        raise ValueError(
            f"{output_dir} holds results of another model ({table} rows by weights/calibration/range {names}; this "
            f"run: {'/'.join(v or '-' for v in mine)}): pass a new --output_dir, or delete {output_dir}"
        )


class OutputWriter:
    """Marks a postprocessing transform that writes files: ``TrainedBundle.predict`` leaves it out."""


class _Outputs(NamedTuple):
    segmentation: Any  # (1, *spatial) uint8 MetaTensor on the input's grid
    confidence: Any  # (1, *spatial) float32 MetaTensor, the max softmax probability
    quality: dict | None = None  # case quality and review flag (calib_monai.review.CaseQualityd), if configured


class Prediction(_Outputs):
    """One case segmented in memory (``TrainedBundle.predict``), unpacking as ``(segmentation, confidence, quality)``;
    ``contours``: ``{"inner", "outer"}``, ``(C - 1, *spatial)`` uint8 MetaTensors on the input's grid, or None when
    no contour set applies."""

    contours: dict | None = None

    def __new__(cls, segmentation: Any, confidence: Any, quality: dict | None = None, contours: dict | None = None):
        self = super().__new__(cls, segmentation, confidence, quality)
        self.contours = contours
        return self


class OutputFiles(NamedTuple):
    """The output files of one case (``None`` for one that was not written)."""

    segmentation: Path | None  # <case>_seg.nii.gz: uint8 label values on the input's grid
    confidence: Path | None  # <case>_conf.nii.gz: float32 max softmax probability on the input's grid
    quality: Path | None = None  # <case>_quality.json: case quality and review flag
    inner: Path | None = None  # <case>_inner.nii.gz: each structure's inner contour (uint8, 4D: one per structure)
    outer: Path | None = None  # <case>_outer.nii.gz: each structure's outer contour


def output_path(output_dir: str | os.PathLike, case: str, key: str, ext: str = OUTPUT_EXT) -> Path:
    """``<output_dir>/<case>_<postfix><ext>`` of the output ``key`` (``OUTPUT_POSTFIXES``, ``CONTOUR_POSTFIXES``)."""
    postfix = {**OUTPUT_POSTFIXES, **CONTOUR_POSTFIXES}[key]
    return Path(output_dir) / f"{case}_{postfix}{ext}"


def output_paths(output_dir: str | os.PathLike, case: str) -> OutputFiles:
    """The output files of ``case`` in ``output_dir`` (the contours are written only with a contour set)."""
    images = (output_path(output_dir, case, key) for key in (*OUTPUT_KEYS, *CONTOUR_POSTFIXES))
    segmentation, confidence, inner, outer = images
    return OutputFiles(segmentation, confidence, quality_path(output_dir, case), inner, outer)


def output_case(meta: Mapping) -> str:
    """The ``<case>`` of an output: ``CaseNamed``'s ``"case_name"``, else the input file's name, no extension."""
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
        "case_score_low": quality.get("case_score_low"),  # the true DSC's lower bound (review.anchor), or empty
        "review": "" if flag is None else ("yes" if flag else "no"),
        "reasons": "; ".join(review.get("reasons", [])),
    }
    source = quality.get("source") or {}
    row.update({column: short_sha(source.get(key)) for key, column in SOURCE_COLUMNS.items()})
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
    contours = quality.get("contours") or {}
    for name, values in (contours.get("classes") or {}).items():
        row.update({f"{kind}_ml_{name}": values[f"{kind}_ml"] for kind in ("inner", "outer")})
    return row


def write_case_quality(output_dir: str | os.PathLike, case: str, quality: Mapping[str, Any]) -> Path:
    """Write ``<case>_quality.json`` and the case's row of ``<output_dir>/quality.csv``, durably; returns the JSON."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    check_output_folder(folder, quality.get("source"))
    path = quality_path(folder, case)
    write_text_durably(path, json.dumps({"case": case, **quality}, indent=2, default=str) + "\n")
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
    write_text_durably(table, buffer.getvalue())
    return path
