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

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository

from calib_monai.review import load_validated_range
from calib_monai.review.signals import signal_bar  # noqa: E402


def main(runs: str) -> None:
    print("| run | signals | largest validation z: case score | image | features | the bar (k-th subject) |")
    print("|---|---|---|---|---|---|")
    for path in sorted(Path(runs).glob("seed*/*/models/validated_range.json")):
        rule = load_validated_range(path, path.parent / "model.pt")
        bar = signal_bar(rule)  # by the signals the flag counts
        rule.score_check = True  # the case score's tail too, whether or not the flag counts it
        largest = signal_bar(rule)["largest"]
        cells = [f"{largest[n]:.1f}" if n in largest else "-" for n in ("case_score", "input", "features")]
        run = f"{path.parents[2].name} {path.parents[1].name}"
        print(f"| {run} | {'+'.join(bar['largest'])} | {' | '.join(cells)} | {bar['z']:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
