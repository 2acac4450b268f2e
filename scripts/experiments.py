"""The papers' studies, one command each: train the bundles a study needs (or reuse finished runs), evaluate on the
3D test volumes, write CSV + Markdown tables and PNG figures under ``--results_dir``.

    python scripts/experiments.py --help
    python scripts/experiments.py main --dataset hpc --dataset_dir ../shared/data/Task04_Hippocampus \\
        --results_dir docs/results/hpc --epochs 6 --lr_milestone 4 --train_fraction 0.5

Studies: main, noise, data_fraction, nacl_ablation, crac_vs_nacl, crac_ablation, posthoc, logit_epochs (see
calib_monai/experiments/cli.py for their flags).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: studies/ is not installed

from studies.cli import run  # noqa: E402

if __name__ == "__main__":
    run()
