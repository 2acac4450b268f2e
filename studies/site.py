"""The site study: is each review signal exchangeable in distribution, and how fast does the site monitor see a
shifted site, through the serving path?

It serves what :mod:`studies.quality` serves (the bundle's own ``calibrate``, then ``TrainedBundle.predict`` on
``inference.json``: the ordinary test images, each simulated site shift at each strength, another data set's images)
and reads each served case's per-signal rank among the ``n + 1`` volumes (``rank_<signal>`` of the quality study's
``per_volume.csv.gz``). From these ranks alone:

- **each signal's rank histogram** on the ordinary test volumes: the rank-1 share against the binomial 95% interval of
  an exchangeable signal (``1 / (n + 1)`` per volume; ``1 / (m + 1)`` when the validation subjects hold several
  volumes each), and a Kolmogorov-Smirnov test of the randomised ranks against the uniform;
- **the monitor's false alarms**: :class:`~calib_monai.review.site_martingale.SiteMartingale` (the one the served
  monitor runs, with the range's ``m`` and signals) over ``orders`` random orders of the ordinary test volumes;
- **its detection delay**: the cases to its first alarm over random orders of each shifted stream, beside the
  stream's mean estimate minus its truth, and the same over the answers that carry no warning (served before the
  alarm, not flagged): a stream the monitor does not see must not be answered too high.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binom, kstest

from calib_monai.review.site_martingale import DEFAULT_DELTA, SiteMartingale
from studies.quality_report import ID
from studies.study import write_table

__all__ = ["alarm_rows", "rank_rows", "read_records", "write_site_results"]

SIGNALS = ("case_score", "input", "features")


def read_records(path: str | Path) -> list[dict[str, str]]:
    """The quality study's per-volume served records (``per_volume.csv.gz``)."""
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def _int(value: Any) -> int:
    return int(float(value)) if value not in (None, "", "None", "nan") else 0


def _groups(records: Sequence[Mapping], keys: Sequence[str]) -> dict[tuple, list[Mapping]]:
    out: dict[tuple, list[Mapping]] = {}
    for r in records:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def _interval(count: int, p: float) -> tuple[int, int]:
    """The central 95% interval of Binomial(count, p)."""
    return int(binom.ppf(0.025, count, p)), int(binom.ppf(0.975, count, p))


def rank_rows(records: Sequence[Mapping], seed: int = 0) -> list[dict[str, Any]]:
    """Per method, seed and signal, on the ordinary test volumes: how many ranked 1 of the ``n + 1`` (beyond every
    validation volume) against the 95% interval of an exchangeable signal, and the KS test of the ranks (randomised
    within their unit, so that a uniform rank gives a uniform value) against the uniform."""
    rng = np.random.default_rng(seed)
    rows = []
    for (method, run_seed), group in _groups([r for r in records if r["condition"] == ID], ("method", "seed")).items():
        n = _int(group[0].get("validation_volumes")) or _int(group[0]["validation_subjects"])
        m = _int(group[0]["validation_subjects"])
        for signal in SIGNALS:
            ranks = np.array([_int(r.get(f"rank_{signal}")) for r in group])
            ranks = ranks[ranks > 0]
            if not ranks.size:
                continue
            ones = int((ranks == 1).sum())
            low, high = _interval(ranks.size, 1 / (n + 1))
            high_m = _interval(ranks.size, 1 / (m + 1))[1]
            # rank 1 = most extreme: (n + 1 - rank + U) / (n + 1) is uniform on (0, 1) for an exchangeable signal
            values = (n + 1 - ranks + rng.uniform(size=ranks.size)) / (n + 1)
            rows.append(
                {
                    "method": method,
                    "seed": run_seed,
                    "signal": signal,
                    "volumes": int(ranks.size),
                    "n": n,
                    "m": m,
                    "rank_1": ones,
                    "rank_1_share": round(ones / ranks.size, 3),
                    "expected": round(ranks.size / (n + 1), 1),
                    "interval_95": f"{low}-{high}" + (f" ({high_m} at 1/(m+1))" if m != n else ""),
                    "within": "yes" if low <= ones <= max(high, high_m) else "no",
                    "ks_p": round(float(kstest(values, "uniform").pvalue), 4),
                    "median_rank": float(np.median(ranks)),
                }
            )
    return rows


def _martingale(group: Sequence[Mapping], delta: float) -> tuple[SiteMartingale, list[dict[str, int]]]:
    """The served monitor's test for a run (its ``m`` and the signals its range judges by) and each case's ranks."""
    signals = tuple(s for s in SIGNALS if any(_int(r.get(f"rank_{s}")) for r in group))
    cases = [{s: _int(r.get(f"rank_{s}")) for s in signals} for r in group]
    return SiteMartingale(_int(group[0]["validation_subjects"]), signals, delta), cases


def alarm_rows(
    records: Sequence[Mapping], orders: int = 100, delta: float = DEFAULT_DELTA, seed: int = 0
) -> list[dict[str, Any]]:
    """Per method, seed and stream (the ordinary test volumes, each shift at each strength, another data set's
    images): over ``orders`` random orders of its cases, how many orders alarm, the median number of cases to the
    first alarm, and the stream's mean estimate minus its truth."""
    rows = []
    keys = ("method", "seed", "condition", "strength")
    for (method, run_seed, condition, strength), group in _groups(records, keys).items():
        test, cases = _martingale(group, delta)
        estimate = np.array([float(r["est_mean_dice"] or "nan") for r in group])
        truth = np.array([float(r.get("mean_dice") or "nan") for r in group])
        error = np.where(np.isfinite(estimate) & np.isfinite(truth), estimate - truth, np.nan)
        both = np.isfinite(error)
        flagged = np.array([r.get("flag") in ("1.0", "1", "True") for r in group])
        rng = np.random.default_rng(seed)
        delays, unwarned = [], []
        for _ in range(orders):
            order = rng.permutation(len(cases))
            delay = test.first_alarm(test.log_values([cases[i] for i in order]))
            delays.append(delay)
            # the answers that carry no word of warning: before the alarm (the alarm's own case says so) and not flagged
            silent = [i for i in order[: len(order) if delay is None else delay - 1] if not flagged[i]]
            unwarned += [error[i] for i in silent if both[i]]
        alarmed = [d for d in delays if d is not None]
        rows.append(
            {
                "method": method,
                "seed": run_seed,
                "stream": condition + (f" ({strength})" if strength else ""),
                "cases": len(cases),
                "signals": "+".join(test.signals),
                "m": test.m,
                "orders_alarmed": f"{len(alarmed)}/{orders}",
                "median_cases_to_alarm": float(np.median(alarmed)) if alarmed else "never",
                "fewest_possible": test.fewest_cases(),
                "estimate_minus_truth": round(float(error[both].mean()), 3) if both.any() else "n/a",
                # over the orders: the unwarned answers' mean estimate minus truth, and how many of them are above the
                # truth by more than 0.03
                "unwarned_minus_truth": round(float(np.mean(unwarned)), 3) if unwarned else "n/a",
                "unwarned_over_0.03": round(float(np.mean(np.array(unwarned) > 0.03)), 3) if unwarned else "n/a",
            }
        )
    return rows


def write_site_results(
    out: Path, records: Sequence[Mapping], orders: int, command: str, anchors: Sequence[Mapping] = ()
) -> str:
    """Write ``out`` (``ranks``, ``alarms`` and, given, ``anchors`` (:func:`studies.anchor.anchor_rows`) as CSV and
    Markdown, the README with ``command``) from the quality study's served records; returns the tables' text."""
    out.mkdir(parents=True, exist_ok=True)
    ranks = write_table(
        rank_rows(records),
        out / "ranks",
        "Each signal's rank among the n + 1 on the ordinary test volumes (1: beyond every validation volume)",
    )
    alarms = write_table(
        alarm_rows(records, orders),
        out / "alarms",
        f"The site monitor over {orders} random orders of each stream (delta {DEFAULT_DELTA})",
    )
    intro = (
        "Every rank is the served one: the quality study's `per_volume.csv.gz` (beside this folder) holds each case's "
        "`rank_<signal>` from its `<case>_quality.json` review. An exchangeable signal ranks 1 for about 1 in n + 1 "
        "ordinary volumes; `within` says whether the count lies in the binomial 95% interval. The alarms replay the "
        "served monitor's martingale (`calib_monai.review.site_martingale.SiteMartingale`) on random orders."
    )
    tables = [ranks, alarms]
    if anchors:
        tables.append(
            write_table(
                anchors,
                out / "anchors",
                "Each stream's answers re-anchored from L site labels (random draws of labelled subjects; the others "
                "scored): estimate minus truth, MAE, the 90% lower bound's coverage, answers too high without a word",
            )
        )
    text = "\n".join([intro, "", *tables])
    lines = [
        "# The site monitor: rank histograms, false alarms, detection delay",
        "",
        "Command (from the repository root):",
    ]
    lines += ["", f"    {command or 'python scripts/experiments.py site ...'}", ""]
    lines += ["Budget and runs: [the quality study](../quality/README.md), whose served cases these are.", "", text]
    (out / "README.md").write_text("\n".join(lines))
    return text
