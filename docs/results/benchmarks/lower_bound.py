"""How fast could ECE + CECE + TACE be on this CPU? Times the least work any exact implementation must do, in C
with the kernel's flags, beside torchmetrics' ECE and ours, on ``scripts/benchmark_calibration.py``'s volumes.

Any exact implementation reads its inputs (the benchmark's memory floor: one read of the probabilities and the
labels), puts every selected voxel's top label into ECE's bins, and every class value into CECE's bins and into
TACE's (other bins: equal-mass, whose edges are only known from the values' order). Timed per call (all volumes):
- ``top-label bins``: over the ground-truth foreground voxels, gathered beforehand, the argmax and ECE's 15
  equal-width bins (count, hits, sum);
- ``class bins``: over the same voxels, every class value into its class's 15 equal-width bins (count, hits, sum): all
  of CECE's work and less than TACE's, whose equal-mass edges need each class's values in order;
- ``read of the gathered voxels``: one read of what the two binning passes read, taken off each of them (a fused
  implementation bins values the floor's read brings in);
- ``gather`` (for the record, not counted): read every label and copy the foreground voxels' class values out.

Reading only what is needed (the labels and the probabilities' cache lines that hold a foreground voxel) would beat
the floor's sequential read of everything; the gather, which does that in C, is slower than the floor here, so the
last row is an estimate: that share of the floor's time.

The bins' tables stay in the L1 cache and carry 4 lanes, as in ``calibration_kernel``. The least work is the floor, the
top-label bins and the class bins twice (CECE's and TACE's, as if TACE's edges were given), each less its read.
Thread CPU time, one thread (the benchmark's documented command), interleaved rounds, median.

    python docs/results/benchmarks/lower_bound.py --volumes 4 --repeats 7
"""

from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[3] / "scripts"))
import benchmark_calibration_metrics as bench  # noqa: E402

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#define LANES 4
#define M 15

int64_t gather(const float *p, const int64_t *y, int64_t size, int64_t c, int64_t cap, float *out, uint8_t *out_y) {
    int64_t j = 0;
    for (int64_t i = 0; i < size; ++i) {
        if (y[i] == 0) continue;
        for (int64_t k = 0; k < c; ++k) out[k * cap + j] = p[k * size + i];
        out_y[j++] = (uint8_t)y[i];
    }
    return j;
}

static inline int64_t bin(float v) { int64_t b = (int64_t)(v * (float)M); return b < M ? b : M - 1; }

double top_label(const float *p, const uint8_t *y, int64_t n, int64_t cap, int64_t c) {
    int64_t counts[LANES][2 * M]; double sums[LANES][M];
    memset(counts, 0, sizeof counts); memset(sums, 0, sizeof sums);
    for (int64_t i = 0; i < n; ++i) {
        float conf = p[i]; int64_t arg = 0;
        for (int64_t k = 1; k < c; ++k) {
            float v = p[k * cap + i];
            int a = v > conf;
            arg = a ? k : arg;
            conf = a ? v : conf;
        }
        int64_t b = bin(conf), l = i & (LANES - 1);
        counts[l][2 * b + (arg == y[i])] += 1; sums[l][b] += conf;
    }
    double out = 0;
    for (int l = 0; l < LANES; ++l) for (int b = 0; b < M; ++b) out += sums[l][b] + counts[l][2 * b + 1];
    return out;
}

double class_bins(const float *p, const uint8_t *y, int64_t n, int64_t cap, int64_t c) {
    double out = 0;
    for (int64_t k = 0; k < c; ++k) {
        const float *row = p + k * cap;
        int64_t counts[LANES][2 * M]; double sums[LANES][M];
        memset(counts, 0, sizeof counts); memset(sums, 0, sizeof sums);
        for (int64_t i = 0; i < n; ++i) {
            int64_t b = bin(row[i]), l = i & (LANES - 1);
            counts[l][2 * b + (y[i] == k)] += 1; sums[l][b] += row[i];
        }
        for (int l = 0; l < LANES; ++l) for (int b = 0; b < M; ++b) out += sums[l][b] + counts[l][2 * b + 1];
    }
    return out;
}
"""


def build() -> ctypes.CDLL:
    flags = ["-O3", "-shared", "-fPIC", "-std=c99", "-fno-strict-aliasing"]  # the removed C kernel's own flags

    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory(prefix="lower_bound_") as folder:  # the loaded library outlives its file
        source, library = Path(folder) / "lb.c", Path(folder) / "lb.so"
        source.write_text(SOURCE)
        subprocess.run([cc, *flags, str(source), "-o", str(library)], check=True)
        lib = ctypes.CDLL(str(library))
    lib.gather.restype = ctypes.c_int64
    lib.top_label.restype = lib.class_bins.restype = ctypes.c_double
    return lib


def main(volumes: int = 4, repeats: int = 7, height: int = 192, depth: int = 30, seed: int = 0) -> None:
    from torchmetrics.classification import MulticlassCalibrationError

    from calib_monai.metrics import calibration_errors

    torch.set_num_threads(1)
    bench.CLOCK[0] = time.thread_time
    lib = build()
    probs, labels = bench.make_volumes(volumes, (height, height, depth), seed)
    c, size = probs.shape[1], probs[0, 0].numel()
    cap = int((labels[:, 0] != 0).flatten(1).sum(1).max())
    buffers = [(torch.empty(c, cap), torch.empty(cap, dtype=torch.uint8)) for _ in range(volumes)]
    counts = [0] * volumes

    def ptr(t: torch.Tensor) -> ctypes.c_void_p:
        return ctypes.c_void_p(t.data_ptr())

    def gather() -> int:
        for b in range(volumes):
            out, out_y = buffers[b]
            counts[b] = lib.gather(ptr(probs[b]), ptr(labels[b]), size, c, cap, ptr(out), ptr(out_y))
        return sum(counts)

    def over_gathered(fn) -> float:
        return sum(fn(ptr(out), ptr(out_y), counts[b], cap, c) for b, (out, out_y) in enumerate(buffers))

    metric = MulticlassCalibrationError(num_classes=c, n_bins=bench.NUM_BINS, norm="l1", ignore_index=0)

    def torchmetrics_ece() -> float:
        metric.reset()
        metric.update(probs, labels[:, 0])
        return float(metric.compute())

    gather()  # the gathered buffers exist before the rounds that read them
    fns = {
        "gather": gather,
        "top-label bins": lambda: over_gathered(lib.top_label),
        "class bins": lambda: over_gathered(lib.class_bins),
        "read of the gathered voxels": lambda: [
            (torch.aminmax(out[:, : counts[b]]), out_y[: counts[b]].max()) for b, (out, out_y) in enumerate(buffers)
        ],
        "memory floor: read probs + int64 labels once": lambda: (torch.aminmax(probs), labels.amax()),
        "ours ECE+CECE+TACE (fused calibration_errors)": lambda: calibration_errors(
            probs, labels, ("ece", "cece", "tace"), num_bins=bench.NUM_BINS, foreground="gt"
        ),
        "torchmetrics MulticlassCalibrationError (ECE)": torchmetrics_ece,
    }
    times, _ = bench.interleaved(fns, repeats, warmup=1)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    peer, floor = (
        med["torchmetrics MulticlassCalibrationError (ECE)"],
        med["memory floor: read probs + int64 labels once"],
    )
    read = med["read of the gathered voxels"]
    parts = floor + (med["top-label bins"] - read) + 2 * (med["class bins"] - read)
    # the floor reads every probability; only the labels and the cache lines (16 floats) holding a foreground voxel
    # are needed: read at the floor's bandwidth, that share of the floor
    lines = float((labels[:, 0] != 0).reshape(volumes, -1, 16).any(-1).float().mean())
    share = (labels.nbytes + lines * probs.nbytes) / (labels.nbytes + probs.nbytes)
    selective = parts - floor * (1 - share)
    print(f"{volumes} volumes of {height}x{height}x{depth}, {c} classes, {sum(counts)} foreground voxels")
    print(f"Thread CPU time, one thread; load average {os.getloadavg()[0]:.1f} (1 min)")
    print("\n| part | median s | / torchmetrics ECE / 10 | / memory floor |\n|---|---|---|---|")
    for name, t in med.items():
        print(f"| {name} | {t:.4f} | {t / (peer / 10):.2f} | {t / floor:.2f} |")
    print(
        "| least work: memory floor + (top-label bins - read) + 2 (class bins - read) | "
        f"{parts:.4f} | {parts / (peer / 10):.2f} | "
        f"{parts / floor:.2f} |"
    )
    print(
        f"| least work with a selective read at the floor's bandwidth (estimate: labels and the {lines:.0%} of the "
        f"probabilities' cache lines that hold foreground) | {selective:.4f} | {selective / (peer / 10):.2f} | "
        f"{selective / floor:.2f} |"
    )
    ours = med["ours ECE+CECE+TACE (fused calibration_errors)"]
    print(
        f"\nThe issue's budgets: torchmetrics ECE / 10 = {peer / 10:.4f} s, 2x the floor = {2 * floor:.4f} s. "
        f"Torchmetrics / least work: {peer / parts:.2f}x; ours fused / least work: {ours / parts:.2f}x"
    )


if __name__ == "__main__":
    import fire

    fire.Fire(main)
