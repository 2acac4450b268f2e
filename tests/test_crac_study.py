"""The CRaC ablation study: log parsing and scoring on hand-made cases, and one real run of the study on phantoms."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from calib_monai.losses.crac import PRESETS
from conftest import SMALL_DEMO
from studies import StudySetup, read_record
from studies.crac_study import (
    CRAC_VARIANTS,
    _paired_cells,
    _score_seed,
    alm_health,
    crac_ablation_study,
    ece_climb,
    paired_differences,
    validation_curve,
)
from studies.study import load_targets


def _records(models):
    """The records a CRaC run writes: validation_history.json (ValidationHistory; a resumed run keeps one entry per
    epoch) and alm_history.json (ALMUpdateHandler, one entry per outer step)."""
    models.mkdir(parents=True, exist_ok=True)
    history = [
        {"epoch": 1, "val_mean_dice": 0.335, "val_ece": 0.327},
        {"epoch": 2, "val_mean_dice": 0.5, "val_ece": 0.2},
        {"epoch": 3, "val_mean_dice": 0.6, "val_ece": 0.1},
    ]
    (models / "validation_history.json").write_text(json.dumps(history))
    step = lambda epoch, inner, boundary: {
        "epoch": epoch,
        "step": epoch,
        "classes": {  # noqa: E731
            "background": {"inner": inner, "boundary": inner},
            "Liver": {"inner": boundary, "boundary": boundary},
        },
    }
    alm = [
        step(
            1,
            {"lambda": 0.17, "rho": 1, "constraint": 0.979, "satisfied": 0.424},
            {"lambda": 0.134, "rho": 1, "constraint": 0.776, "satisfied": 0.676},
        ),
        step(
            2,
            {"lambda": 0.5, "rho": 1, "constraint": 0.5, "satisfied": 0.8},
            {"lambda": 2.5, "rho": 1.2, "constraint": 0.7, "satisfied": 0.4},
        ),
    ]
    (models / "alm_history.json").write_text(json.dumps(alm))


def test_validation_curve_and_alm_health_come_from_the_run_records(tmp_path):
    _records(tmp_path / "models")
    assert validation_curve(tmp_path / "models") == [0.327, 0.2, 0.1]
    assert alm_health(tmp_path / "models") == {"lambda_max": 2.5, "satisfied": pytest.approx(0.6)}  # the last step only


def test_alm_health_without_alm_record_is_nan(tmp_path):
    (tmp_path / "validation_history.json").write_text(json.dumps([{"epoch": 1, "val_ece": 0.2}]))
    assert all(math.isnan(v) for v in alm_health(tmp_path).values())


def test_ece_climb_compares_the_last_third_with_the_middle_third():
    assert ece_climb([0.3, 0.2, 0.1, 0.1, 0.2, 0.3]) == pytest.approx(0.25 - 0.1)
    assert ece_climb([0.3, 0.2, 0.1]) == pytest.approx(-0.1)
    assert ece_climb([0.05] * 9) == 0
    assert math.isnan(ece_climb([0.1, 0.2]))


def _result(dice, hd, ece, tace, climb=0.0):
    return {
        "mean_dice": dice,
        "mean_hd95": hd,
        "ece": ece,
        "cece": ece,
        "tace": tace,
        "climb": climb,
        "lambda_max": 1.0,
        "satisfied": 0.5,
    }


def test_score_seed_ranks_each_variant_against_ce_dice_and_nacl():
    results = {
        "CE+Dice": _result(0.80, 2.0, 0.10, 0.12),
        "NACL": _result(0.79, 2.1, 0.05, 0.10),
        "CRaC a": _result(0.81, 1.9, 0.04, 0.09),  # first on all four: rank 1; ECE ratio 0.4
        "CRaC b": _result(0.78, 2.2, 0.06, 0.11),  # last on DSC, HD95; second on ECE, TACE: rank 2.5
        "CRaC c": _result(0.81, 1.9, 0.04, 0.09, climb=0.02),  # as a, but its validation ECE climbs
    }
    rows = {r["method"]: r for r in _score_seed(7, results, load_targets("crac_ablation"))}
    assert rows["CRaC a"]["friedman_rank"] == 1.0 and rows["CRaC a"]["ece_ratio"] == pytest.approx(0.4)
    assert rows["CRaC a"]["meets"] and not rows["CRaC c"]["meets"]
    # b: DSC 3, HD95 3, ECE 2, TACE 2 -> 2.5; NACL then 2, 2, 1, 1 -> 1.5, better than b
    assert rows["CRaC b"]["friedman_rank"] == 2.5 and not rows["CRaC b"]["meets"]
    # CE+Dice and NACL are shown against the best variant of the seed (a, the first of the ties): 2,2,3,3 and 3,3,2,2
    assert rows["CE+Dice"]["friedman_rank"] == 2.5 and rows["NACL"]["friedman_rank"] == 2.5
    assert rows["CE+Dice"]["ece_ratio"] == 1.0 and not rows["NACL"]["meets"]
    assert {r["seed"] for r in rows.values()} == {7}


def test_variants_are_crac_options_and_presets_come_from_the_loss():
    assert {k.split("#")[1] for v in CRAC_VARIANTS.values() for k in v} <= set(PRESETS["paper"])
    assert CRAC_VARIANTS["authors"] == {f"loss#{k}": v for k, v in PRESETS["authors"].items()}


def test_crac_ablation_study_end_to_end_on_phantoms(tmp_path):
    setup = StudySetup(
        "flare",
        demo=True,
        overrides=SMALL_DEMO,
        epochs=3,
        results_dir=str(tmp_path / "results"),
        runs_dir=str(tmp_path / "runs"),
    )
    crac_ablation_study(setup, ["tol1_rho1"], seeds=[0, 1])
    out = tmp_path / "results" / "crac_ablation"
    for seed in (0, 1):  # one runs folder per seed, the seed in each run's overrides
        record = read_record(tmp_path / "runs" / f"seed{seed}" / "crac_flare__tol1_rho1")
        assert record["status"] == "finished" and record["overrides"].get("seed", 0) == seed
        assert record["overrides"]["loss#tolerance"] == 1.0 and record["overrides"]["loss#rho_init"] == 1.0
        assert (out / f"val_ece_seed{seed}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "per_seed.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["seed"], r["method"]) for r in rows] == [
        (s, m) for s in ("0", "1") for m in ("CE+Dice", "NACL", "CRaC tol1_rho1")
    ]
    crac = [r for r in rows if r["method"].startswith("CRaC")]
    assert all(float(r["lambda_max"]) > 0 and 0 <= float(r["satisfied"]) <= 1 for r in crac)  # ALM lines were read
    assert all(not math.isnan(float(r["climb"])) for r in rows)  # three epochs of validation ECE each
    with open(out / "per_volume.csv", newline="") as f:
        volumes = list(csv.DictReader(f))
    assert len(volumes) % 6 == 0 and volumes and {v["method"] for v in volumes} == {"CE+Dice", "NACL", "CRaC tol1_rho1"}
    readme = (out / "README.md").read_text()
    assert "Friedman" in readme and "`tol1_rho1`: " in readme and "| CRaC tol1_rho1 |" in readme
    assert "; seeds 0, 1" in readme and "| CRaC tol1_rho1 | CE+Dice | 3 |" in readme  # paired table, 3 test volumes
    with open(out / "paired_per_seed.csv", newline="") as f:  # the values behind the table, not its cells
        paired = list(csv.DictReader(f))
    assert [(r["seed"], r["reference"]) for r in paired] == [(s, m) for s in ("0", "1") for m in ("NACL", "CE+Dice")]
    assert all(0 <= float(r["ece_p"]) <= 1 and r["volumes"] == "3" for r in paired)
    assert Path(out / "crac_ablation.md").is_file()


def test_paired_differences_hand_worked():
    # CRaC's ECE is below NACL's on all 6 volumes, by distinct amounts: the exact two-sided signed-rank p is
    # 2 / 2**6 = 0.03125. DSC differs by +0.125 on 3 volumes and -0.125 on 3: mean 0, ranks tie, p = 1.
    # HD95 is equal everywhere (p 1 by definition) except a volume with an infinite HD95, which is left out.
    per_volume = []
    for i in range(6):
        case = f"v{i}"
        per_volume.append(
            {"seed": "3", "method": "NACL", "case": case, "mean_dice": 0.75, "mean_hd95": 2.0, "ece": 0.10, "tace": 0.2}
        )
        per_volume.append(
            {
                "seed": "3",
                "method": "CRaC x",
                "case": case,
                "mean_dice": 0.75 + (0.125 if i < 3 else -0.125),
                "mean_hd95": math.inf if i == 5 else 2.0,
                "ece": 0.10 - 0.01 * (i + 1),
                "tace": 0.2,
            }
        )
    per_volume.append(
        {"seed": "4", "method": "NACL", "case": "v0", "mean_dice": 0.0, "mean_hd95": 0.0, "ece": 0.0, "tace": 0.0}
    )  # another seed: not paired
    row = paired_differences(per_volume, 3, "CRaC x", "NACL")
    assert row["volumes"] == 6 and row["reference"] == "NACL"
    assert row["ece_diff"] == pytest.approx(-0.035) and row["ece_p"] == pytest.approx(0.03125)
    assert row["mean_dice_diff"] == 0.0 and row["mean_dice_p"] == pytest.approx(1.0)
    assert row["mean_hd95_diff"] == 0.0 and row["mean_hd95_p"] == 1.0
    assert row["tace_p"] == 1.0
    assert math.isnan(paired_differences(per_volume, 4, "CRaC x", "NACL")["ece_p"])  # no CRaC volume in seed 4
    cells = _paired_cells(row | {"tace_p": 2e-4})
    assert cells["ECE"] == "-0.035 (0.031)" and cells["TACE"] == "+0.000 (<0.001)"
