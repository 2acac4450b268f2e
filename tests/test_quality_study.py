"""The case-quality study: its per-configuration figures from hand-made records, and one real run on phantoms
(two seeds on one data split, corruptions, the seeds' ensemble)."""

from __future__ import annotations

import csv
import gzip

import numpy as np
import pytest

from conftest import SMALL_DEMO
from studies import StudySetup
from studies.corruptions import CORRUPTIONS, corruption
from studies.quality import REVIEW_RULES, quality_study
from studies.quality_report import configuration_rows


def _record(case, condition, dice, est, flag, strength=0.0):
    return {
        "seed": 0,
        "method": "m",
        "calibration": "none",
        "condition": condition,
        "strength": strength,
        "case": case,
        "mean_dice": dice,
        "est_mean_dice": est,
        "mean_confidence": est,
        "ece": 0.1,
        "ece_all": 0.01,
        "ece_band": 0.05,
        "volume_error_prob": 0.2,
        "volume_error_pred": 0.1,
        "flag_score": flag,
    }


def test_configuration_figures_by_hand():
    records = [
        _record("a", "in-distribution", 0.9, 0.85, False),
        _record("b", "in-distribution", 0.8, 0.82, False),
        _record("c", "in-distribution", 0.7, 0.75, True),
        _record("d", "in-distribution", 0.6, 0.50, False),
        _record("a", "noise", 0.3, 0.2, True, 0.2),
        _record("b", "noise", 0.5, 0.6, False, 0.2),
    ]
    (row,) = configuration_rows(records, ["score"])
    assert row["mean_dice"] == pytest.approx(0.75)
    # estimates 0.85, 0.82, 0.75, 0.50 against 0.9, 0.8, 0.7, 0.6: the same order, MAE (.05 + .02 + .05 + .1) / 4
    assert row["spearman_est"] == pytest.approx(1.0) and row["mae_est"] == pytest.approx(0.055)
    assert row["gap_est"] == pytest.approx(1.0)  # a perfect order closes the whole gap
    assert row["fpr_score"] == pytest.approx(0.25) and row["tpr_score_noise_0.2"] == pytest.approx(0.5)
    assert row["dice_noise_0.2"] == pytest.approx(0.4)
    # the mixed set: six volumes, estimate 0.6 ranks above true 0.5 below 0.6: not perfect any more
    assert 0 < row["gap_mixed_est"] < 1


def test_corruptions_are_seeded_and_the_flip_moves_the_label():
    import torch

    image = torch.rand(1, 8, 6, 4, generator=torch.Generator().manual_seed(0))
    label = (image > 0.5).long()
    noisy = [corruption("noise", 0.1)(image, label, 3)[0] for _ in range(2)]
    assert torch.equal(noisy[0], noisy[1]) and not torch.equal(noisy[0], image)
    flipped_image, flipped_label = corruption("flip", 1.0)(image, label, 0)
    assert torch.equal(flipped_image.flip(2), image)
    assert torch.equal(flipped_label.flip(2), label)
    assert torch.equal(corruption("shift", 0.25)(image, label, 0)[0], image + 0.25)
    assert torch.allclose(corruption("gamma", 2.0)(image, label, 0)[0], image**2)
    assert list(CORRUPTIONS) == ["noise", "blur", "gamma", "shift", "flip"]
    with pytest.raises(ValueError, match="corruption kind"):
        corruption("rotate", 1.0)


def test_quality_study_end_to_end_on_phantoms(tmp_path):
    setup = StudySetup(
        "flare",
        demo=True,
        overrides=SMALL_DEMO,
        epochs=2,
        results_dir=str(tmp_path / "results"),
        runs_dir=str(tmp_path / "runs"),
        split_seed=0,
    )
    shifts = {"noise": (0.1, 0.3), "flip": (1.0,)}
    quality_study(setup, ["nacl"], seeds=[0, 1], lts_steps=5, corruptions=shifts)
    out = tmp_path / "results" / "quality"
    with gzip.open(out / "per_volume.csv.gz", "rt", newline="") as f:
        volumes = list(csv.DictReader(f))
    with open(out / "per_seed.csv", newline="") as f:
        configs = list(csv.DictReader(f))
    # seeds x methods x recalibrations
    assert len(configs) == 2 * 1 * 4
    conditions = 1 + 2 + 1
    single = [v for v in volumes if v["seed"] != "ensemble"]
    assert len(single) == 2 * 1 * 4 * conditions * 3  # 3 test phantoms in the demo split
    # both seeds were tested on the same volumes (one split), so the ensemble has them too
    cases = {v["seed"]: sorted({r["case"] for r in single if r["seed"] == v["seed"]}) for v in single}
    assert cases["0"] == cases["1"]
    ensemble = [v for v in volumes if v["seed"] == "ensemble"]
    assert len(ensemble) == 1 * 4 * 3 and all(0 <= float(v["pairwise_dice"]) <= 1 for v in ensemble)
    # a recalibration keeps the segmentation: the true DSC is the same under every one of them
    for case in cases["0"]:
        dice = {
            v["calibration"]: v["mean_dice"]
            for v in single
            if (v["seed"], v["method"], v["case"], v["condition"]) == ("0", "nacl", case, "in-distribution")
        }
        assert len(dice) == 4 and len(set(dice.values())) == 1
    # each configuration's fpr is the share of its flagged in-distribution volumes
    for row in configs:
        mine = [
            v
            for v in single
            if (v["seed"], v["method"], v["calibration"], v["condition"])
            == (row["seed"], row["method"], row["calibration"], "in-distribution")
        ]
        for rule in REVIEW_RULES:
            assert float(row[f"fpr_{rule}"]) == pytest.approx(np.mean([v[f"flag_{rule}"] == "True" for v in mine]))
    readme = (out / "README.md").read_text()
    assert "Best configuration by in-distribution AURC gap closed" in readme and "data split of seed 0" in readme
    for name in ("estimate_vs_true.png", "flag_rates.png", "risk_coverage_best.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
