"""scripts/benchmark_calibration.py: its data generator, reference ECE and tables run on tiny sizes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import calib_monai.metrics  # a plain import: the benchmark's tests fail, never skip, when the package or script breaks

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmark_calibration.py"


@pytest.fixture(scope="module")
def bench():
    # exec_module raises on a script that does not import: every test using it then errors (fails), not skips
    spec = importlib.util.spec_from_file_location("benchmark_calibration", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_volumes_are_probabilities_with_blobs(bench):
    probs, labels = bench.make_volumes(2, (32, 32, 8), seed=0)
    assert probs.shape == (2, 5, 32, 32, 8) and probs.dtype == torch.float32
    assert labels.shape == (2, 1, 32, 32, 8) and labels.dtype == torch.int64
    torch.testing.assert_close(probs.sum(1), torch.ones(2, 32, 32, 8))
    assert 0.02 < float((labels > 0).float().mean()) < 0.5
    again, _ = bench.make_volumes(2, (32, 32, 8), seed=0)
    assert torch.equal(probs, again)  # fixed seeds


def test_loop_ece_matches_netcal_and_ours(bench):
    probs, labels = bench.make_volumes(2, (32, 32, 8), seed=1)
    ref = bench.loop_ece(probs, labels)
    assert 0.0 < ref < 1.0
    assert bench.netcal_ece(probs, labels) == pytest.approx(ref, abs=1e-12)
    metrics = calib_monai.metrics
    assert metrics.ece(probs, labels, num_bins=15, foreground="gt") == pytest.approx(ref, abs=1e-12)


def test_interleaved_and_ratio_text(bench):
    times, results = bench.interleaved({"a": lambda: 1, "b": lambda: 2}, repeats=3, warmup=1)
    assert results == {"a": 1, "b": 2} and all(len(t) == 3 for t in times.values())
    assert bench.ratio_text([2.0, 4.0], [1.0, 1.0]) == "3.00x (2.00-4.00)"


def test_quick_run_prints_tables(bench, capsys):
    threads = torch.get_num_threads()
    bench.main(quick=True, skip_losses=True, threads=threads + 1)
    assert torch.get_num_threads() == threads  # given back: later tests' numerics (test_export) depend on it
    out = capsys.readouterr().out
    assert "| ours ECE |" in out and "torchmetrics" in out and "netcal ECE" in out
    for name in ("ECE", "CECE", "TACE"):  # each with its float64 difference and torchmetrics' time ratio
        assert f"| ours {name} |" in out
    assert "| ours ECE+CECE+TACE (fused calibration_errors) |" in out and "torchmetrics / tool" in out
    assert ("GPU part skipped: no CUDA device" in out) != torch.cuda.is_available()
    assert "ours fused / floor" in out and "torchmetrics' ECE alone / ours ECE+CECE+TACE fused: " in out


def test_cpu_time_needs_one_thread(bench, capsys):
    with pytest.raises(ValueError, match="--threads 1"):
        bench.main(quick=True, skip_losses=True, threads=2, cpu_time=True)
    bench.main(quick=True, skip_losses=True, threads=1, cpu_time=True, repeats=1)
    assert "Timer: thread CPU time" in capsys.readouterr().out and bench.CLOCK[0] is bench.time.perf_counter


def test_float64_reference_matches_ours(bench):
    probs, labels = bench.make_volumes(2, (32, 32, 8), seed=2)
    ref = bench.reference_float64(probs, labels)
    metrics = calib_monai.metrics
    ours = metrics.calibration_errors(probs, labels, ("ece", "cece", "tace"), num_bins=15, foreground="gt")
    assert ours == pytest.approx(ref, rel=1e-12, abs=1e-15)


def test_the_serving_benchmark_runs_both_chains_on_a_small_case():
    """scripts/benchmark_serving.py end to end on a tiny case: both variants segment on the input grid (its own
    assertion) and the table and ratio line come out."""
    import subprocess
    import sys

    script = SCRIPT.parent / "benchmark_serving.py"
    args = ["--shape", "24", "20", "10", "--repeats", "1", "--threads", "1"]
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "One case of 24x20x10 voxels, 5 classes, 1 threads, median of 1:"
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ") and "grid" in line] == [
        "| input grid",
        "| network grid",
    ]
    assert lines[-1].startswith("input grid / network grid: ") and lines[-1].endswith("x the memory")
