"""The calibration metrics' one implementation (torch; NumPy inputs as CPU tensors): NumPy and torch inputs agree
exactly, and with a float64 brute force (the reference), on inputs with values on bin edges, ties, zeros, ones and
the threshold; chunking; device placement (CPU, meta, CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import calib_monai.metrics.calibration.statistics as statistics
from calib_monai.metrics import (
    SegmentationCalibrationMetric,
    calibration_errors,
    reliability_diagram_data,
    segmentation_calibration,
)

ALL = ("ece", "cece", "tace", "ace", "ml1ace", "nll", "brier")

# Voxels that sit where the binning can go wrong (4 classes); each is planted with a label.
SPECIAL = [
    ([0.5, 0.25, 0.125, 0.125], 1),  # on the edges k / 8 and k / 16: (lo, hi] puts them in the lower bin
    ([0.6, 0.2, 0.2, 0.0], 0),  # float32(0.2), float32(0.6) lie above 0.2, 0.6 but on the float32 edges of 15 bins
    ([0.375, 0.375, 0.125, 0.125], 1),  # tie at the max: argmax is class 0, so this voxel is wrong
    ([0.375, 0.375, 0.125, 0.125], 0),  # ... and this one right
    ([0.25, 0.25, 0.25, 0.25], 3),  # four-way tie
    ([1.0, 0.0, 0.0, 0.0], 2),  # exact ones and zeros
    ([0.0, -0.0, 1.0, 0.0], 2),  # -0.0 is a zero probability
    ([0.997, 0.001, 0.001, 0.001], 1),  # float32(1e-3) > 1e-3: kept by TACE's threshold
    ([1.0 - 3e-9, 1e-9, 1e-9, 1e-9], 1),  # tiny values: ACE bins them too
    ([0.6, 0.2, 0.2, 0.0], 3),
]


def _case(seed: int, dtype: torch.dtype = torch.float32, shape=(3, 4, 9, 8, 5)):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.round(2.0 * torch.randn(shape, generator=gen, dtype=torch.float64))  # rounded: tied values
    probs = torch.softmax(logits, dim=1).to(dtype)
    labels = torch.randint(0, shape[1], (shape[0], 1, *shape[2:]), generator=gen)
    labels[:, :, 0] = 0  # background slab: "gt" and "union" select fewer voxels than "all"
    flat_p, flat_y = probs.view(shape[0], shape[1], -1), labels.view(shape[0], -1)
    for i, (values, label) in enumerate(SPECIAL):
        flat_p[i % shape[0], :, 50 + i] = torch.tensor(values, dtype=torch.float64).to(dtype)
        flat_y[i % shape[0], 50 + i] = label
    return probs, labels


def _brute(probs, labels, num_bins, foreground, include_background, threshold=1e-3) -> dict[str, float]:
    """The definitions written out in float64 loops (independent of the library code)."""
    p = probs.double().numpy().reshape(probs.shape[0], probs.shape[1], -1) + 0.0
    y = labels.numpy().reshape(probs.shape[0], -1)
    argmax = p.argmax(axis=1)  # NumPy: first index on ties
    keep = {"gt": y != 0, "union": (y != 0) | (argmax != 0), "all": np.ones_like(y, dtype=bool)}[foreground]
    v, t, a = p.transpose(1, 0, 2)[:, keep], y[keep], argmax[keep]
    n, m = t.size, num_bins

    # the bin rule: (e_b, e_{b+1}] with e_b = b / M rounded to the inputs' dtype (float32(0.2) > 0.2 is an edge)
    edges = [float(torch.tensor(b / m, dtype=torch.float64).to(probs.dtype)) for b in range(m + 1)]
    edges[0], edges[-1] = -np.inf, np.inf

    def binned_error(values, hits, average=False):
        """Sum over bins of |sum hits - sum values| / n, or (average) the mean over non-empty bins of |mean - mean|."""
        total, gaps = 0.0, []
        for b in range(m):
            in_bin = (values > edges[b]) & (values <= edges[b + 1])
            total += abs(hits[in_bin].sum() - values[in_bin].sum())
            if in_bin.any():
                gaps.append(abs(hits[in_bin].mean() - values[in_bin].mean()))
        return float(np.mean(gaps)) if average else total / values.size

    classes = range(0 if include_background else 1, v.shape[0])
    out = {"ece": binned_error(v.max(axis=0), (a == t).astype(float))}
    out["cece"] = float(np.mean([binned_error(v[k], (t == k).astype(float)) for k in classes]))
    out["ml1ace"] = float(np.mean([binned_error(v[k], (t == k).astype(float), average=True) for k in classes]))
    for name, thr in (("tace", threshold), ("ace", None)):
        errors = []
        for k in classes:
            kept = v[k] > thr if thr is not None else np.ones(n, dtype=bool)
            vk, tk = v[k][kept], (t[kept] == k).astype(float)
            if not vk.size:
                continue
            order = np.lexsort((tk, vk))
            vk, tk = vk[order], tk[order]
            edges = [r * vk.size // m for r in range(m + 1)]
            errors.append(sum(abs(tk[i:j].sum() - vk[i:j].sum()) for i, j in zip(edges[:-1], edges[1:])) / vk.size)
        out[name] = float(np.mean(errors)) if errors else float("nan")
    p_true = v[t, np.arange(n)]
    out["nll"] = float(-np.log(np.maximum(p_true, 1e-12)).mean())
    out["brier"] = float(((v - (t[None] == np.arange(v.shape[0])[:, None])) ** 2).sum(axis=0).mean())
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("num_bins", [8, 15, 16])
@pytest.mark.parametrize("foreground", ["gt", "union", "all"])
def test_torch_equals_numpy_and_float64_brute_force(dtype, num_bins, foreground):
    for seed in (0, 1):
        probs, labels = _case(seed, dtype)
        for include_background in (True, False):
            kw = {"num_bins": num_bins, "foreground": foreground, "include_background": include_background}
            ours = calibration_errors(probs, labels, ALL, **kw)
            numpy_path = calibration_errors(probs.numpy(), labels.numpy(), ALL, **kw)
            brute = _brute(probs, labels, num_bins, foreground, include_background)
            for name in ALL:
                assert ours[name] == pytest.approx(numpy_path[name], rel=1e-12, abs=1e-15), (seed, name)
                assert ours[name] == pytest.approx(brute[name], rel=1e-12, abs=1e-15), (seed, name)


def test_per_volume_values_equal_numpy_for_every_metric():
    probs, labels = _case(3)
    for name in ALL:
        ours = segmentation_calibration(probs, labels, name, 15, "union", "none")
        numpy_path = segmentation_calibration(probs.numpy(), labels.numpy(), name, 15, "union", "none")
        np.testing.assert_allclose(ours, numpy_path, rtol=1e-12, atol=1e-15)


def test_chunks_give_the_same_values(monkeypatch):
    probs, labels = _case(4)
    whole = calibration_errors(probs, labels, ALL, foreground="all")
    monkeypatch.setitem(statistics._CHUNK_VALUES, "cpu", 4 * 37)  # 37 voxels a chunk: many chunks per volume
    chunked = calibration_errors(probs, labels, ALL, foreground="all")
    assert chunked == pytest.approx(whole, rel=1e-12, abs=1e-15)


def test_one_repeated_value_fills_one_bucket():
    # 2**21 voxels (4 chunks) all at p1 = 0.75: one bucket holds them all, and an equal-mass edge cuts it (refined
    # whole); every metric is known exactly: half the voxels labelled 1.
    n = 2**21
    probs = torch.stack([torch.full((n,), 0.25), torch.full((n,), 0.75)])[None]
    labels = (torch.arange(n) % 2)[None]
    names = ("ece", "cece", "tace", "ace")
    out = calibration_errors(probs, labels, names, foreground="all")
    # ECE: |n/2 - .75 n| / n; CECE: class 1 as ECE, class 0 |n/2 - .25 n| / n.
    assert out["ece"] == 0.25 and out["cece"] == 0.25
    # TACE / ACE: sorted by (p, hit), each class has its n/2 non-hits first: of the 15 equal-mass bins, 7 hold no
    # hit (|0 - p|), 7 only hits (|1 - p|) and the middle one half of each: (7 * .75 + 7 * .25 + .25) / 15 = 29/60
    # (up to the rounding of the bin edges floor(r n / 15)).
    assert out["tace"] == out["ace"] == pytest.approx(29 / 60, abs=1e-6)
    expected = calibration_errors(probs.numpy(), labels.numpy(), names, foreground="all")
    assert out == pytest.approx(expected, rel=1e-12, abs=0)


def test_helper_tensors_are_created_on_the_inputs_device():
    # Under torch.device("meta") every factory call without an explicit device makes a meta tensor: mixing one
    # with the CPU inputs, or reading it back, fails. The results must equal those outside the context.
    probs, labels = _case(5)
    expected = {fg: calibration_errors(probs, labels, ALL, foreground=fg) for fg in ("gt", "union", "all")}
    per_volume = segmentation_calibration(probs, labels, "tace", 15, "gt", "none")
    reliability = reliability_diagram_data(probs, labels, classwise=True)
    metric_values = []
    for context in (False, True):
        metric = SegmentationCalibrationMetric("cece", foreground="union")
        if context:
            with torch.device("meta"):
                for fg in ("gt", "union", "all"):
                    assert calibration_errors(probs, labels, ALL, foreground=fg) == expected[fg]
                np.testing.assert_array_equal(
                    segmentation_calibration(probs, labels, "tace", 15, "gt", "none"), per_volume
                )
                got = reliability_diagram_data(probs, labels, classwise=True)
                np.testing.assert_array_equal(got["count"], reliability["count"])
                metric(y_pred=probs, y=labels)
                metric_values.append(metric.aggregate("none"))
        else:
            metric(y_pred=probs, y=labels)
            metric_values.append(metric.aggregate("none"))
    assert metric_values[1].device.type == "cpu"
    torch.testing.assert_close(metric_values[0], metric_values[1], rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_equals_cpu():
    probs, labels = _case(6)
    cpu = calibration_errors(probs, labels, ALL, foreground="union")
    cuda = calibration_errors(probs.cuda(), labels.cuda(), ALL, foreground="union")
    assert cuda == pytest.approx(cpu, rel=1e-12, abs=1e-15)
    for name in ALL:  # per volume
        per_volume = segmentation_calibration(probs.cuda(), labels.cuda(), name, 15, "union", "none")
        expected = segmentation_calibration(probs, labels, name, 15, "union", "none")
        np.testing.assert_allclose(per_volume, expected, rtol=1e-12, atol=1e-15)
