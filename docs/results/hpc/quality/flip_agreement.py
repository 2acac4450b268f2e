"""Test-time flip agreement against the served case score as a ranking signal (issue 29.3), on the quality study's
runs and in-distribution test volumes. From the repository root, after `scripts/experiments.py quality` (README):

    python docs/results/hpc/quality/flip_agreement.py ce_dice 0

Prints the cost per volume (4 forward passes: the image and its in-plane flips) and Spearman / AURC gap of each
score against the true mean DSC the study recorded."""

import csv
import gzip
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, ".")  # the repository root: studies/ is not installed
from calib_monai.metrics import failure_detection_summary, quality_agreement  # noqa: E402
from studies.quality import _serving_bundle  # noqa: E402
from studies.study import StudySetup  # noqa: E402


def flip_agreement(probs, image: torch.Tensor, flips=((), (0,), (1,), (0, 1))) -> float:
    """Test-time augmentation's agreement (Wang et al., Neurocomputing 2019): the segmentations (argmax) of ``probs``
    on ``image`` and its in-plane flips, each flipped back; per foreground class the mean pairwise DSC (pairs where
    both maps lack the class left out), then the mean over classes with a value."""
    labels = []
    for flip in flips:
        dims = [a + 1 for a in flip]
        out = probs(torch.flip(image, dims) if dims else image)
        labels.append((torch.flip(out, dims) if dims else out).argmax(0).reshape(-1).long())
    c = out.shape[0]
    dice = []
    for a, b in itertools.combinations(labels, 2):
        confusion = torch.bincount(a * c + b, minlength=c * c).reshape(c, c).double()
        total = confusion.sum(0) + confusion.sum(1)
        dice.append(torch.where(total > 0, 2 * confusion.diagonal() / total.clamp_min(1), torch.nan)[1:])
    return float(torch.stack(dice).nanmean(0).nanmean())


method, seed = sys.argv[1], int(sys.argv[2])
setup = StudySetup(
    "hpc",
    dataset_dir="../shared/data/Task04_Hippocampus",
    runs_dir="runs/quality/hpc",
    epochs=6,
    lr_milestone=4,
    train_fraction=0.5,
    split_seed=0,
).seeded(seed)
models = Path(setup.runs_dir) / f"{method}_hpc" / "models"
bundle = _serving_bundle(setup, method, models)
with gzip.open("docs/results/hpc/quality/per_volume.csv.gz", "rt") as f:
    rows = [
        r
        for r in csv.DictReader(f)
        if (r["condition"], r["method"], r["seed"]) == ("in-distribution", method, str(seed))
    ]
images = {
    Path(i["image"]).name.split(".")[0]: i["image"] for i in json.loads((models / "datalist.json").read_text())["test"]
}
agreement, estimate, dice = [], [], []
start = time.perf_counter()
for row in rows:
    image = torch.as_tensor(bundle.preprocess(images[row["case"]])["image"])
    with torch.no_grad():
        agreement.append(flip_agreement(lambda x: bundle.inferer(x[None], bundle.network)[0], image))
    estimate.append(float(row["est_mean_dice"]))
    dice.append(float(row["mean_dice"]))
print(f"{method} seed {seed}: {len(rows)} volumes, {(time.perf_counter() - start) / len(rows):.2f} s per volume")
agreement, estimate, dice = map(np.array, (agreement, estimate, dice))
for name, score in (
    ("case score", estimate),
    ("flip agreement", agreement),
    ("mean of both", (estimate + agreement) / 2),
):
    rho = quality_agreement(score, dice)["spearman"]
    gap = failure_detection_summary(score, 1 - dice)["aurc_gap_closed"]
    print(f"| {method} | {seed} | {name} | {rho:.3f} | {gap:.3f} |")
