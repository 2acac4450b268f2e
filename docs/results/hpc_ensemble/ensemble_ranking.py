"""Does a deep ensemble rank Hippocampus failures better than one calibrated network? (issue 29.3)

The ranking anchor of issue 29 (Zenk et al., MedIA 2025) is a 5-member deep ensemble scored by the members' pairwise
DSC. This trains the members as the quality study trains CE+Dice (``ce_dice_hpc``: 6 epochs, lr x0.1 from epoch 4,
half the training cases, the data split of seed 0; seeds 0-4; the study's seed 0 and 1 runs are reused), calibrates
each with the bundle's ``calibrate``, serves the 50 test volumes with each member through the served chain
(``TrainedBundle.predict``: the segmentation and the case quality) and compares, on those volumes:

- each member's case score (the product's estimate) against that member's true mean DSC;
- the ensemble's segmentation (the per-voxel majority vote of the members; a tie goes to the lower label) scored by
  the members' mean pairwise DSC, against the vote's true mean DSC;
- the mean of the members' case scores, against the vote's true mean DSC.

Spearman, MAE and the share of the random-to-oracle AURC gap (risk: 1 - true mean DSC), and the cost: training wall
time per member (the runs' records) and serving time per volume. From the repository root::

    python docs/results/hpc_ensemble/ensemble_ranking.py --dataset_dir ../shared/data/Task04_Hippocampus

Writes ``per_volume.csv`` and ``ranking.md`` beside this script (``--out_dir``).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np

sys.path.insert(0, ".")  # the repository root: studies/ is not installed
from calib_monai.metrics import failure_detection_summary, quality_agreement  # noqa: E402
from studies.quality import _serving_bundle  # noqa: E402
from studies.runs import calibrate, train  # noqa: E402
from studies.study import StudySetup  # noqa: E402

CLASSES = (1, 2)  # anterior, posterior


def mean_dice(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over the foreground classes of the DSC of two label maps (a class in neither: 1)."""
    values = []
    for c in CLASSES:
        x, y = a == c, b == c
        total = int(x.sum() + y.sum())
        values.append(1.0 if total == 0 else 2.0 * int((x & y).sum()) / total)
    return float(np.mean(values))


def majority_vote(segmentations: list[np.ndarray]) -> np.ndarray:
    counts = np.stack([sum((s == c).astype(np.int32) for s in segmentations) for c in (0, *CLASSES)])
    return counts.argmax(0).astype(np.uint8)  # the first maximum: a tie goes to the lower label


def scores(estimate, true) -> dict[str, float]:
    estimate, true = np.asarray(estimate, dtype=np.float64), np.asarray(true, dtype=np.float64)
    agreement = quality_agreement(estimate, true)
    gap = failure_detection_summary(estimate, 1.0 - true)["aurc_gap_closed"]
    return {"spearman": agreement["spearman"], "mae": agreement["mae"], "bias": agreement["bias"], "gap": gap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset_dir", default="../shared/data/Task04_Hippocampus")
    parser.add_argument("--runs_dir", default="runs/quality/hpc")
    parser.add_argument("--members", default="0,1,2,3,4", help="the members' seeds")
    parser.add_argument("--volumes", type=int, default=0, help="only the first N test volumes (0: all)")
    parser.add_argument("--out_dir", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    setup = StudySetup(
        "hpc",
        dataset_dir=args.dataset_dir,
        runs_dir=args.runs_dir,
        epochs=6,
        lr_milestone=4,
        train_fraction=0.5,
        split_seed=0,
    )
    seeds = [int(s) for s in args.members.split(",")]
    members, test = [], None
    for seed in seeds:
        spec = setup.seeded(seed).spec("ce_dice")
        train(spec)
        calibrate(spec)
        record = json.loads((Path(spec.run_dir) / "run.json").read_text())
        items = json.loads((spec.models_dir / "datalist.json").read_text())["test"]
        if test is not None and [i["image"] for i in items] != [i["image"] for i in test]:
            raise SystemExit(f"{spec.models_dir}: another test split than the first member's (pass the same split)")
        test = items
        members.append((seed, spec, float(record.get("wall_time_s", float("nan")))))
    test = test[: args.volumes] if args.volumes else test
    rows, segmentations, serving = [], {}, []
    for seed, spec, _ in members:
        bundle = _serving_bundle(setup.seeded(seed), "ce_dice", spec.models_dir)
        for item in test:
            start = time.perf_counter()
            segmentation, _, quality = bundle.predict(item["image"])
            serving.append(time.perf_counter() - start)
            case = Path(item["image"]).name.split(".")[0]
            seg = np.asarray(segmentation[0], dtype=np.uint8)
            truth = np.asarray(nib.load(item["label"]).dataobj).astype(np.uint8)
            segmentations[(seed, case)] = seg
            rows.append(
                {
                    "case": case,
                    "member": seed,
                    "case_score": float(quality["case_score"]),
                    "true_mean_dice": mean_dice(seg, truth),
                }
            )
    cases = [Path(item["image"]).name.split(".")[0] for item in test]
    ensemble = []
    for item, case in zip(test, cases):
        segs = [segmentations[(seed, case)] for seed, _, _ in members]
        truth = np.asarray(nib.load(item["label"]).dataobj).astype(np.uint8)
        pairwise = np.mean([mean_dice(a, b) for a, b in itertools.combinations(segs, 2)])
        member_scores = [r["case_score"] for r in rows if r["case"] == case]
        ensemble.append(
            {
                "case": case,
                "member": "vote",
                "case_score": float(np.mean(member_scores)),
                "true_mean_dice": mean_dice(majority_vote(segs), truth),
                "pairwise_dice": float(pairwise),
            }
        )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with open(args.out_dir / "per_volume.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["case", "member", "case_score", "true_mean_dice", "pairwise_dice"])
        writer.writeheader()
        writer.writerows(rows + ensemble)
    lines = [
        "| score | against | Spearman | AURC gap closed | MAE | mean estimate - true |",
        "|---|---|---|---|---|---|",
    ]
    single = []
    for seed, _, _ in members:
        mine = [r for r in rows if r["member"] == seed]
        s = scores([r["case_score"] for r in mine], [r["true_mean_dice"] for r in mine])
        single.append(s)
        lines.append(
            f"| member seed {seed}: its case score | its true DSC "
            f"(mean {np.mean([r['true_mean_dice'] for r in mine]):.3f}) | {s['spearman']:.2f} | {s['gap']:.0%} | "
            f"{s['mae']:.3f} | {s['bias']:+.3f} |"
        )
    mean = {key: np.mean([s[key] for s in single]) for key in ("spearman", "gap", "mae", "bias")}
    lines.append(
        f"| **one member (mean of {len(members)})** | its true DSC | **{mean['spearman']:.2f}** "
        f"| **{mean['gap']:.0%}** | {mean['mae']:.3f} | {mean['bias']:+.3f} |"
    )
    vote_true = [e["true_mean_dice"] for e in ensemble]
    for name, key in (
        ("ensemble: members' pairwise DSC", "pairwise_dice"),
        ("ensemble: mean case score", "case_score"),
    ):
        s = scores([e[key] for e in ensemble], vote_true)
        lines.append(
            f"| **{name}** | the vote's true DSC (mean {np.mean(vote_true):.3f}) | **{s['spearman']:.2f}** | "
            f"**{s['gap']:.0%}** | {s['mae']:.3f} | {s['bias']:+.3f} |"
        )
    trainings = [t for _, _, t in members]
    cost = (
        f"Cost: training {np.mean(trainings):.0f} s per member (wall time on the machine that trained it; "
        f"{len(members)} members: {len(members)}x one model); serving {np.median(serving):.3f} s per volume per member "
        f"(median; the ensemble: {len(members)}x)."
    )
    command = "python docs/results/hpc_ensemble/ensemble_ranking.py " + " ".join(sys.argv[1:])
    text = (
        f"{len(cases)} test volumes, members (seeds) {', '.join(str(s) for s in seeds)}.\n\n"
        + "\n".join(lines)
        + f"\n\n{cost}\n\nCommand: `{command}`\n"
    )
    (args.out_dir / "ranking.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
