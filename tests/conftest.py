"""Shared fixtures: where the real data of ../shared/data lives, and skips when it is absent."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# study tests on the demo phantoms with 12 of them: an 8 / 1 / 3 split, the test volumes they count
SMALL_DEMO = {"data#num_phantoms": 12}
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def _shared_dataset(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real data set {name} not found at {path} (expected ../shared/data beside the repository)")
    return path


@pytest.fixture(scope="session")
def hippocampus_dir() -> Path:
    return _shared_dataset("Task04_Hippocampus")


@pytest.fixture(scope="session")
def acdc_dir() -> Path:
    return _shared_dataset("ACDC")


@pytest.fixture(scope="module")
def hippocampus_few_dir(hippocampus_dir, tmp_path_factory) -> Path:
    """A task folder whose dataset.json lists the first 6 real Hippocampus cases by absolute path (no data copied)."""
    description = json.loads((hippocampus_dir / "dataset.json").read_text())
    training = [
        {k: str((hippocampus_dir / item[k]).resolve()) for k in ("image", "label")}
        for item in description["training"][:6]
    ]
    root = tmp_path_factory.mktemp("hippocampus_few")
    (root / "dataset.json").write_text(json.dumps({**description, "numTraining": 6, "training": training}))
    return root


def run_bundle_workflow(configs_dir: Path, configs: list[str], run_id: str, **overrides):
    """``ConfigWorkflow`` of the bundle files ``configs`` (names under ``configs_dir``), initialized and run in this
    process, as ``python -m monai.bundle run <run_id>`` would run them; returns the workflow."""
    from monai.bundle import ConfigWorkflow

    workflow = ConfigWorkflow(
        config_file=[str(configs_dir / c) for c in configs],
        workflow_type="train",
        run_id=run_id,
        logging_file=False,
        **overrides,
    )
    workflow.initialize()
    workflow.run()
    return workflow


def bundle_command(run_id: str, config_files: list[str], overrides: dict) -> list[str]:
    """``python -m monai.bundle run <run_id> --config_file ... --key value``, as a user types it: strings as they
    are, other values as JSON (python-fire parses them back)."""
    command = [sys.executable, "-m", "monai.bundle", "run", run_id, "--config_file"]
    command.append(config_files[0] if len(config_files) == 1 else json.dumps(config_files))
    for key, value in overrides.items():
        command += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return command


def free_port() -> int:
    """A TCP port nothing listens on now, for a test's DDP rendezvous (a fixed port can still be in TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_confident(weights: Path, factor: float = 1e4) -> None:
    """Scale the output layer of the network in ``weights`` (its last convolution: weight and bias) by ``factor``: a
    confident network, whose softmax holds exact ones in float32 even after a fitted temperature (at most 100)."""
    import torch

    state = torch.load(weights, weights_only=True)
    last = [k for k, v in state.items() if k.endswith(".weight") and v.ndim >= 3][-1]
    for key in (last, last.removesuffix(".weight") + ".bias"):
        state[key] = state[key] * factor
    torch.save(state, weights)


# the real MONAI Label server of the label tests: one per session, shared by their modules
from label_server import served_folder, server  # noqa: E402,F401
