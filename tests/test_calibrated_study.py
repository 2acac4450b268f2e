"""The calibrated-by-default study (issue 14): scoring against the reference on hand-made rows, and one real run of
the study on phantoms (bundle trainings that keep every epoch, selection rules applied after training)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from calib_monai.handlers import select_epoch
from conftest import SMALL_DEMO
from studies import StudySetup
from studies.calibrated import _add_ratios, _summary_rows, _verdict, calibrated_study, selection_rules


def _row(method, selection, calibration, dice, ece, seed=0):
    return {
        "seed": seed,
        "method": method,
        "selection": selection,
        "calibration": calibration,
        "epoch": 3,
        "temperature": 1.5 if calibration == "temperature" else 1.0,
        "mean_dice": dice,
        "ece": ece,
        "cece": 0.1,
        "tace": 0.1,
        "nll": 0.5,
    }


def test_ratios_and_target_against_the_papers_protocol():
    rows = [
        _row("ce_dice", "dsc", "none", 0.80, 0.10),
        _row("ce_dice", "dsc", "temperature", 0.80, 0.02),
        _row("nacl", "dsc", "local temperature", 0.79, 0.01),
        _row("nacl", "nll", "none", 0.797, 0.03),
    ]
    _add_ratios(rows)
    assert [r["ece_ratio"] for r in rows] == pytest.approx([1.0, 0.2, 0.1, 0.3])
    assert [r["dice_change"] for r in rows] == pytest.approx([0.0, 0.0, -0.01, -0.003])
    # ECE <= 0.3x and DSC no more than 0.005 below: the 0.01 DSC drop fails, 0.3x exactly passes
    assert [r["meets"] for r in rows] == [False, True, False, True]
    summary = _summary_rows(rows, ["ce_dice", "nacl"], ["dsc", "nll"], 1, False)
    assert [(r["method"], r["selection"], r["calibration"]) for r in summary] == [
        ("ce_dice", "dsc", "none"),
        ("ce_dice", "dsc", "temperature"),
        ("nacl", "dsc", "local temperature"),
        ("nacl", "nll", "none"),
    ]
    verdict = _verdict(rows, summary)
    assert verdict.startswith("**Target met**") and "ce_dice, selection `dsc`, calibration temperature" in verdict
    # without the passing rows, the closest within the DSC margin is named
    closest = _verdict([r for r in rows if not r["meets"]], summary)
    assert closest.startswith("**Target not met.** Closest: ce_dice, selection `dsc`, calibration none")


def test_selection_rules_are_the_bundle_flags():
    rules = selection_rules(0.04)
    assert list(rules) == ["dsc", "nll", "dsc_ece0.04"]
    history = [
        {"epoch": 1, "val_mean_dice": 0.5, "val_ece": 0.03, "val_nll": 0.4},
        {"epoch": 2, "val_mean_dice": 0.7, "val_ece": 0.09, "val_nll": 0.6},
    ]
    assert [select_epoch(history, **rule) for rule in rules.values()] == [2, 1, 1]


def test_calibrated_study_end_to_end_on_phantoms(tmp_path):
    setup = StudySetup(
        "flare",
        demo=True,
        overrides=SMALL_DEMO,
        epochs=2,
        results_dir=str(tmp_path / "results"),
        runs_dir=str(tmp_path / "runs"),
    )
    calibrated_study(setup, ["ce_dice", "nacl"], seeds=[0, 1], ece_bound=0.2, lts_steps=10)
    out = tmp_path / "results" / "calibrated"
    with open(out / "per_seed.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # seeds x methods x (rules x (none, temperature) + local temperature for the dsc rule)
    assert len(rows) == 2 * 2 * (3 * 2 + 1)
    for seed in ("0", "1"):
        for method in ("ce_dice", "nacl"):
            models = tmp_path / "runs" / f"seed{seed}" / f"{method}_flare" / "models"
            mine = [r for r in rows if (r["seed"], r["method"]) == (seed, method)]
            # the "dsc" rule's epoch is the bundle's own model.pt
            epoch = next(r["epoch"] for r in mine if r["selection"] == "dsc")
            kept, best = (torch.load(models / name, weights_only=True) for name in (f"epoch_{epoch}.pt", "model.pt"))
            assert all(torch.equal(kept[k], best[k]) for k in best)
            for rule in ("dsc", "nll", "dsc_ece0.2"):
                raw, scaled = (
                    next(r for r in mine if r["selection"] == rule and r["calibration"] == c)
                    for c in ("none", "temperature")
                )
                assert raw["epoch"] == scaled["epoch"]
                assert float(raw["mean_dice"]) == float(scaled["mean_dice"])  # temperature keeps the segmentation
                assert float(raw["temperature"]) == 1.0 and float(scaled["temperature"]) != 1.0
            local = [r for r in mine if r["calibration"] == "local temperature"]
            assert [r["selection"] for r in local] == ["dsc"] and local[0]["epoch"] == epoch
            assert float(local[0]["mean_dice"]) == float(next(r["mean_dice"] for r in mine if r["selection"] == "dsc"))
        reference = next(
            r
            for r in rows
            if (r["seed"], r["method"], r["selection"], r["calibration"]) == (seed, "ce_dice", "dsc", "none")
        )
        assert float(reference["ece_ratio"]) == 1.0 and float(reference["dice_change"]) == 0.0
    with open(out / "per_volume.csv", newline="") as f:
        volumes = list(csv.DictReader(f))
    # each row of per_seed is the mean of its test volumes (3 in the demo split)
    for row in rows:
        mine = [
            float(v["ece"])
            for v in volumes
            if all(v[k] == row[k] for k in ("seed", "method", "selection", "calibration"))
        ]
        assert len(mine) == 3 and float(row["ece"]) == pytest.approx(np.mean(mine), rel=1e-9)
    readme = (out / "README.md").read_text()
    assert (
        "; seeds 0, 1" in readme and "Target" in readme and "--selection_metric val_nll --selection_mode min" in readme
    )
    assert "| ce_dice | dsc | temperature |" in readme and "| ce_dice | dsc | local temperature |" in readme
    assert (out / "ece_by_method.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="include 'ce_dice'"):
        calibrated_study(setup, ["nacl"])
