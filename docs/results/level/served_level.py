"""Serve a run's test split through ``TrainedBundle.predict`` (the chain ``inferring`` and MONAI Label run) and print
the served case score minus the true DSC of the delivered segmentation, at the served level and raw.

    python docs/results/level/served_level.py RUN_DIR BUNDLE_NAME [OVERRIDES_JSON]"""

import json
import logging
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: studies/ is not installed
from calib_monai.bundle import TrainedBundle, locate_bundle  # noqa: E402
from studies.quality import served_record  # noqa: E402

logging.disable(logging.WARNING)
run, name = Path(sys.argv[1]), sys.argv[2]
overrides = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
models = run / "models"
settings = {**overrides, "output_dir": str(run / "inference")}
bundle = TrainedBundle(locate_bundle(name), ("inference.json",), settings, weights=models / "model.pt")
items = json.loads((models / "datalist.json").read_text())["test"]
rows = [served_record(bundle, item, {}) for item in items]
served = np.array([r["est_mean_dice"] - r["mean_dice"] for r in rows])
raw = np.array([r["raw_case_score"] - r["mean_dice"] for r in rows])
print(
    f"{run}: {len(rows)} volumes; served minus truth {served.mean():+.4f} (MAE {np.abs(served).mean():.4f}); "
    f"raw {raw.mean():+.4f} (MAE {np.abs(raw).mean():.4f}); offset {np.mean(served - raw):+.4f}"
)
