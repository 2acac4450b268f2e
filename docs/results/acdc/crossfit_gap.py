"""How far the validated range's cross-fitted case scores sit from what serving gives the same volumes.

Each validation volume's stored score comes from the recalibration fitted on the other half of the validation
subjects; serving scores every case with the one fitted on all of them. Exchangeability of the range with served
cases is approximate by the size of this gap. Serves each run's validation volumes through ``inference.json``
(``TrainedBundle.predict``, as ``inferring``) and prints, per run and half, the mean served-minus-stored case score.

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


def run_gap(run: Path) -> tuple[str, list[float], list[float]]:
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
    first_half = set(validated["info"]["split"]["folds"][0]["scored"])
    gaps: tuple[list[float], list[float]] = ([], [])
    for item, stored in zip(items, validated["scores"]):
        served = bundle.predict(item["image"]).quality["case_score"]
        gaps[Path(item["image"]).name not in first_half].append(served - stored)
    return method, *gaps


def main(folders: list[str]) -> None:
    print("# Cross-fitted range scores against served scores of the same validation volumes\n")
    print(f"Made by `python docs/results/acdc/crossfit_gap.py {' '.join(folders)}` (ACDC, 8 epochs, 96 x 96).")
    print("Half A: the volumes scored by the recalibration fitted on half B, and the reverse; served: fitted on all.\n")
    print("| runs | run | served - stored, half A (mean, per volume range) | half B | mean abs, all |")
    print("|---|---|---|---|---|")
    for folder in folders:
        for run in sorted(Path(folder).glob("seed*/*_acdc")):
            method, a, b = run_gap(run)
            cells = [f"{np.mean(h):+.3f} ({min(h):+.3f} to {max(h):+.3f})" for h in (a, b)]
            print(f"| {folder} | {run.parent.name} {method} | {cells[0]} | {cells[1]} | {np.mean(np.abs(a + b)):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
