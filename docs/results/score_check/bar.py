"""Which signal sets the review flag's bar: for each run of a quality study, the largest robust z-score each signal
gives a validation volume (the validated range's own volumes, each measured against the others and a typical case:
the validation median of each signal). With k = 1 a case is flagged only beyond the most extreme validation subject
by its largest signal, so the signal with the heaviest validation tail sets the bar for all of them.

    python docs/results/score_check/bar.py /tmp/runs/hpc_shading   # one study's --runs_dir; bar.md holds six

``runs``: a quality study's ``--runs_dir`` (``seed<s>/<method>_<dataset>/models/validated_range.json``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository

from calib_monai.recalibration import load_validated_range  # noqa: E402
from calib_monai.recalibration.conformal_scores import standardised  # noqa: E402
from calib_monai.recalibration.review_signals import signal_values  # noqa: E402


def main(runs: str) -> None:
    print("| run | signals | largest validation z: case score | image | features | the bar (k-th subject) |")
    print("|---|---|---|---|---|---|")
    for path in sorted(Path(runs).glob("seed*/*/models/validated_range.json")):
        rule = load_validated_range(path, path.parent / "model.pt")
        rule.score_check = True  # measure the case score's tail whether or not the flag counts it
        typical = {"case_score": float(np.nanmedian(rule.scores)), "classes": {}}
        inputs = list(np.median(np.asarray(rule.inputs), 0)) if rule.inputs else None
        features = np.asarray(rule.features["mean"]) if rule.features else None
        values = signal_values(rule, typical, inputs, features, "")[0]
        z = {name: standardised(v)[:-1] for name, v in values.items()}
        largest = {name: f"{float(np.max(v)):.1f}" for name, v in z.items()}
        counted = [name for name in load_validated_range(path, path.parent / "model.pt").signals if name in z]
        most = np.full(rule.m, -np.inf)
        np.maximum.at(most, rule._subject_of, np.max(np.stack([z[n] for n in counted]), 0))
        bar = np.sort(most)[::-1][rule.rank - 1] if rule.rank else float("nan")
        cells = [largest.get(n, "-") for n in ("case_score", "input", "features")]
        run = f"{path.parents[2].name} {path.parents[1].name}"
        print(f"| {run} | {'+'.join(counted)} | {' | '.join(cells)} | {bar:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
