"""The served review flag on Hippocampus over two data splits (issue 29.2): the share of ordinary test cases flagged,
per method, pooled over the splits and seeds, against the stated bound; and the flagged share under each strong
site shift. From the repository root, after both `quality` studies (docs/results/hpc/quality/README.md and
docs/results/hpc_split1/quality/README.md name their commands):

    python docs/results/hpc_split1/pooled.py

The conformal bound is over the draw of the validation volumes: one split (one validation set serving both seeds)
says little about it, two splits a little more. A one-sided binomial test against the bound is printed, treating
the cases as independent (they are not quite: both seeds of a split share its 25 validation and 50 test volumes)."""

import csv
import math
from pathlib import Path

SPLITS = {"0": Path("docs/results/hpc/quality/per_seed.csv"), "1": Path("docs/results/hpc_split1/quality/per_seed.csv")}
BOUND = 1 / 26  # k / (n + 1) at n = 25, alpha 0.05


def binomial_tail(flagged: int, total: int, p: float) -> float:
    """P(X >= flagged) for X ~ Binomial(total, p)."""
    return sum(math.comb(total, i) * p**i * (1 - p) ** (total - i) for i in range(flagged, total + 1))


rows = [dict(r, split=split) for split, path in SPLITS.items() for r in csv.DictReader(path.open())]
methods = list(dict.fromkeys(r["method"] for r in rows))
print(f"| method | ordinary cases flagged, split 0 | split 1 | pooled | P(at least as many at {BOUND:.1%}) |")
print("|---|---|---|---|---|")
for method in methods:
    ordinary = [r for r in rows if r["method"] == method and r["condition"] == "in-distribution"]
    per_split = {s: [r for r in ordinary if r["split"] == s] for s in SPLITS}
    counts = {s: (sum(int(r["flagged"]) for r in v), sum(int(r["volumes"]) for r in v)) for s, v in per_split.items()}
    flagged, total = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    cells = " | ".join(f"{f} of {t} ({f / t:.1%})" for f, t in counts.values())
    tail = binomial_tail(flagged, total, BOUND)
    print(f"| {method} | {cells} | {flagged} of {total} ({flagged / total:.1%}) | {tail:.2f} |")
print()
shifts = list(dict.fromkeys(r["condition"] for r in rows if r["strength"] == "strong"))
print("Strong site shifts: flagged share per split and seed (s0/s1), and the mean signed error of the unflagged cases")
print()
print("| method | shift | split 0 flagged | split 1 flagged | split 0 unflagged error | split 1 unflagged error |")
print("|---|---|---|---|---|---|")
for method in methods:
    for shift in shifts:
        chosen = [r for r in rows if r["method"] == method and r["condition"] == shift and r["strength"] == "strong"]
        cells = []
        for key in ("flag_rate", "signed_error_unflagged"):
            for split in SPLITS:
                values = [r[key] for r in chosen if r["split"] == split]
                cells.append("/".join("n/a" if v in ("", "nan") else f"{float(v):+.2f}".lstrip("+") for v in values))
        print(f"| {method} | {shift} | {' | '.join(cells)} |")
