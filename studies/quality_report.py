"""Tables, figures and README of the case-quality study (:mod:`studies.quality`).

Every number is computed from the per-volume records the study collected: per seed and configuration (method x
recalibration) first, then the mean (± std) over seeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calib_monai.metrics import failure_detection_summary, quality_agreement, save_risk_coverage_plot
from studies import figures
from studies.corruptions import CORRUPTIONS
from studies.study import StudySetup, format_mean_std, load_targets, write_csv, write_table

__all__ = ["configuration_rows", "write_quality_results"]

DEFAULT_RULE = "score_or_input"  # the bundles' review rule (bundle_factory.calibration.REVIEW)


def _targets() -> dict:
    return load_targets("quality")  # docs/results/targets.json


ID = "in-distribution"


def _values(rows: Sequence[Mapping], column: str) -> np.ndarray:
    return np.array([float(r.get(column, np.nan)) for r in rows], dtype=np.float64)


def _mean(rows: Sequence[Mapping], column: str) -> float:
    v = _values(rows, column)
    return float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")


def _rate(rows: Sequence[Mapping], column: str) -> float:
    return float(np.mean([bool(r[column]) for r in rows])) if rows else float("nan")


def _shifts(records: Sequence[Mapping]) -> list[tuple[str, float]]:
    """The shifted conditions in order: each corruption at each strength, then the other data set."""
    seen = list(dict.fromkeys((r["condition"], float(r["strength"])) for r in records if r["condition"] != ID))
    order = {kind: i for i, kind in enumerate(CORRUPTIONS)}
    return sorted(seen, key=lambda c: (order.get(c[0], len(order)), c[1]))


def _strongest(shifts: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """The strongest strength of each corruption, and the other data set."""
    best: dict[str, float] = {}
    for kind, strength in shifts:
        best[kind] = max(best.get(kind, strength), strength)
    return list(best.items())


def configuration_rows(records: Sequence[Mapping], rules: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (seed, method, calibration): calibration, estimate quality, failure detection and flag rates."""
    groups: dict[tuple, list[Mapping]] = {}
    for r in records:
        groups.setdefault((r["seed"], r["method"], r["calibration"]), []).append(r)
    shifts = _shifts(records)
    out = []
    for (seed, method, calibration), rows in groups.items():
        ind = [r for r in rows if r["condition"] == ID]
        labelled = [r for r in rows if np.isfinite(float(r.get("mean_dice", np.nan)))]
        row: dict[str, Any] = {"seed": seed, "method": method, "calibration": calibration}
        for column in ("mean_dice", "ece", "ece_all", "ece_band", "volume_error_prob", "volume_error_pred"):
            row[column] = _mean(ind, column)
        for score in ("est_mean_dice", "mean_confidence", "pairwise_dice"):
            if not np.isfinite(_values(ind, score)).any():
                continue
            tag = {"est_mean_dice": "est", "mean_confidence": "conf", "pairwise_dice": "pairwise"}[score]
            true = _values(ind, "mean_dice")
            agreement = quality_agreement(_values(ind, score), true)
            detection = failure_detection_summary(_values(ind, score), 1 - true)
            row[f"spearman_{tag}"], row[f"aurc_{tag}"] = agreement["spearman"], detection["aurc"]
            row[f"gap_{tag}"], row[f"augrc_{tag}"] = detection["aurc_gap_closed"], detection["augrc"]
            if tag != "conf":  # a DSC estimate: its error in DSC units
                row[f"mae_{tag}"], row[f"bias_{tag}"] = agreement["mae"], agreement["bias"]
            if len(labelled) > len(ind):  # the in-distribution and corrupted volumes together: DSC spreads
                mixed = failure_detection_summary(_values(labelled, score), 1 - _values(labelled, "mean_dice"))
                row[f"gap_mixed_{tag}"] = mixed["aurc_gap_closed"]
                row[f"spearman_mixed_{tag}"] = quality_agreement(
                    _values(labelled, score), _values(labelled, "mean_dice")
                )["spearman"]
        for rule in rules:
            if f"flag_{rule}" not in ind[0]:
                continue
            row[f"fpr_{rule}"] = _rate(ind, f"flag_{rule}")
            for kind, strength in shifts:
                shifted = [r for r in rows if r["condition"] == kind and float(r["strength"]) == strength]
                row[f"tpr_{rule}_{kind}_{strength:g}"] = _rate(shifted, f"flag_{rule}")
                if kind in CORRUPTIONS:
                    row[f"dice_{kind}_{strength:g}"] = _mean(shifted, "mean_dice")
        out.append(row)
    return out


def _over_seeds(rows: Sequence[Mapping], columns: Sequence[str], digits: int = 3) -> list[dict[str, str]]:
    """Mean ± std over the seeds of each (method, calibration)."""
    groups: dict[tuple, list[Mapping]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["calibration"]), []).append(r)
    out = []
    for (method, calibration), mine in groups.items():
        cells = {"method": method, "calibration": calibration}
        for c in columns:
            v = _values(mine, c)
            cells[c] = (
                ""
                if not np.isfinite(v).any()
                else format_mean_std(float(np.nanmean(v)), float(np.nanstd(v)) if len(v) > 1 else None, digits)
            )
        out.append(cells)
    return out


def _means(rows: Sequence[Mapping]) -> dict[tuple, dict[str, float]]:
    groups: dict[tuple, list[Mapping]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["calibration"]), []).append(r)
    return {k: {c: _mean(v, c) for c in v[0] if c not in ("seed", "method", "calibration")} for k, v in groups.items()}


def _verdict(means: Mapping[tuple, Mapping[str, float]], rule: str, strongest) -> tuple[str, tuple]:
    """Which configuration is best (largest in-distribution gap closed by the estimate) and which targets hold."""
    best = max(means, key=lambda k: np.nan_to_num(means[k].get("gap_est", np.nan), nan=-9))
    m = means[best]
    lines = [
        f"Best configuration by in-distribution AURC gap closed: **{best[0]} + {best[1]}** "
        f"(mean over seeds): Spearman {m['spearman_est']:.2f} (target >= {_targets()['spearman']}), MAE "
        f"{m['mae_est']:.3f} (target <= {_targets()['mae']}), gap closed {m['gap_est']:.0%} (target >= "
        f"{_targets()['gap']:.0%})."
    ]
    for method in dict.fromkeys(k[0] for k in means):
        mine = {k: v for k, v in means.items() if k[0] == method}
        k = min(mine, key=lambda k: np.nan_to_num(mine[k].get("mae_est", np.nan), nan=9))
        lines.append(
            f"- {method}: lowest MAE with `{k[1]}`: {mine[k]['mae_est']:.3f} (target <= "
            f"{_targets()['mae_every_method']}; "
            f"{'met' if mine[k]['mae_est'] <= _targets()['mae_every_method'] else 'missed'})"
        )
    fpr = m.get(f"fpr_{rule}", np.nan)
    tprs = {f"{kind} {strength:g}": m.get(f"tpr_{rule}_{kind}_{strength:g}", np.nan) for kind, strength in strongest}
    lines.append(
        f"Review flag (`{rule}`) of that configuration: in-distribution false positives {fpr:.0%} (target <= "
        f"{_targets()['fpr']:.0%}); caught: "
        + ", ".join(f"{k} {v:.0%}" for k, v in tprs.items())
        + f" (target >= {_targets()['tpr']:.0%} for the other data set and the strongest corruption)."
    )
    return "\n".join(lines), best


def write_quality_results(
    setup: StudySetup,
    out: Path,
    records: list[dict],
    ensemble: list[dict],
    timings: list[dict],
    specs,
    seeds: Sequence[int],
    methods: Sequence[str],
    alpha: float,
    other_dataset: str,
    command: str,
    rules: Sequence[str],
) -> str:
    """Write every table, figure and the README of the study from its per-volume records; ``rules``: the names of
    the review rules whose ``flag_<rule>`` the records carry."""
    rules = list(rules)
    write_csv(out / "per_volume.csv.gz", records + ensemble)  # every volume x condition: MBs as text
    per_seed = configuration_rows(records, rules)
    write_csv(out / "per_seed.csv", per_seed)
    strongest = _strongest(_shifts(records))
    main_columns = [
        "mean_dice",
        "ece",
        "ece_all",
        "ece_band",
        "volume_error_prob",
        "spearman_est",
        "mae_est",
        "gap_est",
        "spearman_conf",
        "gap_conf",
        "gap_mixed_est",
        f"fpr_{DEFAULT_RULE}",
    ]
    table = write_table(
        _over_seeds(per_seed, main_columns),
        out / "quality",
        f"Case quality on the in-distribution test volumes, mean ± std over seeds {list(seeds)}",
    )
    flag_columns = [f"fpr_{r}" for r in rules] + [f"tpr_{r}_{k}_{s:g}" for r in rules for k, s in strongest]
    flags = write_table(
        _over_seeds(per_seed, flag_columns, 2),
        out / "flags",
        "Review flag: share of volumes flagged, in-distribution (fpr) and per shift at its strongest (tpr)",
    )
    shift_columns = [f"tpr_{DEFAULT_RULE}_{k}_{s:g}" for k, s in _shifts(records)]
    write_table(
        _over_seeds(per_seed, shift_columns, 2),
        out / "flags_by_strength",
        f"Flagged share by strength (`{DEFAULT_RULE}` rule)",
    )
    dice_columns = [f"dice_{k}_{s:g}" for k, s in _shifts(records) if k in CORRUPTIONS]
    write_table(_over_seeds(per_seed, dice_columns), out / "dice_under_shift", "Mean DSC under each corruption")
    sections = [table, flags]
    if ensemble:
        ens_rows = configuration_rows(ensemble, [])
        sections.append(
            write_table(
                _over_seeds(
                    ens_rows,
                    [
                        "mean_dice",
                        "ece",
                        "ece_all",
                        "spearman_est",
                        "mae_est",
                        "gap_est",
                        "spearman_pairwise",
                        "gap_pairwise",
                    ],
                ),
                out / "ensemble",
                f"Ensemble of seeds {list(seeds)} (mean probabilities)",
            )
        )
    means = _means(per_seed)
    verdict, best = _verdict(means, DEFAULT_RULE, strongest)
    _figures(out, records, best, methods, setup.dataset)
    cost = _cost(timings, len(seeds))
    notes = [
        verdict,
        "Columns (means over the in-distribution test volumes, then mean ± std over seeds): `mean_dice` true mean "
        "DSC; `ece` on ground-truth foreground voxels (the papers), `ece_all` on every voxel, `ece_band` on the "
        "voxels within 3 voxels of the predicted or true structures; `volume_error_prob` mean |expected volume "
        "(summed probabilities) - true volume| / true volume; `*_est`: the estimated mean DSC as the case score "
        "(Spearman and MAE against the true mean DSC; `gap` the share of the random-to-oracle AURC gap closed with "
        "risk 1 - DSC); `*_conf`: the mean confidence of the predicted foreground as the case score; "
        "`gap_mixed_est`: the gap over the in-distribution and all corrupted test volumes together; "
        f"`fpr_{DEFAULT_RULE}`: "
        f"share of in-distribution test volumes flagged by the bundles' review rule (alpha {alpha}).",
        "Review rules: `score`: flag below the k-th lowest validation case score, k = max(1, floor(alpha (n + 1))); "
        "`score_or_volume`: also when a structure's expected volume is outside the validation range widened 1.5x; "
        "`score_or_input`: also when the image's per-channel intensity mean and standard deviation lie further from "
        "the validation images' (in their standard deviations) than all but k-1 validation images (leave-one-out).",
        "Recalibrations, fitted on the validation volumes: `temperature` by NLL on ground-truth foreground voxels "
        "(the bundles' calibrate default), `temperature_all` on all voxels (`--calibration_voxels all`), "
        "`local_temperature` (`--calibration_method local_temperature`).",
        cost,
        "Files: `per_volume.csv.gz` (every volume of every configuration and condition), `per_seed.csv`, "
        "`flags_by_strength.md`, `dice_under_shift.md`, `estimate_vs_true.png`, `risk_coverage_best.png`, "
        "`flag_rates.png`.",
    ]
    setup.write_readme(
        "quality",
        f"Case quality and review flags on {setup.dataset}",
        command or "(called from Python)",
        [*sections, *notes],
        specs,
        seeds,
    )
    return table


def _cost(timings: Sequence[Mapping], seeds: int) -> str:
    if not timings:
        return ""
    per_volume = np.mean([t["inference_s"] / max(t["volumes"], 1) for t in timings])
    return (
        f"Cost: one model's inference took {per_volume:.3f} s per test volume on this machine; the ensemble of "
        f"{seeds} seeds costs {seeds}x that (and {seeds}x the training)."
    )


def _figures(out: Path, records: Sequence[Mapping], best: tuple, methods: Sequence[str], dataset: str) -> None:
    method, calibration = best
    ind = [r for r in records if r["condition"] == ID and r["calibration"] == calibration and r["method"] == method]
    if len(ind) >= 2:
        save_risk_coverage_plot(
            _values(ind, "est_mean_dice"),
            1 - _values(ind, "mean_dice"),
            out / "risk_coverage_best.png",
            title=f"{dataset}: {method} + {calibration}, in-distribution test volumes, all seeds",
        )
    points = {}
    for m in methods:
        mine = [r for r in records if r["condition"] == ID and r["calibration"] == calibration and r["method"] == m]
        points[m] = (_values(mine, "mean_dice"), _values(mine, "est_mean_dice"))
    figures.scatter_panels(
        points,
        out / "estimate_vs_true.png",
        "true mean DSC",
        "estimated mean DSC",
        f"{dataset}: {calibration}, in-distribution test volumes",
    )
    shifts = _shifts(records)
    rates = {}
    for m in methods:
        mine = [r for r in records if r["method"] == m and r["calibration"] == calibration]
        rates[m] = [
            _rate([r for r in mine if (r["condition"], float(r["strength"])) == c], f"flag_{DEFAULT_RULE}")
            for c in shifts
        ]
    figures.grouped_bars(
        [f"{k} {s:g}" if k in CORRUPTIONS else k for k, s in shifts],
        rates,
        out / "flag_rates.png",
        "share flagged",
        f"{dataset}: review flag per shift ({calibration})",
    )
