"""The custom NRRD header fields and segment tags of the Slicer files: a case's quality and review verdict, the
outputs' source, each structure's estimated DSC and volume (Slicer keeps unknown fields)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["quality_fields", "quality_tags", "source_fields"]


def quality_fields(quality: Mapping[str, Any]) -> dict[str, str]:
    """The case's score and review verdict as header fields."""
    review, low = quality.get("review", {}), quality.get("case_score_low")
    flag = review.get("flag")
    return {
        "calib_monai_case_score": f"{float(quality['case_score']):.4f}",
        "calib_monai_case_score_low": "-" if low is None else f"{float(low):.4f}",
        "calib_monai_review": "unknown" if flag is None else ("yes" if flag else "no"),
        "calib_monai_review_reasons": "; ".join(review.get("reasons", [])) or "-",
    }


def source_fields(source: Mapping[str, Any] | None) -> dict[str, str]:
    """The outputs' source (weights, recalibration, validated range: full SHA-256s) as custom NRRD header fields."""
    if not source:
        return {}
    keys = ("weights_sha256", "calibration_sha256", "validated_range_sha256")
    return {f"calib_monai_{key}": str(source.get(key) or "none") for key in keys}


def quality_tags(entry: Mapping[str, Any]) -> str:
    """A structure's estimated DSC and expected volume as Slicer segment tags (``key:value|``)."""
    tags = []
    if entry.get("est_dice") is not None and entry["est_dice"] == entry["est_dice"]:
        tags.append(f"calib_monai.est_dice:{float(entry['est_dice']):.3f}|")
    if entry.get("volume") is not None:
        tags.append(f"calib_monai.volume_ml:{float(entry['volume']):.3g}|")
    return "".join(tags)
