"""What a run folder's files say of each other on their own, for a folder without ``manifest.json``: ``calibration.pt``
records the weights' SHA-256, ``validated_range.json`` those of the weights and of the recalibration it was measured
with. Nothing is assumed of a record that is not there."""

from __future__ import annotations

import json
from pathlib import Path

from .weights import read_weights_file

__all__ = ["record_disagreements", "short_sha"]


def short_sha(sha: str | None) -> str:
    """The first 12 hex digits (``""`` for None): enough to tell runs apart in a table or a header."""
    return sha[:12] if sha else ""


def _named(sha: str | None) -> str:
    return f"sha256 {short_sha(sha)}" if sha else "none"


def record_disagreements(
    weights: Path, weights_sha: str | None, present: dict[str, Path], shas: dict[str, str]
) -> list[str]:
    """Where the records of ``present`` (``{"calibration.pt": path, ...}``, hashed in ``shas``) fail to name the
    weights (``weights_sha``; None: no weights file to compare with) and each other, in words; [] when they do."""
    problems = []
    calibration = present.get("calibration.pt")
    if calibration is not None:
        fix = "delete it and run the bundle's calibrate step again"
        record = read_weights_file(calibration, what="a calibration file of calib_monai", fix=fix)
        fitted_for = record.get("weights_sha256") if isinstance(record, dict) else None
        if weights_sha is not None and fitted_for != weights_sha:
            problems.append(
                f"{calibration} was fitted for the weights {_named(fitted_for)}, {weights} is {_named(weights_sha)}"
            )
    range_path = present.get("validated_range.json")
    if range_path is None:
        return problems
    try:
        record = json.loads(range_path.read_text())
    except (ValueError, UnicodeDecodeError):
        return [*problems, f"{range_path} is not valid JSON"]
    record = record if isinstance(record, dict) else {}
    if weights_sha is not None and record.get("weights_sha256") != weights_sha:
        measured = _named(record.get("weights_sha256"))
        problems.append(f"{range_path} was measured with the weights {measured}, {weights} is {_named(weights_sha)}")
    if "calibration_sha256" not in record:
        problems.append(f"{range_path} does not record the recalibration it was measured with")
    elif record["calibration_sha256"] != shas.get("calibration.pt"):
        beside = _named(shas.get("calibration.pt")) if calibration is not None else "none is there"
        problems.append(
            f"{range_path} was measured with the recalibration {_named(record['calibration_sha256'])}, "
            f"calibration.pt: {beside}"
        )
    return problems
