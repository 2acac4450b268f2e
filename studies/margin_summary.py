"""The contour study's summary (:mod:`studies.margins` serves and scores the cases): per method, seed, epsilon,
condition and structure, the coverage against ``1 - alpha`` with the binomial interval and the range a rule that
holds exactly gives with ``m`` validation subjects, and the excess volume against the morphological margin; the
README's verdicts, made again from ``per_case.csv.gz`` by :func:`rescore_margins`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import beta, betabinom

from studies.site import read_records
from studies.study import write_table

__all__ = ["EXCESS_TARGET", "binomial_interval", "guarantee_range", "report_lines", "rescore_margins", "summary_rows"]

EXCESS_TARGET = 0.3  # the outer contour's excess volume at least 30% below the morphological margin's (issue 49)


def binomial_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of a share ``k / n``."""
    tail = (1 - confidence) / 2
    low = float(beta.ppf(tail, k, n - k + 1)) if k > 0 else 0.0
    high = float(beta.ppf(1 - tail, k + 1, n - k)) if k < n else 1.0
    return low, high


def guarantee_range(n: int, m: int, alpha: float, confidence: float = 0.95) -> tuple[int, float]:
    """What a rule that holds exactly gives on ``n`` test cases with ``m`` validation subjects: the fewest cases it
    holds for (the lower end of a two-sided ``confidence`` range, as the binomial interval's), and how often its
    share falls below the binomial interval.

    Each lambda is the ``k``-th smallest of the ``m`` subjects' requirements, ``k = m + 1 - floor(alpha (m + 1))``,
    so a run's coverage given its subjects is ``Beta(k, m + 1 - k)`` (continuous requirements; ties only raise it)
    and its count of ``n`` exchangeable test cases is beta-binomial. The binomial interval counts only the test
    cases' noise: at ``m = 10`` a valid rule falls below it in about one run in nine.
    """
    k = m + 1 - math.floor(alpha * (m + 1))
    if k > m:  # too few subjects: no lambda is chosen
        return 0, float("nan")
    counts = betabinom(n, k, m + 1 - k)
    below = [x for x in range(n + 1) if binomial_interval(x, n, confidence)[1] < 1 - alpha]
    return int(counts.ppf((1 - confidence) / 2)), float(counts.cdf(max(below))) if below else 0.0


def summary_rows(records: Sequence[Mapping[str, Any]], alpha: float) -> list[dict[str, Any]]:
    """Per method, seed, epsilon, condition and structure: the contours' and the morphological margin's coverage
    (``k/n`` with the 95% binomial interval) against ``1 - alpha``, their mean excess and missing volumes, and
    whether each target holds (coverage: ``1 - alpha`` inside or below the interval; excess: the contours' at least
    30% below the margin's), and whether both counts reach the fewest a valid rule gives with this ``m``
    (:func:`guarantee_range`)."""
    keys = ("method", "seed", "epsilon", "condition", "structure")
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, rows in groups.items():
        n, first = len(rows), rows[0]
        row: dict[str, Any] = dict(zip(keys, key))
        row.update(n=n, m=first["m"], lambda_out=first["lambda_out"], lambda_in=first["lambda_in"])
        row.update(d_out=first["d_out"], d_in=first["d_in"])
        covered, low_count = True, guarantee_range(n, int(first["m"]), alpha)[0]
        within = True
        for name, column in (
            ("outer", "outer_holds"),
            ("inner", "inner_inside"),
            ("morph_outer", "morph_outer_holds"),
            ("morph_inner", "morph_inner_inside"),
        ):
            k = int(sum(bool(r[column]) for r in rows))
            low, high = binomial_interval(k, n)
            row[f"{name}_covered"] = f"{k}/{n}"
            row[f"{name}_ci"] = f"{low:.2f}-{high:.2f}"
            if name in ("outer", "inner"):
                covered &= high >= 1 - alpha
                within &= k >= low_count
        excess = float(np.mean([r["excess_ml"] for r in rows]))
        morph_excess = float(np.mean([r["morph_excess_ml"] for r in rows]))
        row["flagged"] = int(sum(bool(r["flagged"]) for r in rows))  # served as "not vouched for"
        row["true_ml"] = float(np.mean([r["true_ml"] for r in rows]))
        row["excess_ml"], row["morph_excess_ml"] = excess, morph_excess
        row["missing_ml"] = float(np.mean([r["missing_ml"] for r in rows]))
        row["morph_missing_ml"] = float(np.mean([r["morph_missing_ml"] for r in rows]))
        row["excess_reduction"] = 1 - excess / morph_excess if morph_excess > 0 else float("nan")
        row["coverage_target"] = "yes" if covered else "NO"
        row["guarantee_low"] = f"{low_count}/{n}"  # the fewest a valid rule gives at 97.5%, for this m
        row["within_guarantee"] = "yes" if within else "NO"
        row["excess_target"] = "yes" if row["excess_reduction"] >= EXCESS_TARGET else "NO"
        out.append(row)
    return out


REPORT = "## Where the targets hold"


def report_lines(out: Path, records: Sequence[Mapping[str, Any]], alpha: float) -> list[str]:
    """The README's part made from the per-case records: the verdicts and the summary table (also written as
    ``summary.csv`` and ``summary.md``)."""
    summary = summary_rows(records, alpha)
    table = write_table(summary, out / "summary", "Contours against the morphological margin")
    sizes = dict.fromkeys((r["n"], r["m"]) for r in summary)  # each (n, m) once
    chance = [f"{guarantee_range(n, m, alpha)[1]:.1%} of runs at m = {m}, n = {n}" for n, m in sizes]
    return [
        REPORT,
        "",
        "Within the guarantee: both counts at least `guarantee_low`, the fewest of n cases that a rule holding exactly",
        "gives, with 97.5% probability, with m validation subjects. Each run's lambdas come from one draw of m",
        "subjects, and the binomial interval leaves that draw's noise out: a rule that holds exactly falls below the",
        f"binomial interval in {', '.join(chance)}.",
        "",
        *_verdicts(summary),
        "",
        table,
        "Per case and structure: `per_case.csv.gz`.",
    ]


def rescore_margins(results_dir: str | os.PathLike, alpha: float) -> str:
    """The summary and the README's verdicts again from ``<results_dir>/per_case.csv.gz`` (serves nothing): the
    README's part from its ``## Where the targets hold`` on is replaced, its header (command, runs) kept."""
    out = Path(results_dir)
    records = [_typed(r) for r in read_records(out / "per_case.csv.gz")]
    readme = (out / "README.md").read_text()
    if REPORT not in readme:
        raise ValueError(f"{out / 'README.md'} has no '{REPORT}' section: run the margins study there first")
    header = readme[: readme.index(REPORT)].rstrip("\n").split("\n")
    (out / "README.md").write_text("\n".join([*header, "", *report_lines(out, records, alpha)]) + "\n")
    return str(out)


def _typed(record: Mapping[str, str]) -> dict[str, Any]:
    """A ``per_case.csv.gz`` row with the types the study wrote."""
    out: dict[str, Any] = dict(record)
    for key in ("seed", "m", "d_out", "d_in"):  # d: None where no margin reaches the requirement
        out[key] = int(float(record[key])) if record[key] not in ("", "None") else None
    for key in ("epsilon", "lambda_out", "lambda_in", "excess_ml", "missing_ml", "true_ml"):
        out[key] = float(record[key]) if record[key] not in ("", "None") else None
    out.update({key: float(record[key]) for key in ("morph_excess_ml", "morph_missing_ml")})
    for key in ("flagged", "outer_holds", "inner_inside", "morph_outer_holds", "morph_inner_inside"):
        out[key] = record[key] == "True"
    return out


def _verdicts(summary: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per method, epsilon and condition: for how many (seed, structure) rows each target holds, in words."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in summary:
        groups.setdefault((row["method"], row["epsilon"], row["condition"]), []).append(row)
    lines = []
    for (method, eps, condition), rows in groups.items():
        cov = sum(r["coverage_target"] == "yes" for r in rows)
        within = sum(r["within_guarantee"] == "yes" for r in rows)
        exc = sum(r["excess_target"] == "yes" for r in rows)
        reduction = ", ".join(f"{r['excess_reduction']:+.0%}" for r in rows)
        lines.append(
            f"- {method}, epsilon {eps}, {condition}: coverage target holds for {cov} of {len(rows)} (seed, "
            f"structure), within the guarantee for {within}; excess target (>= {EXCESS_TARGET:.0%} less than the "
            f"morphological margin) for {exc} of {len(rows)} (reduction {reduction})"
        )
    return lines
