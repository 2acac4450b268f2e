"""The user's first command: bundles/nacl_flare trains end-to-end (on tiny phantoms here) and resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from monai.bundle import ConfigWorkflow, verify_metadata

from conftest import REPO_ROOT

BUNDLE = REPO_ROOT / "bundles" / "nacl_flare"
SCHEMA = REPO_ROOT.parent / "shared" / "monai" / "meta_schema_20240725.json"
# a tiny run: 6 coarse phantoms (12 x 12 x 30 mm voxels) cropped to 32x32x8 (split 4/1/1), one epoch
TINY = {
    "epochs": 1,
    "roi_size": [32, 32, 8],
    "batch_size": 8,
    "data#num_phantoms": 6,
    "data#spacing": [12.0, 12.0, 30.0],
}


def _cli_overrides(values: dict) -> list[str]:
    args = []
    for key, value in values.items():
        args += [f"--{key}", json.dumps(value) if isinstance(value, list) else str(value)]
    return args


def test_metadata_verifies_against_offline_schema():
    if not SCHEMA.is_file():
        pytest.skip(f"offline MONAI metadata schema not found at {SCHEMA}")
    verify_metadata(meta_file=str(BUNDLE / "configs" / "metadata.json"), filepath=str(SCHEMA))


def test_config_workflow_model_zoo_style(tmp_path):
    workflow = ConfigWorkflow(
        config_file=str(BUNDLE / "configs" / "train.json"),
        workflow_type="train",
        logging_file=str(BUNDLE / "configs" / "logging.conf"),
        output_dir=str(tmp_path / "out"),
        **{"data#cache_dir": str(tmp_path / "phantoms"), "loss_log_interval": 2},
        **TINY,
    )
    workflow.initialize()
    assert workflow.check_properties() == []
    assert workflow.bundle_root == str(BUNDLE)  # resolved from the bundle, not from the working directory
    workflow.run()
    workflow.finalize()
    trainer = workflow.trainer
    assert trainer.state.epoch == 1
    metrics = workflow.parser.get_parsed_content("validate#evaluator").state.metrics
    assert 0.0 <= metrics["val_mean_dice"] <= 1.0
    assert 0.0 <= metrics["val_ece"] <= 1.0
    # best model is a plain state_dict that loads into the bundle's network definition
    net = workflow.parser.get_parsed_content("network_def", lazy=False)
    net.load_state_dict(torch.load(tmp_path / "out" / "model.pt", weights_only=True))
    datalist = json.loads((tmp_path / "out" / "datalist.json").read_text())
    assert [len(datalist[k]) for k in ("training", "validation", "test")] == [4, 1, 1]
    events = sorted((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    # the training loss reaches TensorBoard (every loss_log_interval steps), the validation metrics every epoch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for path in events:
        tags |= set(EventAccumulator(str(path)).Reload().Tags()["scalars"])
    assert {"train_loss", "val_mean_dice", "val_ece"} <= tags


def _user_command(tmp_path, overrides: dict, cwd) -> subprocess.CompletedProcess:
    config = "bundles/nacl_flare/configs/train.json" if cwd == REPO_ROOT else str(BUNDLE / "configs" / "train.json")
    cmd = [sys.executable, "-m", "monai.bundle", "run", "training", "--config_file", config]
    cmd += _cli_overrides(
        {**overrides, "output_dir": str(tmp_path / "out"), "data#cache_dir": str(tmp_path / "phantoms")}
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


def test_user_command_trains_then_resumes(tmp_path):
    first = _user_command(tmp_path, TINY, cwd=REPO_ROOT)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    log = first.stdout + first.stderr
    assert "phantom" in log and "--dataset_dir" in log  # says which data it used and how to use real FLARE
    assert "epoch 1/1" in log and "val_mean_dice" in log and "val_ece" in log
    assert (tmp_path / "out" / "model.pt").is_file()

    # asked for one more epoch, the same command continues at epoch 2 instead of starting over
    second = _user_command(tmp_path, {**TINY, "epochs": 2}, cwd=REPO_ROOT)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    log = second.stdout + second.stderr
    assert "resuming from" in log
    assert "epoch 2/2" in log and "epoch 1/2" not in log
    state = torch.load(tmp_path / "out" / "checkpoint_latest.pt", weights_only=False)
    assert state["trainer"]["iteration"] == 2 * state["trainer"]["epoch_length"]


def test_missing_dataset_dir_is_a_clear_error(tmp_path):
    missing = tmp_path / "no_such_folder"
    result = _user_command(tmp_path, {**TINY, "dataset_dir": str(missing)}, cwd=tmp_path)  # also: another cwd
    assert result.returncode != 0
    assert str(missing) in result.stderr
