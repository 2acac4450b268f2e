"""Multi-GPU training (``multi_gpu_train.json``) with 2 gloo ranks on the CPU: a torchrun run of nacl_flare that is
killed and resumed, whose ``model.pt`` is an ordinary model (evaluate, export), and validation metrics that equal
the single-process ones however the volumes fall on the ranks.

Run as a script (``python -m torch.distributed.run --nproc_per_node 2 tests/test_multi_gpu.py OUT``), this file is
the worker of ``test_validation_metrics_equal_one_process``.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

BUNDLE = Path(__file__).resolve().parents[1] / "bundles" / "nacl_flare"
CONFIGS = BUNDLE / "configs"
EPOCHS = 6
# 6 coarse phantoms cropped to 32x32x8, split 4/1/1: ONE validation volume for two ranks
TINY = {"roi_size": [32, 32, 8], "batch_size": 8, "data#num_phantoms": 6, "data#spacing": [12.0, 12.0, 30.0]}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


# ---- the worker (script mode) and the reference: the bundle's validation section on synthetic logits ------------
def _volumes(n: int, classes: int = 5, shape=(16, 16, 4)) -> list[dict]:
    """``n`` seeded volumes: logits as the "image" (the network is the identity) and a label they mostly agree with."""
    g = torch.Generator().manual_seed(n)
    items = []
    for _ in range(n):
        label = torch.randint(0, classes, (1, *shape), generator=g)
        agree = torch.nn.functional.one_hot(label[0], classes).movedim(-1, 0)
        logits = torch.randn(classes, *shape, generator=g) + 2.0 * agree
        items.append({"image": logits, "label": label.float()})
    return items


def validate_synthetic(n: int) -> tuple[dict, int]:
    """The metrics of nacl_flare's validation evaluator (train.json + multi_gpu_train.json) over ``n`` synthetic
    volumes, and how many volumes this rank validated. Without a process group: one process, all volumes."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([str(CONFIGS / "train.json"), str(CONFIGS / "multi_gpu_train.json")])
    parser.update(
        {
            "bundle_root": str(BUNDLE),
            "device": "$torch.device('cpu')",
            "network": "$torch.nn.Identity()",
            "roi_size": [16, 16, 4],
            "validate#evaluator#val_handlers": [],
            "validate#dataset": f"$monai.data.Dataset(__import__('test_multi_gpu')._volumes({n}))",
        }
    )
    evaluator = parser.get_parsed_content("validate#evaluator")
    evaluator.run()
    metrics = {k: float(v) for k, v in evaluator.state.metrics.items()}
    return metrics, len(parser.get_parsed_content("validate#dataloader"))


def _worker(out: str) -> None:
    import torch.distributed as dist

    from calib_monai.bundle import finalize_distributed

    dist.init_process_group("gloo")
    results = {str(n): validate_synthetic(n) for n in (1, 2, 3)}
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    finalize_distributed()  # as multi_gpu_train.json's finalize


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))  # `test_multi_gpu._volumes` in the config expression
    _worker(sys.argv[1])
    sys.exit(0)

# ---- the tests --------------------------------------------------------------------------------------------------
import pytest  # noqa: E402

from conftest import free_port  # noqa: E402


def _torchrun(script_and_args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        *script_and_args,
    ]


def _training_command(root: Path) -> list[str]:
    """The torchrun command of ``docs/trainer.md``, with demo.json, on tiny phantoms, writing to ``root``."""
    configs = f"['{CONFIGS / 'train.json'}','{CONFIGS / 'demo.json'}','{CONFIGS / 'multi_gpu_train.json'}']"
    cmd = _torchrun(["-m", "monai.bundle", "run", "training", "--config_file", configs])
    overrides = {**TINY, "epochs": EPOCHS, "output_dir": str(root / "models"), "data#cache_dir": str(root / "phantoms")}
    for key, value in overrides.items():
        cmd += [f"--{key}", json.dumps(value) if not isinstance(value, str) else value]
    return cmd


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """2-rank training stopped (SIGTERM to torchrun, as a scheduler does) once the first checkpoint is written,
    then the same command again: (output root, stopped run's log, epoch it had saved, resumed run)."""
    root = tmp_path_factory.mktemp("nacl_flare_ddp")
    cmd = _training_command(root)
    latest = root / "models" / "checkpoint_latest.pt"
    with open(root / "first.log", "w") as log:
        first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV, cwd=root, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while first.poll() is None and not latest.is_file() and time.monotonic() < deadline:
                time.sleep(0.02)
            if first.poll() is None:
                first.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks
            first.wait(timeout=120)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
    stopped_at = _epochs_done(latest)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=root)
    return root, (root / "first.log").read_text(), stopped_at, second


def _epochs_done(checkpoint: Path) -> int:
    trainer = torch.load(checkpoint, weights_only=False)["trainer"]  # ignite stores iterations
    return trainer["iteration"] // trainer["epoch_length"]


def _epoch_lines(log: str) -> list[int]:
    return [
        int(line.split(" - ")[-1].split()[1].split("/")[0])
        for line in log.splitlines()
        if " - calib_monai - INFO - epoch " in line
    ]


def test_killed_run_resumes_where_it_stopped(ddp_run):
    root, first_log, stopped_at, second = ddp_run
    assert 1 <= stopped_at < EPOCHS, f"not stopped before its end (epoch {stopped_at}):\n{first_log[-3000:]}"
    log = second.stdout + second.stderr
    assert second.returncode == 0, log[-4000:]
    assert f"resuming from {root / 'models' / 'checkpoint_latest.pt'}: epoch {stopped_at} done" in log
    # the resumed run trains exactly the epochs left, each reported once (rank 0 only)
    assert _epoch_lines(log) == list(range(stopped_at + 1, EPOCHS + 1))
    assert set(_epoch_lines(first_log)) >= set(range(1, stopped_at + 1))
    assert _epochs_done(root / "models" / "checkpoint_latest.pt") == EPOCHS
    state = torch.load(root / "models" / "checkpoint_latest.pt", weights_only=False)
    assert 0 < state["selection"]["best_metric"] <= 1 and 1 <= state["selection"]["best_metric_epoch"] <= EPOCHS


def test_one_validation_volume_for_two_ranks(ddp_run):
    root, first_log, _, second = ddp_run
    assert len(json.loads((root / "models" / "datalist.json").read_text())["validation"]) == 1
    assert "validation: 1 volume(s) for 2 ranks: every rank validates all of them" in first_log
    assert "val_mean_dice" in second.stdout and "DistributedSampler" not in second.stdout + second.stderr


def _network_def():
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([str(CONFIGS / "train.json"), str(CONFIGS / "demo.json")])
    parser.update({"bundle_root": str(BUNDLE), **TINY})
    return parser.get_parsed_content("network_def")


def test_model_pt_is_the_plain_network(ddp_run):
    root = ddp_run[0]
    best = torch.load(root / "models" / "model.pt", weights_only=True)
    latest = torch.load(root / "models" / "checkpoint_latest.pt", weights_only=False)
    for state in (best, latest["network"]):
        assert not any(key.startswith("module.") for key in state), list(state)[:3]
    _network_def().load_state_dict(best, strict=True)


def test_evaluate_runs_on_the_multi_gpu_model(ddp_run):
    from monai.bundle import ConfigWorkflow

    root = ddp_run[0]
    workflow = ConfigWorkflow(
        config_file=[str(CONFIGS / "train.json"), str(CONFIGS / "demo.json"), str(CONFIGS / "evaluate.json")],
        workflow_type="train",
        run_id="evaluating",
        logging_file=False,
        **TINY,
        output_dir=str(root / "models"),
        eval_dir=str(root / "eval"),
        **{"data#cache_dir": str(root / "phantoms")},
    )
    workflow.initialize()
    workflow.run()
    with open(root / "eval" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and 0.0 <= float(rows[0]["dice_liver"]) <= 1.0


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
def test_export_of_a_module_prefixed_model(ddp_run, tmp_path):
    """A model.pt as multi-GPU runs wrote it before (DDP keys, ``module.``) exports the trained weights."""
    from calib_monai.export import export_bundle

    root = ddp_run[0]
    best = torch.load(root / "models" / "model.pt", weights_only=True)
    torch.save({f"module.{k}": v for k, v in best.items()}, tmp_path / "model.pt")
    paths = export_bundle(
        BUNDLE, output_dir=tmp_path / "out", checkpoint=tmp_path / "model.pt", example_shape=(2, 1, 32, 32, 2)
    )
    network = _network_def().eval()
    network.load_state_dict(best)
    slices = torch.rand(3, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(paths["model.ts"]).eval()(slices), network(slices))


def test_validation_metrics_equal_one_process(tmp_path):
    """1 volume (fewer than ranks: every rank validates it), 2 (one each) and 3 (2 + 1, no padding): the gathered
    MeanDice, ECE and NLL of 2 gloo ranks equal one process's, on every rank."""
    cmd = _torchrun([str(Path(__file__)), str(tmp_path)])
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [[ranks[r][n][1] for r in (0, 1)] for n in ("1", "2", "3")] == [[1, 1], [1, 1], [2, 1]]
    for n in (1, 2, 3):
        reference, count = validate_synthetic(n)
        assert count == n and set(reference) == {"val_mean_dice", "val_ece", "val_nll"}
        for rank in ranks:
            assert rank[str(n)][0] == pytest.approx(reference, abs=1e-6), n
