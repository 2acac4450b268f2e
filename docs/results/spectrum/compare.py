"""The served verdict with and without the spectrum roughness statistic, on the same trained networks: flag rates and
the mean optimism left unflagged, per method, in distribution and under each strong site shift.

Run from the repository root after both ``quality`` studies (commands in README.md):

    python docs/results/spectrum/compare.py docs/results/spectrum/acdc_without/quality \
        docs/results/spectrum/acdc/quality > docs/results/spectrum/acdc.md
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from pathlib import Path


def _rows(folder: str) -> dict[tuple[str, str], list[dict]]:
    """per_seed.csv's rows by (method, condition with its strength)."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    with open(Path(folder) / "per_seed.csv", newline="") as f:
        for row in csv.DictReader(f):
            name = row["condition"] + (f" ({row['strength']})" if row["strength"] else "")
            out[row["method"], name].append(row)
    return out


def _mean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _cell(rows: list[dict], key: str, digits: int = 2, signed: bool = False) -> str:
    values = [float(r[key]) for r in rows]
    text = f"{{:{'+' if signed else ''}.{digits}f}}"
    show = [("n/a" if math.isnan(v) else text.format(v)) for v in values]
    mean = _mean(values)
    return f"{'n/a' if math.isnan(mean) else text.format(mean)} ({', '.join(show)})"


def main(without: str, with_spectrum: str) -> None:
    before, after = _rows(without), _rows(with_spectrum)
    print("| method | images | flagged without | flagged with | unflagged optimism without | unflagged optimism with |")
    print("|---|---|---|---|---|---|")
    for key in after:
        method, images = key
        if images != "in-distribution" and "strong" not in images and "images" not in images:
            continue
        old, new = before.get(key, []), after[key]
        rate = "subject_flag_rate" if images == "in-distribution" else "flag_rate"
        print(
            f"| {method} | {images}{' (by subject)' if rate == 'subject_flag_rate' else ''} "
            f"| {_cell(old, rate) if old else '-'} | {_cell(new, rate)} "
            f"| {_cell(old, 'signed_error_unflagged', 3, True) if old else '-'} "
            f"| {_cell(new, 'signed_error_unflagged', 3, True)} |"
        )
    print("\nMean over the seeds (each seed's value); optimism: the mean estimated DSC minus the true one over the")
    print("volumes the flag left off (n/a: every volume flagged, or no truth for another data set's images).")


if __name__ == "__main__":
    main(*sys.argv[1:3])
