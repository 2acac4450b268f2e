"""The offline comparison behind the shading statistics: how many strongly shaded images each way of counting the
image statistics flags, at the false-flag rate that leaves 96% of ordinary images unflagged.

    python docs/results/shading/offline.py hpc > docs/results/shading/offline_hpc.md
    python docs/results/shading/offline.py acdc > docs/results/shading/offline_acdc.md

Raw frames (not the served chain), min-max scaled as the bundles scale them: Hippocampus 150 training images and
110 others (ACDC: 140 and 60 frames), the others also under each site shift at its strongest (seeded by index).
Each way standardises its statistics by the training images' mean and spread and takes a Mahalanobis distance under
their Ledoit-Wolf precision; "intensity" is the 12 statistics before the shading ones (mean, spread, skewness, and
sharpness, roughness and spectrum roughness along each axis), "shading" the 6 slopes and curvatures."""

from __future__ import annotations

import glob
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
from scipy.stats import chi2

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository

from calib_monai.data.site_shift import apply_site_shift  # noqa: E402
from calib_monai.metrics.feature_distance import ledoit_wolf_precision, mahalanobis  # noqa: E402
from calib_monai.metrics.image_statistics import image_statistics  # noqa: E402

DATA = {
    "hpc": ("../shared/data/Task04_Hippocampus/imagesTr/*.nii.gz", 150, 110),
    "acdc": ("../shared/data/ACDC/database/training/*/*_frame??.nii.gz", 140, 60),
}
CONDITIONS = {"ordinary": None, "bias field": "bias_field", "gamma": "gamma", "spike": "spike"}
INTENSITY, SHADING, SLOPES = slice(0, 12), slice(12, 18), slice(12, 15)


def statistics(path: str, kind: str | None, seed: int) -> np.ndarray:
    x = torch.as_tensor(np.asarray(nib.load(path).dataobj, dtype=np.float32))[None]
    x = apply_site_shift(x, kind, "strong", seed=seed) if kind else x
    return np.asarray(image_statistics((x - x.min()) / (x.max() - x.min())))


def distances(train: np.ndarray, rows: dict, columns: slice) -> dict:
    mean, spread = train[:, columns].mean(0), np.maximum(train[:, columns].std(0), 1e-12)
    precision = ledoit_wolf_precision((train[:, columns] - mean) / spread)
    return {c: mahalanobis((r[:, columns] - mean) / spread, precision) for c, r in rows.items()}


def main(dataset: str) -> None:
    pattern, n_train, n_other = DATA[dataset]
    files = sorted(glob.glob(pattern))
    np.random.default_rng(0).shuffle(files)
    train = np.stack([statistics(f, None, 0) for f in files[:n_train]])
    rows = {
        c: np.stack([statistics(f, kind, i) for i, f in enumerate(files[n_train : n_train + n_other])])
        for c, kind in CONDITIONS.items()
    }
    ways = {
        "intensity statistics together (before)": distances(train, rows, INTENSITY),
        "intensity and shading statistics together": distances(train, rows, slice(0, 18)),
        "shading statistics alone": distances(train, rows, SHADING),
    }
    alone = ways["intensity statistics together (before)"]
    shading = ways["shading statistics alone"]
    slopes = distances(train, rows, slice(0, 15))
    ways["intensity and slopes together (no curvature)"] = slopes
    ways["the larger of the two groups' distances (built)"] = {c: np.maximum(alone[c], shading[c]) for c in rows}
    ways["the larger of the groups' chi-square tails (12, 6 dof)"] = {
        c: -np.minimum(chi2.logsf(alone[c] ** 2, 12), chi2.logsf(shading[c] ** 2, 6)) for c in rows
    }
    print(
        f"{dataset}: {n_train} training images, {n_other} others; share flagged at the ordinary images' 96th percentile"
    )
    print()
    print("| counted | " + " | ".join(c for c in CONDITIONS if c != "ordinary") + " |")
    print("|---|" + "---|" * (len(CONDITIONS) - 1))
    for name, d in ways.items():
        threshold = np.quantile(d["ordinary"], 0.96)
        cells = [f"{np.mean(d[c] > threshold):.0%}" for c in CONDITIONS if c != "ordinary"]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
