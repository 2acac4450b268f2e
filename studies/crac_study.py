"""The CRaC ablation: presets, tolerance, margin, averaging and rho0 against CE+Dice and NACL, over seeds.

Every variant is the ``crac`` bundle with ``loss#<option>`` overrides; CE+Dice and NACL are their bundles' runs at
the same budget and seed. For each seed the study ranks CE+Dice, NACL and one CRaC variant at a time (the CRaC
paper's Friedman rank over its Table 1 columns DSC, HD95, ECE, TACE), divides the variant's ECE by CE+Dice's, reads
the validation ECE of every epoch from the run's ``validation_history.json`` to see whether it climbs and the ALM
multipliers from its ``alm_history.json``, and checks the target of ``docs/results/targets.json`` (``crac_ablation``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy.stats import wilcoxon

from calib_monai.losses.crac import PRESETS
from calib_monai.metrics import friedman_rank
from studies import figures
from studies.evaluation import evaluate_run
from studies.study import StudySetup, format_mean_std, heading, load_targets, write_csv, write_table

__all__ = ["CRAC_VARIANTS", "crac_ablation_study", "validation_curve", "ece_climb", "alm_health", "paired_differences"]


def _preset(name: str, **changes: object) -> dict[str, object]:
    """Bundle overrides (``loss#<option>``) of a :data:`~calib_monai.losses.crac.PRESETS` entry with ``changes``."""
    return {f"loss#{k}": v for k, v in {**PRESETS[name], **changes}.items()}


# variant name -> the crac bundle's loss overrides; the "tolerance" family changes one option at a time
CRAC_VARIANTS: dict[str, dict[str, object]] = {
    "paper": _preset("paper"),
    "authors": _preset("authors"),
    "tol0.5_rho1": _preset("tolerance", tolerance=0.5, rho_init=1.0),
    "tol1_rho1": _preset("tolerance", tolerance=1.0, rho_init=1.0),
    "tol1.5_rho1": _preset("tolerance", tolerance=1.5, rho_init=1.0),
    "tol2_rho1": _preset("tolerance", tolerance=2.0, rho_init=1.0),
    "tol1_rho0.1": _preset("tolerance", tolerance=1.0, rho_init=0.1),
    "tol1_rho1_margin5": _preset("tolerance", tolerance=1.0, rho_init=1.0, inner_margin=5.0),
    "tol1_rho1_all_padded": _preset("tolerance", tolerance=1.0, rho_init=1.0, multiplier_average="all_padded"),
}
RANKED = (("mean_dice", True), ("mean_hd95", False), ("ece", False), ("tace", False))  # CRaC's Table 1 columns
COLUMNS = ("mean_dice", "mean_hd95", "ece", "cece", "tace")


def validation_curve(models_dir: str | Path) -> list[float]:
    """Validation ECE per epoch from a run's ``validation_history.json`` (``ValidationHistory``'s record)."""
    path = Path(models_dir) / "validation_history.json"
    history = json.loads(path.read_text()) if path.is_file() else []
    return [float(entry["val_ece"]) for entry in sorted(history, key=lambda e: e["epoch"]) if "val_ece" in entry]


def ece_climb(curve: Sequence[float]) -> float:
    """Mean validation ECE over the last third of the epochs minus the mean over the middle third.

    Positive: the ECE rises in the second half of training (CRaC as the paper writes it climbed every epoch here);
    a network that settles gives about 0. NaN with fewer than 3 epochs."""
    n = len(curve)
    if n < 3:
        return float("nan")
    third = n // 3
    return float(np.mean(curve[n - third :]) - np.mean(curve[third : n - third]))


def alm_health(models_dir: str | Path) -> dict[str, float]:
    """From the last outer step of a run's ``alm_history.json`` (``ALMUpdateHandler``'s record): the largest lambda
    and the mean satisfied fraction over classes and regions; NaN without a record (runs of losses without ALM)."""
    path = Path(models_dir) / "alm_history.json"
    history = json.loads(path.read_text()) if path.is_file() else []
    if not history:
        return {"lambda_max": float("nan"), "satisfied": float("nan")}
    last = max(history, key=lambda r: r["epoch"])
    entries = [region for regions in last["classes"].values() for region in regions.values()]
    return {
        "lambda_max": max(e["lambda"] for e in entries),
        "satisfied": float(np.mean([e["satisfied"] for e in entries])),
    }


def crac_ablation_study(
    setup: StudySetup, variants: Sequence[str] = tuple(CRAC_VARIANTS), seeds: Sequence[int] = (0, 1), command: str = ""
) -> str:
    """Train CE+Dice, NACL and the CRaC ``variants`` (keys of :data:`CRAC_VARIANTS`) for every seed; write
    ``<results_dir>/crac_ablation``: the table (mean ± std over seeds of each seed's mean over test volumes),
    ``per_seed.csv``, ``per_volume.csv``, ``val_ece_seed<s>.png`` and README."""
    variants = [variants] if isinstance(variants, str) else list(variants)
    unknown = [v for v in variants if v not in CRAC_VARIANTS]
    if unknown or not variants:
        raise ValueError(f"variants must be among {list(CRAC_VARIANTS)}, got {variants}")
    seeds = [int(s) for s in ([seeds] if isinstance(seeds, int) else seeds)]
    target = load_targets("crac_ablation")
    out = setup.study_dir("crac_ablation")
    entries = [("CE+Dice", "ce_dice", "", {}), ("NACL", "nacl", "", {})]
    entries += [(f"CRaC {v}", "crac", v, CRAC_VARIANTS[v]) for v in variants]
    per_seed, per_volume, specs = [], [], []
    for seed in seeds:
        seeded = setup.seeded(seed)
        curves, results = {}, {}
        for name, method, variant, extra in entries:
            spec = seeded.spec(method, variant, extra)
            run = seeded.trained(method, variant, extra)
            specs.append(spec)
            report = evaluate_run(run, "test")
            results[name] = {k: v["mean"] for k, v in report.summary().items()}
            per_volume += [{"seed": seed, "method": name, **row} for row in report.rows]
            curves[name] = validation_curve(spec.models_dir)
            results[name].update(climb=ece_climb(curves[name]), **alm_health(spec.models_dir))
        per_seed += _score_seed(seed, results, target)
        figures.line_plot(
            list(range(1, 1 + max(len(c) for c in curves.values()))),
            {n: c + [float("nan")] * (max(len(x) for x in curves.values()) - len(c)) for n, c in curves.items()},
            out / f"val_ece_seed{seed}.png",
            "epoch",
            "validation ECE",
            f"{setup.dataset}, seed {seed}: validation ECE per epoch",
        )
    write_csv(out / "per_seed.csv", per_seed)
    write_csv(out / "per_volume.csv", per_volume)
    table = write_table(
        _summary_rows(per_seed, [e[0] for e in entries]),
        out / "crac_ablation",
        f"CRaC variants against CE+Dice and NACL, mean ± std over seeds {seeds}",
    )
    paired = [
        paired_differences(per_volume, seed, name, reference)
        for seed in seeds
        for name, *_ in entries[2:]
        for reference in ("NACL", "CE+Dice")
    ]
    write_csv(out / "paired_per_seed.csv", paired)  # the values; write_table writes the formatted paired.csv/.md
    paired_table = write_table(
        [_paired_cells(r) for r in paired],
        out / "paired",
        "Per test volume, CRaC minus the reference: mean difference (Wilcoxon signed-rank p)",
    )
    legend = "\n".join(
        f"- `{v}`: " + ", ".join(f"{k.split('#')[1]}={val}" for k, val in CRAC_VARIANTS[v].items()) for v in variants
    )
    notes = [
        "Friedman rank: for each seed, CE+Dice, NACL and that CRaC variant ranked on mean DSC, HD95, ECE and TACE "
        "(CRaC paper, Table 1 columns), averaged over the four (lower is better); CE+Dice's and NACL's rows show "
        "their rank against the best CRaC variant of that seed. `ECE / CE+Dice`: the ratio per seed. `val ECE "
        "climb`: mean validation ECE over the last third of the epochs minus the middle third. `meets`: seeds "
        f"where rank <= NACL's, ECE <= {target['ece_ratio']}x CE+Dice's and climb <= {target['climb']} "
        f"(`docs/results/targets.json`: {target['source']}). "
        "`lambda max`, `satisfied`: the last ALM step's largest multiplier and mean fraction of validation pixels "
        "whose constraint holds.",
        paired_table,
        "The Friedman rank above ranks means, so a difference of 0.001 DSC decides a place as much as a large one. "
        "The paired table says which differences the test volumes support: p is the two-sided Wilcoxon signed-rank "
        "test over the volumes of that seed (volumes without a finite value on either side left out).",
        "Variants:\n\n" + legend,
        "Figures: `val_ece_seed<s>.png`; values per seed: `per_seed.csv`; per test volume: `per_volume.csv`; "
        "paired differences and p: `paired_per_seed.csv`.",
    ]
    setup.write_readme(
        "crac_ablation",
        f"CRaC ablation on {setup.dataset}",
        command or "(called from Python)",
        [table, *notes],
        specs,
        seeds,
    )
    return table


def paired_differences(per_volume: Sequence[Mapping], seed: int, method: str, reference: str) -> dict[str, object]:
    """``method`` minus ``reference`` over the test volumes of one seed, for each ranked column (DSC, HD95, ECE,
    TACE): the mean paired difference ``<column>_diff`` and the two-sided Wilcoxon signed-rank p ``<column>_p``
    (1 when every difference is 0; NaN without a finite pair)."""
    values = {(r["method"], r["case"]): r for r in per_volume if int(r["seed"]) == seed}
    cases = sorted(case for m, case in values if m == reference and (method, case) in values)
    row: dict[str, object] = {"seed": seed, "method": method, "reference": reference, "volumes": len(cases)}
    for column, _ in RANKED:
        diff = np.array([float(values[method, c][column]) - float(values[reference, c][column]) for c in cases])
        diff = diff[np.isfinite(diff)]  # inf - inf is NaN: a pair with a non-finite side drops out either way
        if not len(diff):
            row[f"{column}_diff"], row[f"{column}_p"] = float("nan"), float("nan")
            continue
        p = 1.0 if np.all(diff == 0) else float(wilcoxon(diff).pvalue)
        row[f"{column}_diff"], row[f"{column}_p"] = float(diff.mean()), p
    return row


def _paired_cells(row: Mapping) -> dict[str, str]:
    cells = {"seed": str(row["seed"]), "CRaC": row["method"], "minus": row["reference"], "volumes": str(row["volumes"])}
    for column, _ in RANKED:
        p = row[f"{column}_p"]
        cells[heading(column)] = f"{row[f'{column}_diff']:+.3f} (" + ("<0.001" if p < 0.001 else f"{p:.3f}") + ")"
    return cells


def _score_seed(seed: int, results: Mapping[str, Mapping[str, float]], target: Mapping[str, float]) -> list[dict]:
    """Rows of one seed: each CRaC variant ranked against CE+Dice and NACL, and the criteria it meets."""
    columns, higher = [c for c, _ in RANKED], [h for _, h in RANKED]
    crac = [n for n in results if n.startswith("CRaC")]
    rows, ranks = [], {}
    for name in crac:
        trio = ["CE+Dice", "NACL", name]
        rank = friedman_rank(np.array([[results[m][c] for c in columns] for m in trio]), higher)
        ranks[name] = dict(zip(trio, rank.tolist()))
    best = min(crac, key=lambda n: (ranks[n][n], results[n]["ece"])) if crac else None
    for name, values in results.items():
        rank = ranks[name][name] if name in ranks else (ranks[best][name] if best else float("nan"))
        ratio = values["ece"] / results["CE+Dice"]["ece"]
        meets = (
            name in ranks
            and rank <= ranks[name]["NACL"]
            and ratio <= target["ece_ratio"]
            and values["climb"] <= target["climb"]
        )
        rows.append(
            {
                "seed": seed,
                "method": name,
                **{c: values[c] for c in COLUMNS},
                "ece_ratio": ratio,
                "friedman_rank": rank,
                "climb": values["climb"],
                "lambda_max": values["lambda_max"],
                "satisfied": values["satisfied"],
                "meets": meets,
            }
        )
    return rows


def _summary_rows(per_seed: Sequence[Mapping], names: Sequence[str]) -> list[dict[str, str]]:
    rows = []
    for name in names:
        mine = [r for r in per_seed if r["method"] == name]

        def cell(key: str, digits: int = 3, mine: list = mine) -> str:
            values = np.array([r[key] for r in mine], dtype=np.float64)
            if np.isnan(values).all():
                return ""
            return format_mean_std(
                float(np.nanmean(values)), float(np.nanstd(values)) if len(values) > 1 else None, digits
            )

        row = {
            "method": name,
            **{heading(c): cell(c) for c in COLUMNS},
            "ECE / CE+Dice": cell("ece_ratio", 2),
            "Friedman rank": cell("friedman_rank", 2),
            "val ECE climb": cell("climb"),
            "lambda max": cell("lambda_max", 2),
            "satisfied": cell("satisfied", 2),
        }
        row["meets"] = f"{sum(bool(r['meets']) for r in mine)}/{len(mine)}" if name.startswith("CRaC") else ""
        rows.append(row)
    return rows
