"""Calibrated by default: every method, with and without temperature scaling, under each model-selection
rule, over seeds.

One training per method and seed keeps every epoch's network (``keep_epoch_weights``) and the validation metrics of
every epoch (``validation_history.json``). Each selection rule of :data:`SELECTION_RULES` then picks its epoch with
:func:`calib_monai.handlers.select_epoch`, the rule ``TrainingCheckpoint`` applies while training, so a row is what a
bundle trained with that ``--selection_metric`` / ``--selection_mode`` / ``--selection_bounds`` would give, without a
training per rule. For each selected network a temperature is fitted as the bundles' ``calibrate`` step fits it (on
the validation volumes' ground-truth foreground voxels), then the test volumes are scored with and without it.

The target (``docs/results/targets.json``, ``calibrated``): ECE <= 0.30x the papers' protocol's (CE+Dice, best
validation DSC, no temperature) at a mean
DSC no more than 0.005 below it, on every seed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from bundle_factory.specs import METHODS
from calib_monai.defaults import LTS_STEPS
from calib_monai.handlers import select_epoch
from studies import figures
from studies.evaluation import TrainedRun, score_volumes
from studies.posthoc import VolumeLocalTemperature, VolumeTemperature
from studies.runs import train
from studies.study import StudySetup, format_mean_std, heading, load_targets, write_csv, write_table

__all__ = ["SELECTION_RULES", "calibrated_study", "selection_rules"]

REFERENCE = ("ce_dice", "dsc", "none")  # the papers' protocol: CE+Dice, best validation DSC, no recalibration
CALIBRATIONS = ("none", "temperature", "local temperature")


def _target() -> dict:
    return load_targets("calibrated")


COLUMNS = ("mean_dice", "ece", "cece", "tace", "nll")


def selection_rules(ece_bound: float = 0.05) -> dict[str, dict]:
    """The rules a bundle's ``selection_metric`` / ``selection_mode`` / ``selection_bounds`` can express."""
    return {
        "dsc": {"metric_name": "val_mean_dice", "mode": "max", "bounds": {}},  # the papers' rule, bundle default
        "nll": {"metric_name": "val_nll", "mode": "min", "bounds": {}},
        f"dsc_ece{ece_bound:g}": {
            "metric_name": "val_mean_dice",
            "mode": "max",
            "bounds": {"val_ece": float(ece_bound)},
        },
    }


SELECTION_RULES = selection_rules()


def _bundle_flags(rule: Mapping) -> str:
    flags = f"--selection_metric {rule['metric_name']} --selection_mode {rule['mode']}"
    return flags + (f" --selection_bounds '{json.dumps(rule['bounds'])}'" if rule["bounds"] else "")


def calibrated_study(
    setup: StudySetup,
    methods: Sequence[str] = tuple(METHODS),
    seeds: Sequence[int] = (0, 1),
    ece_bound: float = 0.05,
    surface_distances: bool = False,
    lts_steps: int = LTS_STEPS,
    command: str = "",
) -> str:
    """Train ``methods`` for every seed (runs reused when finished), apply each selection rule, fit a temperature per
    selected network and score the test volumes with and without it; write ``<results_dir>/calibrated``: the table
    (mean ± std over seeds of each seed's mean over test volumes), ``per_seed.csv``, ``per_volume.csv``,
    ``ece_by_method.png`` and README. ``surface_distances`` adds HD95 (slow). Local temperature scaling
    (``lts_steps`` Adam steps; 0: none) is fitted for the default rule's network only, to bound the time."""
    methods = setup.check_methods(methods)
    if "ce_dice" not in methods:
        raise ValueError("the calibrated study compares against CE+Dice: include 'ce_dice' in methods")
    seeds = [int(s) for s in ([seeds] if isinstance(seeds, int) else seeds)]
    rules = selection_rules(ece_bound)
    out = setup.study_dir("calibrated")
    per_seed, per_volume, specs = [], [], []
    for seed in seeds:
        seeded = setup.seeded(seed)
        for method in methods:
            spec = seeded.spec(method, "", {"keep_epoch_weights": True})
            train(spec)
            specs.append(spec)
            history = json.loads((spec.models_dir / "validation_history.json").read_text())
            chosen = {name: select_epoch(history, **rule) for name, rule in rules.items()}
            for epoch in sorted(set(chosen.values())):
                run = TrainedRun(spec.run_dir, checkpoint=f"epoch_{epoch}.pt")
                validation = list(run.volumes("validation"))
                ts = VolumeTemperature().fit(validation)
                calibrations = {"none": None, "temperature": ts}
                if lts_steps > 0 and epoch == chosen["dsc"]:
                    calibrations["local temperature"] = VolumeLocalTemperature(steps=lts_steps, seed=seed).fit(
                        validation
                    )
                del validation
                test = list(run.volumes("test"))
                for calibration, calibrate in calibrations.items():
                    report = score_volumes(test, run.label_names, out, calibrate, surface_distances=surface_distances)
                    means = {k: v["mean"] for k, v in report.summary().items()}
                    rules_here = [r for r, e in chosen.items() if e == epoch]
                    for rule in rules_here if calibration != "local temperature" else ["dsc"]:
                        key = {"seed": seed, "method": method, "selection": rule, "calibration": calibration}
                        temperature = (
                            ts.temperature if calibration == "temperature" else float("nan") if calibrate else 1.0
                        )
                        per_seed.append(
                            {
                                **key,
                                "epoch": epoch,
                                "temperature": temperature,
                                **{c: means.get(c, float("nan")) for c in (*COLUMNS, "mean_hd95")},
                            }
                        )
                        per_volume += [{**key, "epoch": epoch, **row} for row in report.rows]
    _add_ratios(per_seed)
    write_csv(out / "per_seed.csv", per_seed)
    write_csv(out / "per_volume.csv", per_volume)
    rows = _summary_rows(per_seed, methods, list(rules), len(seeds), surface_distances)
    table = write_table(
        rows, out / "calibrated", f"Every method × selection rule × recalibration, mean ± std over seeds {seeds}"
    )
    _ece_figure(per_seed, methods, list(rules), out / "ece_by_method.png", setup.dataset)
    notes = [
        _verdict(per_seed, rows),
        "Columns: the mean over test volumes of each seed, then mean ± std over the seeds. `epoch`: the epochs the "
        "rule selected, per seed. `T`: the fitted temperature (global temperature scaling). `ECE / ref` and "
        "`Δ DSC`: against the papers' protocol "
        "(CE+Dice, selection by validation DSC, no temperature) of the same seed. `meets`: seeds where ECE <= "
        f"{_target()['ece_ratio']}x the reference's and DSC >= the reference's - {_target()['dice_drop']}.",
        "Selection rules (the bundle flags that train with them; `dsc` is the default):\n\n"
        + "\n".join(f"- `{name}`: `{_bundle_flags(rule)}`" for name, rule in rules.items()),
        "Recalibration, fitted on the validation volumes as `python -m monai.bundle run calibrate` fits it; neither "
        "changes the segmentation, so DSC is the same with and without it. `temperature`: one temperature per "
        "selected network, fitted by NLL on the ground-truth foreground voxels (the bundles' default). `local "
        "temperature` (`--calibration_method local_temperature`): a per-voxel temperature predicted from logits and "
        "image, fitted by NLL on all voxels of the validation slices; for the `dsc` rule's network only.",
        "Figure: `ece_by_method.png`; values per seed: `per_seed.csv`; per test volume: `per_volume.csv`.",
    ]
    setup.write_readme(
        "calibrated",
        f"Calibrated by default on {setup.dataset}",
        command or "(called from Python)",
        [table, *notes],
        specs,
        seeds,
    )
    return table


def _add_ratios(per_seed: list[dict]) -> None:
    """ECE ratio and DSC change against the reference row of the same seed; whether the target is met."""
    reference = {r["seed"]: r for r in per_seed if (r["method"], r["selection"], r["calibration"]) == REFERENCE}
    for row in per_seed:
        ref = reference[row["seed"]]
        row["ece_ratio"] = row["ece"] / ref["ece"]
        row["dice_change"] = row["mean_dice"] - ref["mean_dice"]
        row["meets"] = bool(
            row["ece_ratio"] <= _target()["ece_ratio"] and row["dice_change"] >= -_target()["dice_drop"]
        )


def _groups(per_seed: Sequence[Mapping]) -> dict[tuple[str, str, str], list[Mapping]]:
    """The seeds' rows of each (method, selection rule, recalibration), in order of appearance."""
    groups: dict[tuple[str, str, str], list[Mapping]] = {}
    for row in per_seed:
        groups.setdefault((row["method"], row["selection"], row["calibration"]), []).append(row)
    return groups


def _mean(rows: Sequence[Mapping], key: str) -> float:
    return float(np.mean([float(r[key]) for r in rows]))


def _summary_rows(
    per_seed: Sequence[Mapping], methods: Sequence[str], rules: Sequence[str], n_seeds: int, surface_distances: bool
) -> list[dict]:
    columns = (*COLUMNS, "mean_hd95") if surface_distances else COLUMNS
    groups = _groups(per_seed)
    rows = []
    for key in ((m, r, c) for m in methods for r in rules for c in CALIBRATIONS):
        mine = groups.get(key)
        if not mine:
            continue

        def cell(name: str, digits: int = 3, mine: list = mine) -> str:
            values = np.array([r[name] for r in mine], dtype=np.float64)
            return format_mean_std(float(values.mean()), float(values.std()) if len(values) > 1 else None, digits)

        method, rule, calibration = key
        rows.append(
            {
                "method": method,
                "selection": rule,
                "calibration": calibration,
                "epoch": "/".join(str(r["epoch"]) for r in mine),
                "T": cell("temperature", 2) if calibration == "temperature" else "",
                **{heading(c): cell(c) for c in columns},
                "ECE / ref": cell("ece_ratio", 2),
                "Δ DSC": cell("dice_change"),
                "meets": f"{sum(r['meets'] for r in mine)}/{n_seeds}",
            }
        )
    return rows


def _verdict(per_seed: Sequence[Mapping], summary: Sequence[Mapping]) -> str:
    """Which configuration reaches the target on every seed, or which comes closest (lowest mean ECE ratio among
    those within the DSC margin on average); ``summary`` (:func:`_summary_rows`) gives the cells it quotes."""
    groups = _groups(per_seed)
    met = [k for k, rows in groups.items() if all(r["meets"] for r in rows)]
    within = [k for k, rows in groups.items() if _mean(rows, "dice_change") >= -_target()["dice_drop"]]
    if not met and not within:
        return "**Target not met**: no configuration keeps the DSC within the margin."
    best_key = min(met or within, key=lambda k: _mean(groups[k], "ece_ratio"))
    best = next(r for r in summary if (r["method"], r["selection"], r["calibration"]) == best_key)
    name = f"{best['method']}, selection `{best['selection']}`, calibration {best['calibration']}"
    if met:
        return (
            f"**Target met** on every seed by {len(met)} configuration(s); the best is {name}: ECE "
            f"{best['ECE']} ({best['ECE / ref']} of the reference), DSC {best['mean DSC']} (Δ {best['Δ DSC']})."
        )
    return (
        f"**Target not met.** Closest: {name}: ECE {best['ECE']} ({best['ECE / ref']} of the reference, target "
        f"{_target()['ece_ratio']}), DSC {best['mean DSC']} (Δ {best['Δ DSC']}); met on {best['meets']} seeds."
    )


def _ece_figure(
    per_seed: Sequence[Mapping], methods: Sequence[str], rules: Sequence[str], path: Path, dataset: str
) -> None:
    """ECE per method for each selection rule and recalibration (mean over seeds)."""
    short = {"none": "", "temperature": " + T", "local temperature": " + local T"}
    groups = _groups(per_seed)
    series = {}
    for rule in rules:
        for calibration in CALIBRATIONS:
            values = [
                _mean(groups[(m, rule, calibration)], "ece") if (m, rule, calibration) in groups else float("nan")
                for m in methods
            ]
            if not all(np.isnan(values)):
                series[f"{rule}{short[calibration]}"] = values
    figures.grouped_bars(
        list(methods),
        series,
        path,
        "test ECE (mean over volumes)",
        f"{dataset}: ECE by method, selection rule and recalibration",
    )
