"""Could the validation volumes correct the served estimate's level? For each run of a quality study: the mean of
(stored cross-fitted case score - true DSC) over the range's validation volumes (what ``calibrate`` could subtract),
beside the same mean over the in-distribution test volumes (the study's ``per_seed.csv``), and what is left after
subtracting the first from the second.

    python docs/results/level/level.py RUNS_DIR STUDY_DIR DATASET [OVERRIDES_JSON]

RUNS_DIR: the study's ``--runs_dir`` (``seed<k>/<method>_<dataset>/models``); STUDY_DIR: its ``quality`` results."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: studies/ is not installed

from calib_monai.bundle import TrainedBundle, locate_bundle, read_bundle_config  # noqa: E402
from studies.quality import served_record  # noqa: E402


def main(runs: Path, study: Path, dataset: str, overrides: dict) -> None:
    test = {
        (row["method"], int(row["seed"])): float(row["signed_error"])
        for row in csv.DictReader(open(study / "per_seed.csv"))
        if row["condition"] == "in-distribution"
    }
    print("| method | seed | validation: score - true DSC, mean (median) | test: the same | test after subtracting |")
    print("|---|---|---|---|---|")
    for (method, seed), test_error in sorted(test.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        models = runs / f"seed{seed}" / f"{method}_{dataset}" / "models"
        stored = json.loads((models / "validated_range.json").read_text())
        items = json.loads((models / "datalist.json").read_text())["validation"]
        by_name = {Path(i["image"] if isinstance(i["image"], str) else i["image"][0]).name: i for i in items}
        bundle_dir = locate_bundle(f"{method}_{dataset}")
        known = read_bundle_config(bundle_dir, ("inference.json",), {}).get()
        kept = {k: v for k, v in overrides.items() if k.split("#")[0] in known}
        bundle = TrainedBundle(
            bundle_dir,
            ("inference.json",),
            {**kept, "output_dir": str(models.parent / "inference")},
            device="cpu",
            weights=models / "model.pt",
        )
        # the argmax, so the true DSC, does not depend on which fold's temperatures scored the volume
        true = [served_record(bundle, by_name[n], {})["mean_dice"] for n in stored["info"]["split"]["range_volumes"]]
        error = np.asarray(stored["scores"]) - np.asarray(true)
        print(
            f"| {method} | {seed} | {error.mean():+.4f} ({np.median(error):+.4f}) | {test_error:+.4f} | "
            f"{test_error - error.mean():+.4f} |"
        )


if __name__ == "__main__":
    logging.disable(logging.WARNING)
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})
