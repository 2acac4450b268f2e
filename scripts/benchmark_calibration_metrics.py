"""Part 1 of ``benchmark_calibration.py`` (see its docstring): the synthetic volumes and the interleaved timer both
parts use, the peers' and float64 reference implementations, and the metric benchmark with its tables.

Imported by ``scripts/benchmark_calibration.py``, the entry point; run that, not this module.
"""

from __future__ import annotations

import cProfile
import gc
import importlib.util
import io
import pstats
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

NUM_CLASSES = 5
NUM_BINS = 15
METRIC_TARGET = 1.0  # ours fused ECE + CECE + TACE at least as fast as torchmetrics' ECE alone
EXACT = 1e-6  # largest relative difference to the float64 references
# the timer of ``interleaved``: wall clock, or (``--cpu_time``, one thread) the thread's CPU time, which leaves out
# the time other jobs keep it off the CPU
CLOCK = [time.perf_counter]


# ----------------------------------------------------------------------------------------------------------------
# synthetic data


def smooth_field(gen: torch.Generator, shape: tuple[int, ...], coarse: int = 5) -> torch.Tensor:
    """Unit-scale random field, smooth on the scale of ``shape / coarse``: coarse noise upsampled (bi/trilinear)."""
    small = torch.randn((1, 1, *[min(coarse, s) for s in shape]), generator=gen)
    mode = "bilinear" if len(shape) == 2 else "trilinear"
    return F.interpolate(small, size=shape, mode=mode, align_corners=True)[0, 0]


def blob_case(gen: torch.Generator, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """One case: ``(logits (C, *shape) float32, labels (*shape) int64)`` with one deformed ellipsoid per organ.

    Labels are the deformed blobs; logits follow the undeformed blobs plus smooth noise, so the "network" is
    confident inside organs and far from them, unsure and sometimes wrong near boundaries (as real models are).
    """
    axes = torch.meshgrid(*[torch.linspace(-1.0, 1.0, s) for s in shape], indexing="ij")
    labels = torch.zeros(shape, dtype=torch.int64)
    logits = torch.empty((NUM_CLASSES, *shape))
    logits[0] = 0.0
    for k in range(1, NUM_CLASSES):
        centre = torch.rand(len(shape), generator=gen) - 0.5
        radius = (0.35 if len(shape) == 3 else 0.2) + 0.2 * torch.rand(len(shape), generator=gen)  # fg ~10-20%
        r2 = sum(((a - c) / r) ** 2 for a, c, r in zip(axes, centre, radius))
        labels[r2 * (1.0 + 0.2 * smooth_field(gen, shape)) < 1.0] = k
        logits[k] = (6.0 * (1.0 - r2.sqrt())).clamp_(-6.0, 6.0)
    for k in range(NUM_CLASSES):
        logits[k] += smooth_field(gen, shape)  # smooth "model error": boundaries shift, some voxels flip
    return logits, labels


def make_volumes(volumes: int, shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``probs (B, C, *shape)`` float32 (filled in place: one big tensor, no stacking copies), labels
    ``(B, 1, *shape)``."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.empty((volumes, NUM_CLASSES, *shape))
    labels = torch.empty((volumes, 1, *shape), dtype=torch.int64)
    for b in range(volumes):
        logits, labels[b, 0] = blob_case(gen, shape)
        torch.softmax(logits, dim=0, out=probs[b])
    return probs, labels


# ----------------------------------------------------------------------------------------------------------------
# timing


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int) -> tuple[dict, dict]:
    """Run every fn ``warmup`` times, then ``repeats`` rounds in rotated order; returns (times per name, last
    result)."""
    results = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            results[name] = fn()
    names, times = list(fns), {name: [] for name in fns}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            gc.disable()  # a collection inside one tool's window would be charged to it alone
            t0 = CLOCK[0]()
            results[name] = fns[name]()
            times[name].append(CLOCK[0]() - t0)
            gc.enable()
    return times, results


def ratio_text(num: list[float], den: list[float]) -> str:
    """Median of per-round ratios ``num/den`` with their min-max: the ratio and its resolution."""
    ratios = [a / b for a, b in zip(num, den)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def best_ratio(num: list[float], den: list[float]) -> str:
    """Ratio of the fastest rounds: under machine contention noise only adds time, so minima are the cleanest."""
    return f"{min(num) / min(den):.2f}x"


def time_text(ts: list[float]) -> str:
    return f"{statistics.median(ts):.4f} ({min(ts):.4f}-{max(ts):.4f})"


# ----------------------------------------------------------------------------------------------------------------
# part 1: metrics


def loop_ece(probs: torch.Tensor, labels: torch.Tensor, num_bins: int = NUM_BINS) -> float:
    """Reference top-label ECE on ground-truth foreground voxels: per bin ``(lo, hi]``, mask and mean, float64."""
    conf, pred = probs.max(dim=1)
    fg = labels[:, 0] > 0
    conf = conf[fg].double()
    correct = (pred[fg] == labels[:, 0][fg]).double()
    edges = torch.linspace(0.0, 1.0, num_bins + 1, dtype=torch.float64)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (conf > lo) & (conf <= hi)
        if lo == 0.0:
            in_bin |= conf == 0.0  # a confidence of exactly 0 cannot occur with C >= 2, kept for completeness
        n = int(in_bin.sum())
        if n:
            total += n * abs(float(correct[in_bin].mean()) - float(conf[in_bin].mean()))
    return total / conf.numel()


def netcal_ece(probs: torch.Tensor, labels: torch.Tensor) -> float:
    from netcal.metrics import ECE

    fg = labels[:, 0] > 0
    x = probs.movedim(1, -1)[fg].double().numpy()  # (N, C) float64: netcal then works in float64 too
    return float(ECE(bins=NUM_BINS).measure(x, labels[:, 0][fg].numpy()))


def edge_hits(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, int]:
    """How many foreground confidences sit exactly on a bin edge (where (lo,hi] and [lo,hi) bins disagree)."""
    conf = probs.max(dim=1).values[labels[:, 0] > 0].numpy()
    e32 = np.linspace(0, 1, NUM_BINS + 1, dtype=np.float32)  # torchmetrics compares float32 to float32 edges
    e64 = np.linspace(0, 1, NUM_BINS + 1)
    return {
        "float32 edges": int(np.isin(conf, e32).sum()),
        "float64 edges": int(np.isin(conf.astype(np.float64), e64).sum()),
        "conf == 1": int((conf == 1.0).sum()),
        "foreground voxels": int(conf.size),
    }


def reference_float64(probs: torch.Tensor, labels: torch.Tensor, num_bins: int = NUM_BINS) -> dict[str, float]:
    """CECE and TACE of the ground-truth foreground voxels written out in float64 NumPy (not timed, not our code):
    per class and bin a mask and a sum for CECE (bins (lo, hi], float32 p * M exact in float64); for TACE the class's
    p > 1e-3 sorted by (p, [y == k]) and cut at floor(r n / M)."""
    fg = labels[:, 0] > 0
    p = probs.movedim(1, -1)[fg].double().numpy()  # (n, C)
    y = labels[:, 0][fg].numpy()
    cece_terms, tace_terms = [], []
    for k in range(p.shape[1]):
        v, t = p[:, k], (y == k).astype(np.float64)
        scaled = v * num_bins
        err = 0.0
        for b in range(num_bins):
            in_bin = (scaled > b) & (scaled <= b + 1) | ((v == 0) & (b == 0))
            err += abs(t[in_bin].sum() - v[in_bin].sum())
        cece_terms.append(err / v.size)
        keep = v > 1e-3
        vk, tk = v[keep], t[keep]
        order = np.lexsort((tk, vk))
        vk, tk = vk[order], tk[order]
        edges = [r * vk.size // num_bins for r in range(num_bins + 1)]
        tace_terms.append(sum(abs(tk[a:b].sum() - vk[a:b].sum()) for a, b in zip(edges[:-1], edges[1:])) / vk.size)
    return {
        "ece": loop_ece(probs, labels, num_bins),
        "cece": float(np.mean(cece_terms)),
        "tace": float(np.mean(tace_terms)),
    }


def benchmark_metrics(
    volumes: int, shape: tuple[int, ...], repeats: int, warmup: int, seed: int, profile: bool
) -> bool:
    from torchmetrics.classification import MulticlassCalibrationError

    from calib_monai.metrics import calibration_errors, cece, ece, tace

    probs, labels = make_volumes(volumes, shape, seed)
    fg_frac = float((labels > 0).float().mean())
    print(
        f"\n## Calibration metrics: {volumes} volumes of {'x'.join(map(str, shape))}, {NUM_CLASSES} classes, "
        f"{NUM_BINS} bins, ground-truth foreground = {100 * fg_frac:.1f}% of voxels, "
        f"probs {probs.nbytes / 2**20:.0f} MiB, torch threads {torch.get_num_threads()}, ours on torch tensors "
        f"(the torch path, on the CPU)\n"
    )

    tm_checked = MulticlassCalibrationError(num_classes=NUM_CLASSES, n_bins=NUM_BINS, norm="l1", ignore_index=0)
    tm_fast = MulticlassCalibrationError(
        num_classes=NUM_CLASSES, n_bins=NUM_BINS, norm="l1", ignore_index=0, validate_args=False
    )

    def run_tm(metric):
        metric.reset()
        metric.update(probs, labels[:, 0])
        return float(metric.compute())

    kw = {"num_bins": NUM_BINS, "foreground": "gt"}
    fns = {
        "ours ECE": lambda: ece(probs, labels, **kw),
        "ours CECE": lambda: cece(probs, labels, **kw),
        "ours TACE": lambda: tace(probs, labels, **kw),
        "ours ECE+CECE+TACE": lambda: calibration_errors(probs, labels, ("ece", "cece", "tace"), **kw),
        "torchmetrics MulticlassCalibrationError": lambda: run_tm(tm_checked),
        "torchmetrics, validate_args=False": lambda: run_tm(tm_fast),
        "netcal ECE": lambda: netcal_ece(probs, labels),
        "per-bin Python loop (float64)": lambda: loop_ece(probs, labels),
    }
    if importlib.util.find_spec("netcal") is None:  # a peer, not a dependency (the tests extra installs it)
        print("netcal is not installed: its row is left out (pip install netcal)\n")
        del fns["netcal ECE"]
    peers = list(fns)[4:]
    names3 = ("ece", "cece", "tace")
    probs_np, labels_u8 = probs.numpy(), labels.to(torch.uint8)

    extra = {  # the one implementation from other inputs, and what reading the inputs once costs
        "ours ECE+CECE+TACE, NumPy input": lambda: calibration_errors(probs_np, labels.numpy(), names3, **kw),
        "ours ECE+CECE+TACE, uint8 labels": lambda: calibration_errors(probs, labels_u8, names3, **kw),
        "memory floor: read probs + int64 labels once": lambda: (torch.aminmax(probs), labels.amax()),
    }
    times, values = interleaved({**fns, **extra}, repeats, warmup)
    fused = values["ours ECE+CECE+TACE"]
    gap = max(abs(fused[k] - values[f"ours {k.upper()}"]) for k in fused)
    assert gap < 1e-12, f"fused and separate values differ by {gap:.1e}"
    ref = reference_float64(probs, labels)
    tm_times = times["torchmetrics MulticlassCalibrationError"]
    ours_sep = [a + b + c for a, b, c in zip(times["ours ECE"], times["ours CECE"], times["ours TACE"])]

    print(
        "| tool | value | value - float64 reference | time s: median (min-max) | torchmetrics / tool: median "
        "(min-max) | best / best |"
    )
    print("|---|---|---|---|---|---|")
    rows = [
        (f"ours {k.upper()}", values[f"ours {k.upper()}"], ref[k], times[f"ours {k.upper()}"])
        for k in ("ece", "cece", "tace")
    ]
    rows.append(("ours ECE+CECE+TACE (fused calibration_errors)", None, None, times["ours ECE+CECE+TACE"]))
    rows.append(("ours ECE + CECE + TACE, separate calls (sum)", None, None, ours_sep))
    rows += [(name, values[name], ref["ece"], times[name]) for name in peers]
    rows += [(name, None, None, times[name]) for name in extra]
    for name in list(extra)[:2]:
        gap = max(abs(values[name][k] - fused[k]) for k in fused)
        assert gap < 1e-12, f"{name} differs from the tensor input by {gap:.1e}"
    for name, value, reference, ts in rows:
        if value is None:
            same = "fused" in name or name in extra and "floor" not in name
            value_text = "ECE/CECE/TACE as above" if same else "-"
            diff_text = f"max {max(abs(fused[k] - ref[k]) for k in ref):.1e}" if same else "-"
        else:
            value_text, diff_text = f"{value:.10f}", f"{value - reference:+.1e}"
        print(
            f"| {name} | {value_text} | {diff_text} | {time_text(ts)} | {ratio_text(tm_times, ts)} "
            f"| {best_ratio(tm_times, ts)} |"
        )

    hits = edge_hits(probs, labels)
    print(f"\nBin-edge hits among foreground confidences: {hits}.")
    print(
        "Definitions: all ECE rows compute top-label ECE = sum_b n_b/N |acc_b - conf_b| over the same voxels "
        "(label != 0), argmax over all 5 classes. Bins: ours and the Python loop use (lo, hi] (ours on the edges k/15 "
        "rounded to float32, the confidences' dtype; the loop on float64 linspace edges); torchmetrics [lo, hi) in "
        "float32 with conf == 1 in an extra 16th bin; netcal [lo, hi) with the last bin closed and confidences "
        "clipped to [eps, 1 - eps]. They can differ only through voxels on an edge (counted above) and float32 "
        "sums (torchmetrics, ~1e-6). The float64 references: the Python loop (ECE) and reference_float64 (CECE, "
        "TACE), NumPy code independent of ours."
    )

    ours_all = times["ours ECE+CECE+TACE"]
    floor = times["memory floor: read probs + int64 labels once"]
    read = (probs.nbytes + labels.nbytes) / 2**30
    print(
        f"\nMemory floor: one read of the inputs ({read:.2f} GiB) takes {time_text(floor)} s "
        f"({read / statistics.median(floor):.1f} GiB/s); ours fused / floor: {ratio_text(ours_all, floor)}"
    )
    print(
        f"\ntorchmetrics ECE / ours: ECE {ratio_text(tm_times, times['ours ECE'])}; CECE "
        f"{ratio_text(tm_times, times['ours CECE'])}; TACE {ratio_text(tm_times, times['ours TACE'])}"
    )
    tm_ratio = statistics.median([a / b for a, b in zip(tm_times, ours_all)])
    worst = max(abs(fused[k] - ref[k]) / abs(ref[k]) for k in ref)
    met = tm_ratio >= METRIC_TARGET and worst < EXACT
    print(
        f"torchmetrics' ECE alone / ours ECE+CECE+TACE fused: {ratio_text(tm_times, ours_all)} (best/best "
        f"{best_ratio(tm_times, ours_all)}); target >= {METRIC_TARGET:.1f}x and max relative |ours - float64| "
        f"< {EXACT:.0e}: speed {tm_ratio:.2f}x, {worst:.1e} -> {'MET' if met else 'MISSED'}"
    )
    benchmark_cuda(probs, labels, repeats, warmup, fused)
    if profile:
        for name in ("ours ECE+CECE+TACE", "torchmetrics MulticlassCalibrationError"):
            with torch.profiler.profile() as prof:
                fns[name]()
            print(
                f"\n### torch.profiler of {name} (top ops by self CPU time)\n```\n"
                f"{prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=12)}\n```"
            )
        prof = cProfile.Profile()
        prof.runcall(fns["ours ECE+CECE+TACE"])
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(12)
        print(f"\n### cProfile of ours ECE+CECE+TACE (cumulative)\n```\n{out.getvalue().strip()}\n```")
    return met


def benchmark_cuda(probs: torch.Tensor, labels: torch.Tensor, repeats: int, warmup: int, cpu_values: dict) -> None:
    """The GPU line, data already there (as in a validation loop): ours fused against torchmetrics' ECE on CUDA,
    timed in the same rounds (each call closed by a synchronisation); or why it is skipped."""
    if not torch.cuda.is_available():
        print("\nGPU part skipped: no CUDA device")
        return
    from torchmetrics.classification import MulticlassCalibrationError

    from calib_monai.metrics import calibration_errors

    p, y = probs.cuda(), labels.cuda()
    peer = MulticlassCalibrationError(
        num_classes=NUM_CLASSES, n_bins=NUM_BINS, norm="l1", ignore_index=0, validate_args=False
    ).cuda()

    def run_peer():
        peer.reset()
        peer.update(p, y[:, 0])
        return float(peer.compute())

    def synced(fn):
        def run():
            out = fn()
            torch.cuda.synchronize()
            return out

        return run

    fns = {
        "ours": lambda: calibration_errors(p, y, ("ece", "cece", "tace"), num_bins=NUM_BINS, foreground="gt"),
        "torchmetrics": run_peer,
    }
    times, values = interleaved({k: synced(f) for k, f in fns.items()}, repeats, warmup)
    gap = max(abs(values["ours"][k] - cpu_values[k]) for k in cpu_values)
    print(
        f"\nCUDA ({torch.cuda.get_device_name()}): ours ECE+CECE+TACE fused {time_text(times['ours'])} s, "
        f"torchmetrics ECE {time_text(times['torchmetrics'])} s: torchmetrics / ours "
        f"{ratio_text(times['torchmetrics'], times['ours'])}; max |CUDA - CPU| {gap:.1e}"
    )
