"""How far the validated range's cross-fitted case scores sit from what serving gives the same volumes.

Each validation volume's stored score comes from the recalibration fitted on the other folds of the validation
subjects (2 folds: the other half); serving scores every case with the one fitted on all of them. Exchangeability of
the range with served cases is approximate by the size of this gap. Serves each run's validation volumes through
``inference.json`` (``TrainedBundle.predict``, as ``inferring``) and prints, per run, the mean served-minus-stored
case score, per fold and over all volumes.

    python docs/results/acdc/crossfit_gap.py runs/quality/acdc runs/quality/acdc_split1 \
        > docs/results/acdc/crossfit_gap.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from calib_monai.bundle import TrainedBundle, locate_bundle

OVERRIDES = {"data#resize": [96, 96], "roi_size": [96, 96, -1]}  # the studies' ACDC budget


def run_gap(run: Path) -> tuple[str, list[list[float]]]:
    """The run's method and, per cross-fitting fold, each scored volume's served minus stored case score."""
    models = run / "models"
    method = run.name.removesuffix("_acdc")
    bundle = TrainedBundle(
        locate_bundle(run.name),
        ("inference.json",),
        {**OVERRIDES, "output_dir": str(run / "inference_validation")},
        device="cpu",
        weights=models / "model.pt",
    )
    validated = json.loads((models / "validated_range.json").read_text())
    items = json.loads((models / "datalist.json").read_text())["validation"]
    fold_of = {name: f for f, fold in enumerate(validated["info"]["split"]["folds"]) for name in fold["scored"]}
    gaps: list[list[float]] = [[] for _ in validated["info"]["split"]["folds"]]
    for item, stored in zip(items, validated["scores"]):
        served = bundle.predict(item["image"]).quality["case_score"]
        gaps[fold_of[Path(item["image"]).name]].append(served - stored)
    return method, gaps


def main(*folders: str) -> None:
    print("# Cross-fitted range scores against served scores of the same validation volumes\n")
    print(f"Made by `python docs/results/acdc/crossfit_gap.py {' '.join(folders)}` (ACDC, 8 epochs, 96 x 96).")
    print("Each fold's volumes are scored by the recalibration fitted on the other folds; served: fitted on all.\n")
    print("| runs | run | folds | served - stored: mean (per volume range) | per fold, mean | mean abs |")
    print("|---|---|---|---|---|---|")
    for folder in folders:
        for run in sorted(Path(folder).glob("seed*/*_acdc")):
            method, gaps = run_gap(run)
            every = [g for fold in gaps for g in fold]
            folds = ", ".join(f"{np.mean(fold):+.3f}" for fold in gaps)
            cells = f"{np.mean(every):+.3f} ({min(every):+.3f} to {max(every):+.3f}) | {folds}"
            print(f"| {folder} | {run.parent.name} {method} | {len(gaps)} | {cells} | {np.mean(np.abs(every)):.3f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
