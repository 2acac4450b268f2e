"""The GPU part of ``benchmark_calibration.py`` (see its docstring): the fused calibration metrics on CUDA, on the
Triton path (where Triton is installed), the sorted path and the CPU's bucket grid, against torchmetrics' ECE on CUDA
and one read of the data, with the kernel launches and host synchronisations of each. Called by
``benchmark_calibration_metrics.benchmark_metrics``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from benchmark_calibration_metrics import NUM_BINS, NUM_CLASSES, interleaved, time_text

__all__ = ["benchmark_cuda", "cuda_calls"]


def benchmark_cuda(
    probs: torch.Tensor, labels: torch.Tensor, repeats: int, warmup: int, cpu_values: dict, tm_times: list[float]
) -> None:
    """The GPU lines, data already there (as in a validation loop): ours fused, torchmetrics' ECE and the memory
    floor (one read of the probabilities and the labels), timed in the same rounds; or why they are skipped."""
    if not torch.cuda.is_available():
        print("\nGPU part skipped: no CUDA device")
        return
    from torchmetrics.classification import MulticlassCalibrationError

    from calib_monai.metrics import calibration_errors
    from calib_monai.metrics.calibration_sorted import use_sorted
    from calib_monai.metrics.calibration_triton import available, use_triton

    p, y = probs.cuda(), labels.cuda()
    peer = MulticlassCalibrationError(
        num_classes=NUM_CLASSES, n_bins=NUM_BINS, norm="l1", ignore_index=0, validate_args=False
    ).cuda()

    def synced(fn):
        def run():
            out = fn()
            torch.cuda.synchronize()  # closes the timing window on the GPU's work, not on the launch
            return out

        return run

    def run_peer():
        peer.reset()
        peer.update(p, y[:, 0])
        return float(peer.compute())

    def ours():
        return calibration_errors(p, y, ("ece", "cece", "tace"), num_bins=NUM_BINS, foreground="gt")

    def sorted_path():  # whole-tensor operations: the path without Triton
        with use_triton(False):
            return ours()

    def grid():  # the CPU's bucket grid, run on the GPU: the path before the sorted one
        with use_sorted(False):
            return ours()

    fns = {"ours": ours, "sorted": sorted_path, "grid": grid, "torchmetrics": run_peer}
    fns["floor"] = lambda: (p.amax(), y.amax())
    times, values = interleaved({k: synced(f) for k, f in fns.items()}, repeats, warmup)
    gap = {k: max(abs(values[k][name] - cpu_values[name]) for name in cpu_values) for k in ("ours", "sorted", "grid")}
    best = {k: min(v) for k, v in times.items()}
    launches = {k: cuda_calls(fns[k]) for k in ("ours", "sorted", "grid", "torchmetrics")}
    path = "Triton path" if available() else "sorted path: Triton is not installed"
    print(
        f"\nCUDA ({torch.cuda.get_device_name()}), one read of the data = the floor {time_text(times['floor'])} s:\n"
        f"- ours ECE+CECE+TACE fused ({path}) {time_text(times['ours'])} s = "
        f"{best['ours'] / best['floor']:.1f}x the floor;\n"
        f"- ours on the sorted path {time_text(times['sorted'])} s = {best['sorted'] / best['floor']:.1f}x the floor; "
        f"sorted / ours {best['sorted'] / best['ours']:.2f}x (best/best);\n"
        f"- ours on the CPU's bucket grid {time_text(times['grid'])} s = "
        f"{best['grid'] / best['floor']:.1f}x the floor; "
        f"grid / ours {best['grid'] / best['ours']:.2f}x (best/best);\n"
        f"- torchmetrics ECE on CUDA {time_text(times['torchmetrics'])} s: torchmetrics / ours "
        f"{best['torchmetrics'] / best['ours']:.2f}x (best/best); torchmetrics on the CPU / ours on CUDA "
        f"{min(tm_times) / best['ours']:.1f}x;\n"
        f"- kernel launches and host synchronisations per call: "
        + "; ".join(f"{k} {n} and {sync}" for k, (n, sync) in launches.items())
        + f";\n- max |CUDA - CPU| over the three: ours {gap['ours']:.1e}, sorted {gap['sorted']:.1e}, "
        f"grid {gap['grid']:.1e}"
    )


def cuda_calls(fn: Callable[[], object]) -> tuple[int, int]:
    """``(kernel launches, host synchronisations)`` of one call of ``fn``, counted by the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    syncs = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
    return launches, syncs - 1  # less the one closing the window
