"""The in-distribution flag rate of a quality study's runs at each alpha, counted by test subject (patient).

The study serves every test volume at the bundle's ``review_alpha`` and writes each volume's combined rank among the
``m + 1`` subjects (``rank``) and ``m`` (``validation_subjects``) to ``per_volume.csv.gz``. A rule at another alpha
flags the ranks ``<= floor(alpha (m + 1))``, so one serving gives every alpha. A test patient counts as flagged
when any of its frames is. Prints a Markdown table per results folder:

    python docs/results/acdc/flag_by_alpha.py docs/results/acdc_val20 docs/results/acdc_val20_split2
"""

from __future__ import annotations

import csv
import gzip
import sys
from collections import defaultdict
from pathlib import Path

from calib_monai.review.conformal import draw_bound, flag_rank

ALPHAS = (0.05, 0.1)


def flag_table(results_dir: Path) -> str:
    with gzip.open(results_dir / "quality" / "per_volume.csv.gz", "rt") as f:
        rows = [r for r in csv.DictReader(f) if r["condition"] == "in-distribution"]
    if not rows or "rank" not in rows[0]:
        raise SystemExit(f"{results_dir}: per_volume.csv.gz has no rank column: rerun the study with today's code")
    m = int(rows[0]["validation_subjects"])
    worst: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)  # run -> patient -> its frames' best rank
    for r in rows:
        patients = worst[(r["method"], r["seed"])]
        patients[r["subject"]] = min(int(float(r["rank"])), patients.get(r["subject"], m + 1))
    columns = [f"flagged at alpha {alpha:g} (k = {flag_rank(alpha, m)})" for alpha in ALPHAS]
    out = [
        f"### {results_dir}: m = {m} validation subjects",
        "",
        "| method | seed | test subjects | " + " | ".join(columns) + " |",
        "|---" * (3 + len(ALPHAS)) + "|",
    ]
    pooled = {alpha: 0 for alpha in ALPHAS}
    total = 0
    for (method, seed), patients in sorted(worst.items()):
        cells = [method, seed, str(len(patients))]
        total += len(patients)
        for alpha in ALPHAS:
            flagged = sum(rank <= flag_rank(alpha, m) for rank in patients.values())
            pooled[alpha] += flagged
            cells.append(f"{flagged} ({flagged / len(patients):.1%})")
        out.append("| " + " | ".join(cells) + " |")
    pooled_cells = [f"{pooled[a]} ({pooled[a] / total:.1%})" for a in ALPHAS]
    out.append("| pooled | | " + str(total) + " | " + " | ".join(pooled_cells) + " |")
    stated = [
        f"alpha {a:g}: bound {flag_rank(a, m) / (m + 1):.1%}, draw_bound {draw_bound(flag_rank(a, m), m):.1%}"
        for a in ALPHAS
        if flag_rank(a, m)
    ]
    return "\n".join([*out, "", "Stated: " + "; ".join(stated) + ".", ""])


if __name__ == "__main__":
    print("\n".join(flag_table(Path(folder)) for folder in sys.argv[1:]))
