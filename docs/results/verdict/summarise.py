"""Per-volume true DSC beside the served estimate and flag; one Markdown row per condition (run from the repo root).

python docs/results/verdict/summarise.py /tmp/m29/inf_test /tmp/m29/inf_shift_<kind> ...
"""

import csv
import glob
import json
import os
import sys

import nibabel as nib
import numpy as np

LABELS = "../shared/data/Task04_Hippocampus/labelsTr"
HERE = os.path.dirname(os.path.abspath(__file__))

print("| images | volumes | flagged | mean true DSC | mean estimated DSC | estimate - truth | same, not flagged |")
print("|---|---|---|---|---|---|---|")
with open(os.path.join(HERE, "per_volume.csv"), "w", newline="") as out:
    writer = csv.writer(out)
    writer.writerow(["condition", "case", "true_mean_dice", "case_score", "review_flag"])
    for folder in sys.argv[1:]:
        name = os.path.basename(folder.rstrip("/")).removeprefix("inf_")
        rows = []
        for path in sorted(glob.glob(f"{folder}/*_quality.json")):
            case = os.path.basename(path)[: -len("_quality.json")]
            seg = np.asarray(nib.load(f"{folder}/{case}_seg.nii.gz").dataobj).squeeze()
            lab = np.asarray(nib.load(f"{LABELS}/{case}.nii.gz").dataobj).squeeze()
            dice = [2 * ((seg == c) & (lab == c)).sum() / max(1, (seg == c).sum() + (lab == c).sum()) for c in (1, 2)]
            quality = json.load(open(path))
            rows.append((float(np.mean(dice)), quality["case_score"], quality["review"]["flag"] is True))
            writer.writerow([name, case, f"{rows[-1][0]:.4f}", f"{rows[-1][1]:.4f}", rows[-1][2]])
        a = np.array(rows, dtype=float)
        kept = a[a[:, 2] == 0]
        print(
            f"| {name} | {len(a)} | {int(a[:, 2].sum())} | {a[:, 0].mean():.3f} | {a[:, 1].mean():.3f} | "
            f"{a[:, 1].mean() - a[:, 0].mean():+.3f} | {kept[:, 1].mean() - kept[:, 0].mean():+.3f} |"
        )
