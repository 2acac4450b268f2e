"""calibration_kernel (issue 32.1): the compiled CPU pass gives the eager torch path's statistics, for labels of every
integer dtype and over many chunks, and the eager path takes over when it is switched off or cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
from test_metrics_torch_calibration import ALL, _brute, _case

import calib_monai.metrics.calibration_kernel as kernel
import calib_monai.metrics.calibration_torch as calibration_torch
from calib_monai.metrics import calibration_errors
from calib_monai.metrics.calibration_torch import CalibrationAccumulator

pytestmark = pytest.mark.skipif(not kernel.available(torch.zeros(2, 1), torch.zeros(1, dtype=torch.uint8)),
                                reason="no C compiler: the eager path runs (covered by the other tests)")  # fmt: skip


def _both(probs, labels, **kw):
    with kernel.use_kernel(False):
        eager = calibration_errors(probs, labels, ALL, **kw)
    with kernel.use_kernel(True):
        compiled = calibration_errors(probs, labels, ALL, **kw)
    return eager, compiled


@pytest.mark.parametrize("label_dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("foreground", ["gt", "all"])
def test_kernel_equals_eager_and_brute_force(label_dtype, foreground):
    probs, labels = _case(0)
    if label_dtype == torch.bool:  # two classes (bool labels are read as uint8)
        gen = torch.Generator().manual_seed(0)
        probs = torch.softmax(torch.round(2.0 * torch.randn((2, 2, 9, 8, 5), generator=gen)), dim=1)
        labels = torch.rand((2, 1, 9, 8, 5), generator=gen) < 0.6
    labels = labels.to(label_dtype)
    for num_bins in (8, 15):
        kw = {"num_bins": num_bins, "foreground": foreground}
        eager, compiled = _both(probs, labels, **kw)
        brute = _brute(probs, labels.long(), num_bins, foreground, True)
        assert compiled == pytest.approx(eager, rel=1e-12, abs=1e-15)
        assert compiled == pytest.approx(brute, rel=1e-12, abs=1e-15)


def test_kernel_is_used_and_reads_labels_in_place(monkeypatch):
    probs, labels = _case(1)
    seen = []
    original = kernel.chunk_statistics
    monkeypatch.setattr(kernel, "chunk_statistics", lambda p, y, *a: seen.append(y.dtype) or original(p, y, *a))
    acc = CalibrationAccumulator(("ece", "tace"), num_classes=4)
    acc.add(probs[0].reshape(4, -1), labels[0, 0].reshape(-1).to(torch.int16))
    assert acc.kernel and seen == [torch.int16]  # no int64 copy of the labels
    with kernel.use_kernel(False):
        eager = CalibrationAccumulator(("ece", "tace"), num_classes=4)
        eager.add(probs[0].reshape(4, -1), labels[0, 0].reshape(-1))
    assert not eager.kernel
    assert acc.adaptive_errors() == pytest.approx(eager.adaptive_errors(), rel=1e-12)
    torch.testing.assert_close(acc.statistics("ece"), eager.statistics("ece"), rtol=1e-12, atol=0)


def test_kernel_over_many_chunks_and_flushes(monkeypatch):
    probs, labels = _case(4)
    whole = calibration_errors(probs, labels, ALL, foreground="all")
    monkeypatch.setattr(calibration_torch, "_CPU_CHUNK_VALUES", 4 * 37)
    monkeypatch.setattr(calibration_torch, "_PACK_FLUSH", 100)
    eager, compiled = _both(probs, labels, foreground="all")
    assert compiled == pytest.approx(whole, rel=1e-12, abs=1e-15)
    assert compiled == pytest.approx(eager, rel=1e-12, abs=1e-15)


def test_float64_and_out_of_range_labels():
    probs, labels = _case(2, torch.float64)
    acc = CalibrationAccumulator(ALL, num_classes=4)
    acc.add(probs[0].reshape(4, -1), labels[0, 0].reshape(-1))
    assert acc.kernel is False  # float64: the eager path
    acc = CalibrationAccumulator(("cece",), num_classes=4)
    bad = labels[0, 0].reshape(-1).clone()
    bad[3] = 7
    with pytest.raises(ValueError, match="labels must lie in"):
        acc.add(probs[0].reshape(4, -1).float(), bad)


def test_failed_build_falls_back_to_eager_once(monkeypatch, caplog):
    probs, labels = _case(3)
    expected = calibration_errors(probs, labels, ALL, foreground="gt")
    monkeypatch.setattr(kernel, "_library", None)
    monkeypatch.setattr(kernel, "_failed", False)
    monkeypatch.setenv("CC", "no-such-compiler-calib-monai")
    with caplog.at_level(logging.WARNING, logger=kernel.__name__):
        for _ in range(2):
            assert calibration_errors(probs, labels, ALL, foreground="gt") == pytest.approx(expected, rel=1e-12)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "eager" in caplog.records[0].message and not kernel.available(
        probs[0].reshape(4, -1), labels[0, 0].reshape(-1)
    )


@pytest.mark.parametrize("label_dtype", [torch.uint8, torch.int16, torch.int64])
def test_kernel_selection_equals_select_tensor_voxels(label_dtype):
    from calib_monai.metrics._inputs import select_tensor_voxels

    probs, labels = _case(5)
    p, y = probs[1].reshape(4, -1), labels[1, 0].reshape(-1).to(label_dtype)
    for foreground in ("gt", "union", "all"):
        expected = select_tensor_voxels(p, y, foreground)
        got = kernel.select_voxels(p, y, foreground)
        assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, expected))
    assert kernel.select_gt(p, torch.zeros_like(y)) is None  # nothing selected: the caller checks the whole volume
    for bad_p, bad_y in ((p * 3.0, y), (p.clone().index_fill_(1, y.nonzero()[:2, 0], float("nan")), y)):
        with pytest.raises(ValueError) as expected:
            select_tensor_voxels(bad_p, bad_y, "gt")
        with pytest.raises(ValueError) as got:
            kernel.select_voxels(bad_p, bad_y, "gt")
        assert str(got.value) == str(expected.value)
    bad_y = y.clone()
    bad_y[y.nonzero()[0, 0]] = 9
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\] for 4 classes, got \[1, 9\]"):
        kernel.select_voxels(p, bad_y, "gt")


def _accumulate(p, y, fused, names=("ece", "cece", "tace")):
    acc = CalibrationAccumulator(names, num_classes=p.shape[0])
    if not (fused and kernel.add_volume(acc, p, y)):
        acc.add(*kernel.select_voxels(p, y, "gt"))
    return acc


@pytest.mark.parametrize("label_dtype", [torch.uint8, torch.int16, torch.int64])
@pytest.mark.parametrize("slab", [None, 50])
def test_one_pass_over_a_volume_equals_selecting_then_adding(monkeypatch, label_dtype, slab):
    # add_volume selects and accumulates in one pass over the labels; the same tables and values as select_voxels
    # then add, bit for bit: also when the volume is cut into slabs of 50 voxels with a flush of the packed histogram
    if slab:
        monkeypatch.setattr(kernel, "PACK_FLUSH", slab)
    probs, labels = _case(5)
    p, y = probs[1].reshape(4, -1), labels[1, 0].reshape(-1).to(label_dtype)
    fused, plain = _accumulate(p, y, True), _accumulate(p, y, False)
    assert fused.count == plain.count == int((y != 0).sum()) and len(fused.chunks) == (
        -(-p.shape[1] // slab) if slab else 1
    )
    for name in ("ece", "cece"):
        assert torch.equal(fused.statistics(name), plain.statistics(name))
    assert fused.adaptive_errors() == plain.adaptive_errors()


def test_one_pass_checks_as_the_selection_and_leaves_what_it_cannot_take():
    probs, labels = _case(5)
    p, y = probs[1].reshape(4, -1), labels[1, 0].reshape(-1)
    for bad_p, bad_y in ((p * 3.0, y), (p.clone().index_fill_(1, y.nonzero()[:2, 0], float("nan")), y)):
        with pytest.raises(ValueError) as expected:
            kernel.select_voxels(bad_p, bad_y, "gt")
        with pytest.raises(ValueError) as got:
            kernel.add_volume(CalibrationAccumulator(("ece", "tace"), 4), bad_p, bad_y)
        assert str(got.value) == str(expected.value)
    bad_y = y.clone()
    bad_y[y.nonzero()[0, 0]] = 9  # a label beyond the tables: an error, no write outside them
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\] for 4 classes, got \[1, 9\]"):
        kernel.add_volume(CalibrationAccumulator(("ece", "tace"), 4), p, bad_y)
    # nothing added, the caller's path runs: no foreground (checked whole there), NLL / Brier, float64, 5 classes
    assert not kernel.add_volume(CalibrationAccumulator(("ece",), 4), p, torch.zeros_like(y))
    assert not kernel.add_volume(CalibrationAccumulator(("ece", "nll"), 4), p, y)
    assert not kernel.add_volume(CalibrationAccumulator(("ece",), 4), p.double(), y)
    assert not kernel.add_volume(CalibrationAccumulator(("ece",), 5), p, y)
