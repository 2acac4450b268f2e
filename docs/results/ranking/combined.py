"""Does a combination of the served signals rank ordinary cases better than the case score alone? Per run of a
quality study, the Spearman correlation with the true DSC over the in-distribution test volumes of the case score,
and of rank sums that add the feature signal's z-score (against: a case unlike the training images ranks lower) or
the mean confidence; the mean and the lowest over the study's runs.

    python docs/results/ranking/combined.py docs/results/shading/hpc/quality docs/results/shading/hpc_split1/quality \\
        docs/results/shading/acdc/quality > docs/results/ranking/combined.md
"""

from __future__ import annotations

import csv
import gzip
import sys
from pathlib import Path

import numpy as np
from scipy.stats import rankdata, spearmanr

SCORES = {
    "case score": lambda c: rankdata(c["est_mean_dice"]),
    "case score - 0.25 features": lambda c: rankdata(c["est_mean_dice"]) - 0.25 * rankdata(c["z_features"]),
    "case score - 0.5 features": lambda c: rankdata(c["est_mean_dice"]) - 0.5 * rankdata(c["z_features"]),
    "case score + mean confidence": lambda c: rankdata(c["est_mean_dice"]) + rankdata(c["mean_confidence"]),
    "mean confidence": lambda c: rankdata(c["mean_confidence"]),
}


def main(studies: list[str]) -> None:
    print("| study | runs | " + " | ".join(SCORES) + " |")
    print("|---|---|" + "---|" * len(SCORES))
    for study in studies:
        rows = [r for r in csv.DictReader(gzip.open(Path(study) / "per_volume.csv.gz", "rt"))]
        runs: dict = {}
        for r in rows:
            if r["condition"] == "in-distribution":
                runs.setdefault((r["method"], r["seed"]), []).append(r)
        values = []
        for run in runs.values():
            columns = {
                k: np.array([float(r[k]) for r in run]) for k in ("est_mean_dice", "mean_confidence", "z_features")
            }
            truth = np.array([float(r["mean_dice"]) for r in run])
            values.append([spearmanr(score(columns), truth).correlation for score in SCORES.values()])
        values = np.array(values)
        cells = [f"{m:.2f} ({lo:+.2f})" for m, lo in zip(values.mean(0), values.min(0))]
        print(f"| {study} | {len(values)} | " + " | ".join(cells) + " |")
    print()
    print("Spearman with the true DSC: mean over the runs (the lowest run).")


if __name__ == "__main__":
    main(sys.argv[1:])
