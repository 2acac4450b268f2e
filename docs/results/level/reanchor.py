"""What re-anchoring the served case score by the validation volumes' mean error does to its level (issue 47).

For each run of a site study: the mean of ``info.case_score_error.per_volume`` over the range's validation volumes
(each scored by a recalibration it did not fit, against its label on the network grid; what ``calibrate`` stores
and the served answer now subtracts), and, per condition of the study's served volumes (``per_volume.csv.gz``: the
raw served case score and the true mean DSC of the delivered segmentation on the input grid), the mean estimate
minus the truth, its mean absolute value, and the share of unflagged volumes answered more than 0.03 above the
truth, before and after subtracting.

    python docs/results/level/reanchor.py RUNS_DIR STUDY_DIR DATASET

RUNS_DIR: the study's ``--runs_dir`` (``seed<k>/<method>_<dataset>/models/validated_range.json``); STUDY_DIR: its
``quality`` results (``per_volume.csv.gz``)."""

from __future__ import annotations

import csv
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

OPTIMISM = 0.03  # issue 47's "no silent optimism": more than this above the truth, unflagged


def validation_offset(validated_range: Path) -> float:
    """Minus the mean error of the range's validation volumes that are not site volumes (as the served answer)."""
    info = json.loads(validated_range.read_text())["info"]
    site = set(info.get("site_volumes") or [])
    error = info["case_score_error"]
    per_volume = error.get("per_volume", error.get("values"))  # a range from before per_volume: none was NaN
    errors = [e for i, e in enumerate(per_volume) if e is not None and i not in site]
    return -float(np.mean(errors))


def summary(errors: np.ndarray, unflagged: np.ndarray) -> str:
    optimistic = f"{np.mean(errors[unflagged] > OPTIMISM):.2f}" if unflagged.any() else "none unflagged"
    return f"{errors.mean():+.3f} | {np.abs(errors).mean():.3f} | {optimistic}"


def main(runs: Path, study: Path, dataset: str) -> None:
    groups = defaultdict(list)
    with gzip.open(study / "per_volume.csv.gz", "rt") as f:
        for row in csv.DictReader(f):
            groups[(row["method"], int(row["seed"]), row["condition"], row["strength"])].append(row)
    print(
        "| method | seed | condition | strength | volumes | offset | before: mean error | MAE | unflagged > +0.03 "
        "| after: mean error | MAE | unflagged > +0.03 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    pooled = defaultdict(lambda: [[], [], []])
    for (method, seed, condition, strength), rows in sorted(groups.items(), key=lambda kv: (kv[0][2], kv[0][3])):
        offset = validation_offset(runs / f"seed{seed}" / f"{method}_{dataset}" / "models" / "validated_range.json")
        for r in rows:  # the raw served score (records served before the level was subtracted hold it alone)
            r["est_mean_dice"] = r.get("raw_case_score") or r["est_mean_dice"]
        kept = [r for r in rows if r["est_mean_dice"] not in ("", "nan") and r["mean_dice"] not in ("", "nan")]
        if not kept:  # the other data set's images: no label of these structures
            continue
        raw = np.array([float(r["est_mean_dice"]) for r in kept])
        truth = np.array([float(r["mean_dice"]) for r in kept])
        unflagged = np.array([r["flag"] in ("0.0", "0", "False", "") for r in kept])
        before, after = raw - truth, np.clip(raw + offset, 0.0, 1.0) - truth
        print(
            f"| {method} | {seed} | {condition} | {strength} | {len(kept)} | {offset:+.3f} | "
            f"{summary(before, unflagged)} | {summary(after, unflagged)} |"
        )
        for i, part in enumerate((before, after, unflagged)):
            pooled[condition][i].append(part)
    print(
        "\n| condition | volumes | before: mean error | MAE | unflagged > +0.03 | after: mean error | MAE | "
        "unflagged > +0.03 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for condition, (before, after, unflagged) in sorted(pooled.items()):
        before, after, unflagged = (np.concatenate(p) for p in (before, after, unflagged))
        print(f"| {condition} | {len(before)} | {summary(before, unflagged)} | {summary(after, unflagged)} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
