"""Calibrated by default (issue 14): every method, with and without temperature scaling, under each model-selection
rule, over seeds.

One training per method and seed keeps every epoch's network (``keep_epoch_weights``) and the validation metrics of
every epoch (``validation_history.json``). Each selection rule of :data:`SELECTION_RULES` then picks its epoch with
:func:`calib_monai.handlers.select_epoch`, the rule ``TrainingCheckpoint`` applies while training, so a row is what a
bundle trained with that ``--selection_metric`` / ``--selection_mode`` / ``--selection_bounds`` would give, without a
training per rule. For each selected network a temperature is fitted as the bundles' ``calibrate`` step fits it (on
the validation volumes' ground-truth foreground voxels), then the test volumes are scored with and without it.

The target (issue 14): ECE <= 0.30x the papers' protocol's (CE+Dice, best validation DSC, no temperature) at a mean
DSC no more than 0.005 below it, on every seed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from calib_monai.bundle_factory.specs import METHODS
from calib_monai.experiments import figures
from calib_monai.experiments.evaluation import TrainedRun, score_volumes
from calib_monai.experiments.posthoc import LocalTemperatureScaling, TemperatureScaling
from calib_monai.experiments.runs import train
from calib_monai.experiments.study import StudySetup, format_mean_std, heading, write_csv, write_table
from calib_monai.handlers import select_epoch

__all__ = ["CALIBRATED_TARGET", "SELECTION_RULES", "calibrated_study", "selection_rules"]

REFERENCE = ("ce_dice", "dsc", "none")  # the papers' protocol: CE+Dice, best validation DSC, no recalibration
CALIBRATIONS = ("none", "temperature", "local temperature")
CALIBRATED_TARGET = {"ece_ratio": 0.30, "dice_drop": 0.005}
COLUMNS = ("mean_dice", "ece", "cece", "tace", "nll")


def selection_rules(ece_bound: float = 0.05) -> dict[str, dict]:
    """The rules a bundle's ``selection_metric`` / ``selection_mode`` / ``selection_bounds`` can express."""
    return {
        "dsc": {"metric_name": "val_mean_dice", "mode": "max", "bounds": {}},  # the papers' rule, bundle default
        "nll": {"metric_name": "val_nll", "mode": "min", "bounds": {}},
        f"dsc_ece{ece_bound:g}": {"metric_name": "val_mean_dice", "mode": "max", "bounds": {"val_ece": float(ece_bound)}},
    }


SELECTION_RULES = selection_rules()


def _bundle_flags(rule: Mapping) -> str:
    flags = f"--selection_metric {rule['metric_name']} --selection_mode {rule['mode']}"
    return flags + (f" --selection_bounds '{json.dumps(rule['bounds'])}'" if rule["bounds"] else "")


def calibrated_study(setup: StudySetup, methods: Sequence[str] = tuple(METHODS), seeds: Sequence[int] = (0, 1),
                     ece_bound: float = 0.05, surface_distances: bool = False, lts_steps: int = 300,
                     command: str = "") -> str:  # fmt: skip
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
                ts = TemperatureScaling().fit(validation)
                calibrations = {"none": None, "temperature": ts}
                if lts_steps > 0 and epoch == chosen["dsc"]:
                    calibrations["local temperature"] = LocalTemperatureScaling(steps=lts_steps, seed=seed).fit(validation)
                del validation
                test = list(run.volumes("test"))
                for calibration, calibrate in calibrations.items():
                    report = score_volumes(test, run.label_names, out, calibrate, surface_distances=surface_distances)
                    means = {k: v["mean"] for k, v in report.summary().items()}
                    rules_here = [r for r, e in chosen.items() if e == epoch]
                    for rule in rules_here if calibration != "local temperature" else ["dsc"]:
                        key = {"seed": seed, "method": method, "selection": rule, "calibration": calibration}
                        temperature = ts.temperature if calibration == "temperature" else float("nan") if calibrate else 1.0
                        per_seed.append({**key, "epoch": epoch, "temperature": temperature,
                                         **{c: means.get(c, float("nan")) for c in (*COLUMNS, "mean_hd95")}})  # fmt: skip
                        per_volume += [{**key, "epoch": epoch, **row} for row in report.rows]
    _add_ratios(per_seed)
    write_csv(out / "per_seed.csv", per_seed)
    write_csv(out / "per_volume.csv", per_volume)
    rows = _summary_rows(per_seed, methods, list(rules), len(seeds), surface_distances)
    table = write_table(rows, out / "calibrated", f"Every method × selection rule × recalibration, mean ± std over seeds {seeds}")
    _ece_figure(rows, methods, list(rules), out / "ece_by_method.png", setup.dataset)
    notes = [
        _verdict(rows),
        "Columns: the mean over test volumes of each seed, then mean ± std over the seeds. `epoch`: the epochs the "
        "rule selected, per seed. `T`: the fitted temperature (global temperature scaling). `ECE / ref` and `Δ DSC`: against the papers' protocol "
        "(CE+Dice, selection by validation DSC, no temperature) of the same seed. `meets`: seeds where ECE <= "
        f"{CALIBRATED_TARGET['ece_ratio']}x the reference's and DSC >= the reference's - {CALIBRATED_TARGET['dice_drop']}.",
        "Selection rules (the bundle flags that train with them; `dsc` is the default):\n\n"
        + "\n".join(f"- `{name}`: `{_bundle_flags(rule)}`" for name, rule in rules.items()),
        "Recalibration, fitted on the validation volumes as `python -m monai.bundle run calibrate` fits it; neither "
        "changes the segmentation, so DSC is the same with and without it. `temperature`: one temperature per "
        "selected network, fitted by NLL on the ground-truth foreground voxels (the bundles' default). `local "
        "temperature` (`--calibration_method local_temperature`): a per-voxel temperature predicted from logits and "
        "image, fitted by NLL on all voxels of the validation slices; for the `dsc` rule's network only.",
        "Figure: `ece_by_method.png`; values per seed: `per_seed.csv`; per test volume: `per_volume.csv`.",
    ]
    setup.write_readme("calibrated", f"Calibrated by default on {setup.dataset}", command or "(called from Python)",
                       [table, *notes], specs)  # fmt: skip
    return table


def _add_ratios(per_seed: list[dict]) -> None:
    """ECE ratio and DSC change against the reference row of the same seed; whether the target is met."""
    reference = {r["seed"]: r for r in per_seed if (r["method"], r["selection"], r["calibration"]) == REFERENCE}
    for row in per_seed:
        ref = reference[row["seed"]]
        row["ece_ratio"] = row["ece"] / ref["ece"]
        row["dice_change"] = row["mean_dice"] - ref["mean_dice"]
        row["meets"] = bool(row["ece_ratio"] <= CALIBRATED_TARGET["ece_ratio"]
                            and row["dice_change"] >= -CALIBRATED_TARGET["dice_drop"])  # fmt: skip


def _summary_rows(per_seed: Sequence[Mapping], methods: Sequence[str], rules: Sequence[str], n_seeds: int,
                  surface_distances: bool) -> list[dict]:  # fmt: skip
    columns = (*COLUMNS, "mean_hd95") if surface_distances else COLUMNS
    rows = []
    for method in methods:
        for rule in rules:
            for calibration in CALIBRATIONS:
                mine = [r for r in per_seed if (r["method"], r["selection"], r["calibration"]) == (method, rule, calibration)]
                if not mine:
                    continue

                def cell(key: str, digits: int = 3) -> str:
                    values = np.array([r[key] for r in mine], dtype=np.float64)
                    return format_mean_std(float(values.mean()), float(values.std()) if len(values) > 1 else None, digits)

                rows.append({"method": method, "selection": rule, "calibration": calibration,
                             "epoch": "/".join(str(r["epoch"]) for r in mine),
                             "T": cell("temperature", 2) if calibration == "temperature" else "",
                             **{heading(c): cell(c) for c in columns}, "ECE / ref": cell("ece_ratio", 2),
                             "Δ DSC": cell("dice_change"), "meets": f"{sum(r['meets'] for r in mine)}/{n_seeds}"})  # fmt: skip
    return rows


def _mean(cell: str) -> float:
    return float(cell.split(" ± ")[0])


def _verdict(rows: Sequence[Mapping]) -> str:
    """Which configuration reaches the target on every seed, or which comes closest (lowest ECE ratio among those
    within the DSC margin on average)."""
    met = [r for r in rows if r["meets"].split("/")[0] == r["meets"].split("/")[1]]
    within = [r for r in rows if _mean(r["Δ DSC"]) >= -CALIBRATED_TARGET["dice_drop"]]
    name = lambda r: f"{r['method']}, selection `{r['selection']}`, calibration {r['calibration']}"  # noqa: E731
    if met:
        best = min(met, key=lambda r: _mean(r["ECE / ref"]))
        head = (f"**Target met** on every seed by {len(met)} configuration(s); the best is {name(best)}: ECE "
                f"{best['ECE']} ({best['ECE / ref']} of the reference), DSC {best['mean DSC']} (Δ {best['Δ DSC']}).")
    elif within:
        best = min(within, key=lambda r: _mean(r["ECE / ref"]))
        head = (f"**Target not met.** Closest: {name(best)}: ECE {best['ECE']} ({best['ECE / ref']} of the "
                f"reference, target {CALIBRATED_TARGET['ece_ratio']}), DSC {best['mean DSC']} (Δ {best['Δ DSC']}); "
                f"met on {best['meets']} seeds.")
    else:
        head = "**Target not met**: no configuration keeps the DSC within the margin."
    return head


def _ece_figure(rows: Sequence[Mapping], methods: Sequence[str], rules: Sequence[str], path: Path, dataset: str) -> None:
    """ECE per method for each selection rule and recalibration (mean over seeds)."""
    short = {"none": "", "temperature": " + T", "local temperature": " + local T"}
    series = {}
    for rule in rules:
        for calibration in CALIBRATIONS:
            values = [next((_mean(r["ECE"]) for r in rows if (r["method"], r["selection"], r["calibration"]) ==
                            (method, rule, calibration)), float("nan")) for method in methods]  # fmt: skip
            if not all(np.isnan(values)):
                series[f"{rule}{short[calibration]}"] = values
    figures.grouped_bars(list(methods), series, path, "test ECE (mean over volumes)",
                         f"{dataset}: ECE by method, selection rule and recalibration")  # fmt: skip
