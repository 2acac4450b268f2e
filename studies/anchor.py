"""Re-anchoring the case score from a site's labels, replayed on the quality study's served cases.

For each run and stream (the ordinary test volumes, each simulated shift, another data set's images) and each number
``L`` of site labels, over random draws of ``L`` labelled subjects: the served answers of the other cases are
re-anchored exactly as ``SiteMonitord`` does (:class:`calib_monai.review.anchor.CaseScoreAnchor` from the run's
validated range and the labelled cases' served score minus truth), and compared with their true mean DSC:

- the mean estimate minus the truth, and the mean absolute error, on the unlabelled cases;
- how often the served lower bound holds the truth (``coverage``), and how far below the estimate it lies;
- ``silent_over_0.03``: the share of unlabelled answers that are not flagged, more than 0.03 above the truth, and
  below their own lower bound: an answer too high without a word.

Nothing was tuned on these cases: the rule (mean offset, conformal or t-widened bound) was written first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calib_monai.review.anchor import CaseScoreAnchor
from calib_monai.review.validated_range import read_validated_range

__all__ = ["anchor_rows", "read_ranges"]

LABELS = (0, 2, 4, 8)


def read_ranges(runs_dir: str | Path, dataset: str, records: Sequence[Mapping]) -> dict[tuple[str, str], Any]:
    """Each ``(method, seed)`` run's validated range, from ``<runs_dir>/seed<seed>/<method>_<dataset>/models``. A
    range from before ``case_score_error.per_volume`` was stored gets it from ``values`` when none was NaN (then the
    two are the same list)."""
    ranges = {}
    for method, seed in sorted({(r["method"], r["seed"]) for r in records}):
        validated, why = read_validated_range(Path(runs_dir) / f"seed{seed}" / f"{method}_{dataset}" / "models")
        if validated is None:
            raise FileNotFoundError(why)
        error = validated.info.get("case_score_error") or {}
        if "per_volume" not in error and len(error.get("values", [])) == validated.n:
            validated.info["case_score_error"] = {**error, "per_volume": error["values"]}
        ranges[(method, seed)] = validated
    return ranges


def _stream(records: Sequence[Mapping]) -> dict[str, np.ndarray]:
    # the raw served score, which site labels re-anchor (records served before the level was subtracted hold it alone)
    estimate = np.array([float(r.get("raw_case_score") or r["est_mean_dice"] or "nan") for r in records])
    truth = np.array([float(r.get("mean_dice") or "nan") for r in records])
    keep = np.isfinite(estimate) & np.isfinite(truth)
    subjects = np.unique([r.get("subject") or r["case"] for r in records], return_inverse=True)[1].reshape(-1)
    flagged = np.array([r.get("flag") in ("1.0", "1", "True") for r in records])
    return {"estimate": estimate[keep], "truth": truth[keep], "subject": subjects[keep], "flagged": flagged[keep]}


def _replay(stream: Mapping[str, np.ndarray], validated: Any, labelled: np.ndarray) -> dict[str, float]:
    """One draw: ``labelled`` subjects' cases re-anchor the others' answers."""
    is_labelled = np.isin(stream["subject"], labelled)
    errors = stream["estimate"][is_labelled] - stream["truth"][is_labelled]
    anchor = CaseScoreAnchor.from_range(validated, errors.tolist())
    answers = [anchor.answer(float(s)) for s in stream["estimate"][~is_labelled]]
    estimate = np.array([a["case_score"] for a in answers])
    low = np.array([math.nan if a["case_score_low"] is None else a["case_score_low"] for a in answers])
    truth, flagged = stream["truth"][~is_labelled], stream["flagged"][~is_labelled]
    over = estimate - truth
    return {
        "minus_truth": float(over.mean()),
        "mae": float(np.abs(over).mean()),
        "coverage": float(np.mean(truth >= low)) if np.isfinite(low).all() else math.nan,
        "width": float(np.mean(estimate - low)),
        "silent": float(np.mean((over > 0.03) & ~(truth >= low) & ~flagged)),
    }


def anchor_rows(
    records: Sequence[Mapping],
    ranges: Mapping[tuple[str, str], Any],
    labels: Sequence[int] = LABELS,
    draws: int = 200,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Per run, stream and number of labels: the re-anchored answers over ``draws`` random draws of labelled
    subjects (see the module); the mean over draws, and the 5th and 95th percentiles of the mean minus truth."""
    rows = []
    groups: dict[tuple, list[Mapping]] = {}
    for r in records:
        groups.setdefault((r["method"], r["seed"], r["condition"], r.get("strength", "")), []).append(r)
    for (method, run_seed, condition, strength), group in groups.items():
        stream, validated = _stream(group), ranges[(method, run_seed)]
        subjects = np.unique(stream["subject"])
        rng = np.random.default_rng(seed)
        for count in labels:
            if count >= len(subjects):
                continue
            replays = [
                _replay(stream, validated, rng.choice(subjects, count, replace=False))
                for _ in range(draws if count else 1)
            ]
            mean = {key: float(np.nanmean([r[key] for r in replays])) for key in replays[0]}
            spread = np.percentile([r["minus_truth"] for r in replays], [5, 95])
            rows.append(
                {
                    "method": method,
                    "seed": run_seed,
                    "stream": condition + (f" ({strength})" if strength else ""),
                    "site_labels": count,
                    "unlabelled_cases": int(len(stream["truth"]) - (len(stream["truth"]) * count // len(subjects))),
                    "estimate_minus_truth": round(mean["minus_truth"], 3),
                    "minus_truth_5_95": f"{spread[0]:+.3f} to {spread[1]:+.3f}",
                    "mae": round(mean["mae"], 3),
                    "bound_coverage": round(mean["coverage"], 3),
                    "bound_below_estimate": round(mean["width"], 3),
                    "silent_over_0.03": round(mean["silent"], 3),
                }
            )
    return rows
