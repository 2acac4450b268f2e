"""SegmentationCalibrationMetric per volume on CUDA, Triton path against the sorted path, in the same run (10 synthetic
volumes of 192 x 192 x 30, 5 classes, uint8 labels, about 13% foreground; median of 5 calls after one warm-up).
Needs a CUDA device and Triton: ``PYTHONPATH=. python docs/results/benchmarks/cuda/metric_per_volume.py``."""

import statistics
import time

import torch

from calib_monai.metrics import SegmentationCalibrationMetric
from calib_monai.metrics.calibration_triton import use_triton

g = torch.Generator().manual_seed(0)
p = torch.softmax(3 * torch.randn(10, 5, 192, 192, 30, generator=g), 1).cuda()
y = torch.randint(1, 5, (10, 1, 192, 192, 30), generator=g, dtype=torch.uint8)
y[..., :26] = 0
y = y.cuda()
out = {}
for name in ("ece", "cece", "tace"):
    for on in (True, False, True, False):
        m = SegmentationCalibrationMetric(metric_name=name, reduction="none")
        with use_triton(on):
            m(p, y)
            torch.cuda.synchronize()
            ts = []
            for _ in range(5):
                m.reset()
                t = time.perf_counter()
                m(p, y)
                v = m.aggregate()
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t)
        out[name, on] = (statistics.median(ts), v.cpu())
    diff = (out[name, True][1] - out[name, False][1]).abs().max().item()
    print(
        f"{name}: SegmentationCalibrationMetric per volume, 10 volumes: Triton {1000 * out[name, True][0]:.1f} ms, sorted {1000 * out[name, False][0]:.1f} ms, sorted/Triton {out[name, False][0] / out[name, True][0]:.2f}x, max diff {diff:.1e}"
    )
