"""The experiment harness end to end on the embedded FLARE phantoms (real bundle runs of 1-2 epochs)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import SMALL_DEMO
from studies import RunSpec, StudySetup, read_record, train
from studies.ablations import crac_vs_nacl_study, logit_epochs_study, nacl_ablation_study, posthoc_study
from studies.comparison import main_comparison
from studies.robustness import data_fraction_study, noise_study
from studies.study import command_line_overrides

METHODS = ["ce_dice", "nacl"]
PNG = b"\x89PNG\r\n\x1a\n"


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    setup = StudySetup(
        "flare",
        demo=True,
        overrides=SMALL_DEMO,
        epochs=1,
        results_dir=str(root / "results"),
        runs_dir=str(root / "runs"),
    )
    means = main_comparison(setup, METHODS, command="python scripts/experiments.py main --dataset flare --demo")
    return setup, means


def test_main_comparison_writes_tables_ranks_and_figures(study):
    setup, means = study
    out = Path(setup.results_dir) / "main"
    per_volume = _rows(out / "per_volume.csv")
    assert [r["method"] for r in per_volume] == ["ce_dice"] * 3 + ["nacl"] * 3  # demo split: 3 test volumes
    for method in METHODS:
        values = [float(r["ece"]) for r in per_volume if r["method"] == method]
        assert means[method]["ece"] == pytest.approx(np.mean(values), abs=1e-12)
    ranks = _rows(out / "ranks.csv")
    # two methods ranked on five metrics: ranks 1 and 2 (or 1.5 twice) per metric
    assert sum(float(r["sum_rank"]) for r in ranks) == pytest.approx(5 * 3)
    assert sum(float(r["friedman_rank"]) for r in ranks) == pytest.approx(3)
    assert all(1 <= float(r["mean_case_rank"]) <= 2 for r in ranks)
    table1 = (out / "table1_segmentation.md").read_text()
    assert "DSC liver" in table1 and "mean HD95" in table1 and table1.count("\n| nacl |") == 1
    logits = _rows(out / "logits_mean_abs.csv")
    assert len(logits) == 2 * 5 and all(float(r["logit liver"]) >= 0 for r in logits)
    for name in ("radar", "reliability", "qualitative", "max_logit_hist"):
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name
    readme = (out / "README.md").read_text()
    assert "python scripts/experiments.py main --dataset flare --demo" in readme and "| nacl_flare |" in readme


def test_runs_record_settings_and_are_reused(study):
    setup, _ = study
    spec = setup.spec("ce_dice")
    record = read_record(spec.run_dir)
    assert (
        record["status"] == "finished"
        and record["overrides"] == {"epochs": 1, **SMALL_DEMO}
        and record["attempts"] == 1
    )
    assert record["versions"]["torch"] == torch.__version__ and record["wall_time_s"] > 0
    assert json.loads((spec.run_dir / "config.json").read_text())["epochs"] == 1
    log_size = (spec.run_dir / "train.log").stat().st_size
    assert train(spec) == record  # finished: nothing runs again
    assert (spec.run_dir / "train.log").stat().st_size == log_size
    with pytest.raises(ValueError, match="records another run"):
        train(RunSpec(spec.bundle, spec.run_dir, {"epochs": 2}, spec.extra_configs))


def test_harness_metrics_equal_the_bundle_evaluate_run(study, tmp_path):
    """The harness (its own SliceInferer pass) and the bundle's Ignite evaluator give the same numbers."""
    setup, means = study
    spec = setup.spec("nacl")
    configs = [str(Path("bundles/nacl_flare/configs") / n) for n in ("train.json", "demo.json", "evaluate.json")]
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "monai.bundle",
            "run",
            "evaluating",
            "--config_file",
            json.dumps(configs),
            "--output_dir",
            str(spec.run_dir.resolve() / "models"),
            "--epochs",
            "1",
            "--eval_dir",
            str(tmp_path),
        ],
        cwd=root,
        check=True,
        capture_output=True,
    )
    summary = json.loads((tmp_path / "summary.json").read_text())["metrics"]
    for column in ("mean_dice", "mean_hd95", "ece", "cece", "tace"):
        assert means["nacl"][column] == pytest.approx(summary[column]["mean"], rel=1e-6, abs=1e-9), column


def test_noise_study_sigma_zero_is_the_main_result(study):
    setup, means = study
    curves = noise_study(setup, ["ce_dice"], [0.0, 0.1])
    assert curves["ece"]["ce_dice"][0] == pytest.approx(means["ce_dice"]["ece"], abs=1e-12)
    assert curves["ece"]["ce_dice"][1] != pytest.approx(means["ce_dice"]["ece"], abs=1e-6)
    rows = _rows(Path(setup.results_dir) / "noise" / "noise.csv")
    assert [r["sigma"] for r in rows] == ["0.0", "0.1"]
    assert (Path(setup.results_dir) / "noise" / "noise_ece.png").read_bytes().startswith(PNG)


def test_posthoc_study_keeps_the_segmentation(study):
    setup, means = study
    posthoc_study(setup, ["nacl"], lts_steps=20)
    rows = _rows(Path(setup.results_dir) / "posthoc" / "posthoc.csv")
    assert [r["post-hoc"][:2] for r in rows] == ["no", "TS", "LT"]
    assert float(rows[0]["ECE"].split(" ")[0]) == pytest.approx(means["nacl"]["ece"], abs=5e-4)
    # a positive temperature keeps the argmax: DSC is the same with and without calibration
    assert rows[0]["mean DSC"] == rows[1]["mean DSC"] == rows[2]["mean DSC"]


def test_data_fraction_study_trains_on_fewer_cases(study):
    setup, means = study
    curves = data_fraction_study(setup, ["ce_dice"], [0.5, 1.0])
    assert curves["ece"]["ce_dice"][1] == pytest.approx(means["ce_dice"]["ece"], abs=1e-12)  # 100%: the main run
    record = read_record(Path(setup.runs_dir) / "ce_dice_flare__fraction0.5")
    assert record["overrides"]["train_fraction"] == 0.5
    assert "data: phantom" in (Path(record["run_dir"]) / "train.log").read_text()


def test_nacl_ablation_and_crac_reuse_the_main_runs(study):
    setup, _ = study
    nacl_ablation_study(setup, ["distance"])
    runs = sorted(p.name for p in Path(setup.runs_dir).iterdir())
    assert "nacl_flare__distance_l2" in runs and "nacl_flare__distance_l1" not in runs  # l1 is the bundle default
    assert read_record(Path(setup.runs_dir) / "nacl_flare__distance_l2")["overrides"]["loss#distance_type"] == "l2"
    crac_vs_nacl_study(setup, [0.1])
    rows = _rows(Path(setup.results_dir) / "crac_vs_nacl" / "crac_vs_nacl.csv")
    assert [(r["method"], r["lambda"]) for r in rows] == [("NACL", "0.1"), ("CRaC", "learned")]
    assert not (Path(setup.runs_dir) / "nacl_flare__alpha0.1").exists()


def test_logit_epochs_snapshots_each_stage(tmp_path):
    setup = StudySetup(
        "flare",
        demo=True,
        overrides=SMALL_DEMO,
        epochs=2,
        lr_milestone=1,
        results_dir=str(tmp_path / "results"),
        runs_dir=str(tmp_path / "runs"),
    )
    logit_epochs_study(setup, ["ce_dice"], [1])
    models = tmp_path / "runs" / "ce_dice_flare__staged" / "models"
    first, last = (torch.load(models / f"epoch_00{e}.pt", weights_only=True) for e in (1, 2))
    assert first.keys() == last.keys() and any(not torch.equal(first[k], last[k]) for k in first)
    log = (models.parent / "train.log").read_text()
    assert log.count("--epochs 1 ") == 1 and log.count("--epochs 2 ") == 1 and "epoch 2/2" in log
    rows = _rows(tmp_path / "results" / "logit_epochs" / "logit_epochs.csv")
    assert [r["epoch"] for r in rows] == ["1", "2"]


def test_study_setup_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="dataset must be one of"):
        StudySetup("lungs")
    with pytest.raises(ValueError, match="is not a folder"):
        StudySetup("hpc", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="methods must be among"):
        StudySetup.check_methods(["nacl", "dice"])


def test_command_line_overrides_read_json_literals_as_json():
    # Fire turns '{"data#use_split_lists": false}' into {"data#use_split_lists": "false"}: a truthy string that would
    # keep the split lists on without a word; the study reads it as JSON meant it
    import fire

    given = '{"data#use_split_lists": false, "data#resize": [96, 96], "a": [true, null], "b": {"c": "false"}}'
    parsed = fire.Fire(lambda overrides=None: overrides, command=["--overrides", given])
    assert parsed["data#use_split_lists"] == "false"  # what Fire hands over
    expected = {"data#use_split_lists": False, "data#resize": [96, 96], "a": [True, None], "b": {"c": False}}
    assert command_line_overrides(parsed) == expected
    assert command_line_overrides(given) == expected  # the same as the JSON string itself
    assert StudySetup("hpc", overrides=parsed).overrides["data#use_split_lists"] is False
    assert command_line_overrides(None) == {}
    with pytest.raises(ValueError, match="--overrides: not a JSON object"):
        command_line_overrides("{data#resize: 96}")
    with pytest.raises(ValueError, match="--other_overrides: expected a JSON object"):
        command_line_overrides("[96, 96]", "--other_overrides")
