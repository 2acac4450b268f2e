"""kill -9 during training, then the same command again: the resumed run ends with exactly the weights of a run that
was never stopped (CPU, same machine and settings).

The issue's demo run killed during epoch 4 of 6 ended with weights up to 2.6e-4 away from the uninterrupted run's and
another validation ECE: the checkpoint held no random-number state, so the resumed run shuffled the training slices
differently. ``TrainingCheckpoint`` now stores and restores it (``calib_monai.handlers.rng``).

Both runs are real ``python -m monai.bundle run training`` processes of ``nacl_flare`` on tiny phantoms; the second
is killed with SIGKILL (no handler runs, no file is closed) in the middle of epoch 3 of 4, after the epoch-2
checkpoint was written, and started again with the same command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "bundles" / "nacl_flare" / "configs" / "train.json"
EPOCHS = 4
KILL_AFTER = 2  # the run is killed during epoch KILL_AFTER + 1


def _command(output_dir: Path, phantoms: Path) -> list[str]:
    overrides = {
        "epochs": EPOCHS,
        "roi_size": [32, 32, 8],
        "batch_size": 4,
        "data#num_phantoms": 6,
        "data#spacing": [12.0, 12.0, 30.0],
        "data#cache_dir": str(phantoms),
        "output_dir": str(output_dir),
    }
    command = [sys.executable, "-m", "monai.bundle", "run", "training", "--config_file", str(TRAIN)]
    for key, value in overrides.items():
        command += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return command


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _history(models: Path) -> list:
    path = models / "validation_history.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else []
    except json.JSONDecodeError:  # written atomically, but a read may race the rename on some file systems
        return []


def _epoch(checkpoint: dict) -> int:
    return checkpoint["trainer"]["iteration"] // checkpoint["trainer"]["epoch_length"]  # ignite stores iterations


def _run_and_kill_during(models: Path, command: list[str], log: Path) -> None:
    """Start the training, wait until epoch KILL_AFTER's checkpoint is on disk, kill -9 it half an epoch later."""
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=_env())
    try:
        seen: dict[int, float] = {}
        latest = models / "checkpoint_latest.pt"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:
            epochs = len(_history(models))
            seen.setdefault(epochs, time.monotonic())
            written_after = (
                latest.is_file() and latest.stat().st_mtime >= (models / "validation_history.json").stat().st_mtime
            )
            if epochs == KILL_AFTER and written_after:
                epoch_time = seen[KILL_AFTER] - seen.get(KILL_AFTER - 1, seen[KILL_AFTER] - 1.0)
                time.sleep(max(0.05, 0.4 * epoch_time))
                os.kill(process.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        assert process.wait(timeout=60) == -signal.SIGKILL, log.read_text()[-2000:]
    finally:
        if process.poll() is None:
            process.kill()


def test_killed_and_resumed_training_equals_the_uninterrupted_run_exactly(tmp_path):
    phantoms = tmp_path / "phantoms"
    reference = subprocess.run(
        _command(tmp_path / "ref" / "models", phantoms),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(),
        timeout=900,
    )
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]

    models = tmp_path / "run" / "models"
    _run_and_kill_during(models, _command(models, phantoms), tmp_path / "killed.log")
    stopped = torch.load(models / "checkpoint_latest.pt", weights_only=True)
    assert _epoch(stopped) == KILL_AFTER  # killed during the next epoch, before its end
    # the settings a resumed run must share (the same command: no difference), without paths or the epochs
    assert stopped["settings"]["batch_size"] == 4 and stopped["settings"]["data#num_phantoms"] == 6
    assert not {"epochs", "output_dir", "data#cache_dir"} & set(stopped["settings"])
    assert (models / "training.lock").is_file()  # SIGKILL: no handler ran, the lock's file stays
    resumed = subprocess.run(
        _command(models, phantoms), capture_output=True, text=True, cwd=REPO, env=_env(), timeout=900
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert (
        f"resuming from {models / 'checkpoint_latest.pt'}: epoch {KILL_AFTER} done" in resumed.stdout + resumed.stderr
    )
    assert "no longer runs" in resumed.stdout + resumed.stderr and not (models / "training.lock").exists()

    ref_models = tmp_path / "ref" / "models"
    assert _history(models) == _history(ref_models)  # every epoch's validation metrics, to the last bit
    for name in ("model.pt",):
        ours, theirs = (torch.load(folder / name, weights_only=True) for folder in (models, ref_models))
        assert list(ours) == list(theirs)
        for key in ours:
            assert torch.equal(ours[key], theirs[key]), (name, key)
    final = [torch.load(folder / "checkpoint_latest.pt", weights_only=True) for folder in (models, ref_models)]
    assert _epoch(final[0]) == _epoch(final[1]) == EPOCHS
    for key, value in final[1]["network"].items():  # the last epoch's weights, not only the best epoch's
        assert torch.equal(final[0]["network"][key], value), key
