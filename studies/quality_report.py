"""Tables and README of the case-quality study (:mod:`studies.quality`), from its per-volume served records.

Per method, seed and condition (in distribution, each shift at each strength, another data set's images) first;
then the mean over seeds with each seed's value beside it; then the verdict against the targets of issue 29
(``docs/results/targets.json``, ``"verdict"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binom

from calib_monai.metrics import failure_detection_summary, quality_agreement
from studies.study import StudySetup, load_targets, write_csv, write_table

__all__ = ["ID", "condition_rows", "verdict_lines", "write_quality_results"]

ID = "in-distribution"
#: the first words of the reason each signal gives (calib_monai.review.rule)
SIGNAL_REASONS = {"case_score": "estimated mean DSC", "input": "image unlike", "features": "features unlike"}


def _values(rows: Sequence[Mapping], column: str) -> np.ndarray:
    out = []
    for r in rows:
        v = r.get(column)
        out.append(float("nan") if v is None or v == "" else float(v))
    return np.array(out, dtype=np.float64)


def _flag(record: Mapping) -> float:
    value = record.get("flag")
    return float("nan") if value is None or value == "" else float(value)


def _mean(values: np.ndarray) -> float:
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def _subjects_flagged(rows: Sequence[Mapping], flag: np.ndarray) -> dict[str, int]:
    """How many subjects (patients; a record without one is its own) the rows hold and how many have a flagged
    volume: the unit the stated bound counts."""
    subjects = [str(r.get("subject") or r["case"]) for r in rows]
    flagged = {s for s, f in zip(subjects, flag) if f == 1}
    count = len(set(subjects))
    return {"subjects": count, "subjects_flagged": len(flagged), "subject_flag_rate": len(flagged) / max(count, 1)}


def condition_rows(records: Sequence[Mapping]) -> list[dict[str, Any]]:
    """One row per (method, seed, condition, strength): flags (True, None = cannot judge), the truth against the
    served estimate (mean, signed error overall and among the volumes not flagged, Spearman, MAE, the share of the
    random-to-oracle AURC gap the case score closes with risk 1 - DSC), the volume interval's coverage, seconds."""
    groups: dict[tuple, list[Mapping]] = {}
    for r in records:
        groups.setdefault((r["method"], r["seed"], r["condition"], r["strength"]), []).append(r)
    rows = []
    for (method, seed, condition, strength), rows_of in groups.items():
        flag, est, dice = _values(rows_of, "flag"), _values(rows_of, "est_mean_dice"), _values(rows_of, "mean_dice")
        quiet = flag == 0  # judged and not flagged: where optimism would be silent
        row = {
            "method": method,
            "seed": seed,
            "condition": condition,
            "strength": strength,
            "volumes": len(rows_of),
            "flagged": int((flag == 1).sum()),
            **_subjects_flagged(rows_of, flag),
            "cannot_judge": int(np.isnan(flag).sum()),
            "flag_rate": float((flag == 1).mean()),
            "true_dice": _mean(dice),
            "est_dice": _mean(est),
            "signed_error": _mean(est - dice),
            "signed_error_unflagged": _mean((est - dice)[quiet]) if quiet.any() else float("nan"),
            # what the flagged volumes' segmentations were worth against the others'
            "true_dice_flagged": _mean(dice[flag == 1]) if (flag == 1).any() else float("nan"),
            "true_dice_unflagged": _mean(dice[quiet]) if quiet.any() else float("nan"),
            "seconds": _mean(_values(rows_of, "seconds")),
        }
        for signal, start in SIGNAL_REASONS.items():  # which signal raised the flags
            row[f"by_{signal}"] = sum(
                1 for r in rows_of if _flag(r) == 1.0 and str(r.get("reasons", "")).startswith(start)
            )
        if np.isfinite(dice).sum() >= 3:
            agreement = quality_agreement(est, dice)
            row.update(spearman=agreement["spearman"], mae=agreement["mae"])
            keep = np.isfinite(est) & np.isfinite(dice)
            row["aurc_gap"] = failure_detection_summary(est[keep], 1 - dice[keep])["aurc_gap_closed"]
            confidence = _values(rows_of, "mean_confidence")
            keep = np.isfinite(confidence) & np.isfinite(dice)
        if np.isfinite(dice).sum() >= 3 and keep.sum() >= 3:
            row["spearman_confidence"] = quality_agreement(confidence, dice)["spearman"]
            row["aurc_gap_confidence"] = failure_detection_summary(confidence[keep], 1 - dice[keep])["aurc_gap_closed"]
        if condition == ID:
            row["volume_coverage"] = _mean(_values(rows_of, "volume_covered"))
        rows.append(row)
    return rows


def _over_seeds(rows: Sequence[Mapping], columns: Sequence[str], digits: int = 3) -> list[dict[str, str]]:
    """Mean over seeds per (method, condition, strength), each seed's value in brackets."""
    groups: dict[tuple, list[Mapping]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["condition"], r["strength"]), []).append(r)
    out = []
    for (method, condition, strength), seeds in groups.items():
        row = {"method": method, "images": condition + (f" ({strength})" if strength else "")}
        for column in columns:
            values = [float(s.get(column, float("nan"))) for s in seeds]
            finite = [v for v in values if math.isfinite(v)]
            mean = f"{np.mean(finite):+.{digits}f}" if column.startswith("signed") and finite else ""
            mean = mean or (f"{np.mean(finite):.{digits}f}" if finite else "n/a")
            each = ", ".join("n/a" if not math.isfinite(v) else f"{v:.{digits}f}" for v in values)
            row[column] = f"{mean} ({each})" if len(values) > 1 else mean
        out.append(row)
    return out


def verdict_lines(rows: Sequence[Mapping], ranges: Sequence[Mapping], dataset: str) -> list[str]:
    """Each target of issue 29, met or not, per method (the worst seed decides)."""
    t = load_targets("verdict")
    lines = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        ident = [r for r in mine if r["condition"] == ID]
        bounds = {r["seed"]: r["bound"] for r in ranges if r["method"] == method}
        flagged, volumes = sum(r["flagged"] for r in ident), sum(r["volumes"] for r in ident)
        bound = max(bounds.values()) if bounds else 0.0
        # the bound counts subjects (a patient's frames are one unit): how surprising that many subjects with a flag
        # would be if each were flagged at exactly the bound
        units = sum(r.get("subjects", r["volumes"]) for r in ident)
        hit = sum(r.get("subjects_flagged", r["flagged"]) for r in ident)
        p_value = float(binom.sf(hit - 1, units, bound)) if hit else 1.0
        per_seed = ", ".join(f"{r['flagged']}/{r['volumes']}" for r in ident)
        counted = f"{flagged} of {volumes} ({flagged / volumes:.1%}; seeds {per_seed})"
        if units < volumes:
            each = ", ".join(f"{r.get('subjects_flagged')}/{r.get('subjects')}" for r in ident)
            counted += f"; subjects with a flag {hit} of {units} ({hit / units:.1%}; seeds {each})"
        lines.append(
            f"- **{method}**: ordinary cases flagged {counted} against the stated bound {bound:.1%} (P(at least "
            f"{hit} | bound) = {p_value:.2f}; target: within it and at most {t['fpr']:.0%}): "
            f"{_met(hit / units <= min(bound, t['fpr']))}"
        )
        other = [r for r in mine if r["condition"].endswith(" images")]
        if other:
            low = min(r["flag_rate"] for r in other)
            lines.append(f"  - another data set's images flagged at least {low:.0%}: {_met(low >= t['other'])}")
        strongest = max((r["strength"] for r in mine if r["strength"]), key=_strength_order, default="")
        for kind in dict.fromkeys(r["condition"] for r in mine if r["strength"] == strongest and strongest):
            shifted = [r for r in mine if r["condition"] == kind and r["strength"] == strongest]
            rate, error = min(r["flag_rate"] for r in shifted), max(abs(r["signed_error"]) for r in shifted)
            ok = rate >= t["shift_flagged"] or error <= t["shift_error"]
            lines.append(
                f"  - {kind} ({strongest}): flagged at least {rate:.0%}, mean estimate off by at most {error:.3f}: "
                f"{_met(ok)}"
            )
        silent = [r["signed_error_unflagged"] for r in mine if r["condition"] != ID and r["strength"]]
        silent = [s for s in silent if math.isfinite(s)]
        if silent:
            worst = max(silent)
            lines.append(
                f"  - largest mean optimism without a flag under a shift: {worst:+.3f}: "
                f"{_met(worst <= t['shift_error'])}"
            )
        if dataset == "hpc":
            rho, gap = min(r.get("spearman", np.nan) for r in ident), min(r.get("aurc_gap", np.nan) for r in ident)
            lines.append(
                f"  - in distribution Spearman at least {rho:.2f}, AURC gap at least {gap:.0%}: "
                f"{_met(rho >= t['spearman'] and gap >= t['gap'])}"
            )
    return lines


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _strength_order(strength: str) -> int:
    return ("mild", "moderate", "strong").index(strength) if strength in ("mild", "moderate", "strong") else -1


def write_quality_results(
    setup: StudySetup,
    out: Path,
    records: list[dict],
    ranges: list[dict],
    specs,
    seeds: Sequence[int],
    methods: Sequence[str],
    other_dataset: str,
    command: str,
) -> str:
    """Write the per-volume records, the per-seed rows, the tables and the README; returns the README's text."""
    write_csv(out / "per_volume.csv.gz", records)
    rows = condition_rows(records)
    write_csv(out / "per_seed.csv", rows)
    rule = write_table(ranges, out / "rule", "The served rule of each run (its validated_range.json)")
    ident = [r for r in rows if r["condition"] == ID]
    columns = ["flag_rate", "true_dice", "est_dice", "signed_error", "spearman", "mae", "aurc_gap", "volume_coverage"]
    columns[1:1] = ["subject_flag_rate", "true_dice_flagged", "true_dice_unflagged"]
    in_dist = write_table(
        _over_seeds(ident, columns),
        out / "in_distribution",
        f"In distribution through the serving path: mean over seeds {list(seeds)} (each seed's value)",
    )
    shifted = [r for r in rows if r["condition"] != ID]
    columns = ["flag_rate", "true_dice", "est_dice", "signed_error", "signed_error_unflagged", "spearman", "aurc_gap"]
    shifts = write_table(
        _over_seeds(shifted, columns, 2),
        out / "shifts",
        "Under each site shift and on another data set's images: flagged share, truth, served estimate",
    )
    signals = write_table(
        _over_seeds(
            rows, ["flagged", *(f"by_{k}" for k in SIGNAL_REASONS), "spearman_confidence", "aurc_gap_confidence"], 2
        ),
        out / "signals",
        "Which signal raised the flags (volumes; the first reason), and the mean confidence as the ranking score",
    )
    verdict = "\n".join(["### Against issue 29's targets", "", *verdict_lines(rows, ranges, setup.dataset)])
    intro = (
        "Every number comes from the serving path: the bundle's own `calibrate`, then `TrainedBundle.predict` on "
        "`inference.json` (the chain `inferring` and MONAI Label run). Per volume in `per_volume.csv.gz` (its flag, "
        "reasons and each signal's distance), per seed and condition in `per_seed.csv`."
    )
    setup.write_readme(
        "quality",
        f"The served verdict on {setup.dataset}: case score and review flag",
        command or "python scripts/experiments.py quality ...",
        [intro, rule, in_dist, shifts, signals, verdict],
        specs,
        seeds,
    )
    return verdict
