"""Silently wrong volumes with and without a change to the served verdict: per method and condition (in distribution
and each shift at its strongest), how many volumes the flag left off while their estimated DSC exceeds the true one
by more than 0.05, over both seeds (100 volumes on Hippocampus).

Run from the repository root after both ``quality`` studies (commands in README.md):

    python docs/results/skewness/silent.py docs/results/spectrum/hpc/quality docs/results/skewness/hpc/quality
"""

from __future__ import annotations

import csv
import gzip
import sys
from collections import Counter
from pathlib import Path

MARGIN = 0.05


def silent_counts(folder: str) -> tuple[Counter, Counter]:
    """``(silent, volumes)`` per ``(method, condition)`` of a quality study's ``per_volume.csv.gz``."""
    silent, volumes = Counter(), Counter()
    with gzip.open(Path(folder) / "per_volume.csv.gz", "rt", newline="") as f:
        for row in csv.DictReader(f):
            if row["strength"] not in ("strong", "") or row["mean_dice"] in ("", "nan"):
                continue  # the strongest level only; another data set's images have no truth
            key = row["method"], row["condition"]
            volumes[key] += 1
            unflagged = row["flag"] in ("0.0", "False")  # a null flag (cannot judge) says so: not silent
            if unflagged and float(row["est_mean_dice"]) - float(row["mean_dice"]) > MARGIN:
                silent[key] += 1
    return silent, volumes


def main(without: str, with_: str) -> None:
    (before, volumes), (after, _) = silent_counts(without), silent_counts(with_)
    print("| method | images | silently wrong without | silently wrong with |")
    print("|---|---|---|---|")
    for method, condition in sorted(volumes):
        key = method, condition
        print(f"| {method} | {condition} | {before[key]} of {volumes[key]} | {after[key]} of {volumes[key]} |")
    print(
        f"\nSilently wrong: unflagged, and the estimated mean DSC more than {MARGIN} above the true one; both seeds, "
        "each shift at its strongest level."
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
