"""The Triton path of the calibration metrics (``calibration_triton``): the same statistics as the sorted path of the
selected voxels, for every label dtype, batches, ties, values on the bin edges and at the threshold, and the same
error messages. It runs on CUDA, or on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1`` set before the
first import); it skips where Triton is not installed (the CPU image: ``torch`` without CUDA brings none)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (CUDA builds of torch bring it)")

from calib_monai.metrics import calibration_errors  # noqa: E402
from calib_monai.metrics._inputs import select_tensor_voxels  # noqa: E402
from calib_monai.metrics.calibration_sorted import sorted_statistics  # noqa: E402
from calib_monai.metrics.calibration_triton import (  # noqa: E402
    triton_errors,
    triton_path,
    triton_statistics,
    use_triton,
)

if torch.cuda.is_available():
    DEVICE = "cuda"
elif os.environ.get("TRITON_INTERPRET") == "1":
    DEVICE = "cpu"
else:
    pytest.skip("no CUDA device, and no TRITON_INTERPRET=1 for Triton's CPU interpreter", allow_module_level=True)

NAMES = ["ece", "cece", "ml1ace", "tace", "ace"]


def _volumes(b, c, n, dtype=torch.uint8, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(3 * torch.randn(b, c, n, generator=g), 1)
    p[0, :, :4] = 0.0
    p[0, 1, :4] = 1.0  # one-hot voxels: confidence 1, zeros below any threshold
    p[0, :2, 4:8] = 0.5  # ties between classes 0 and 1: the first index wins
    p[0, 2:, 4:8] = 0.0
    edge = [-0.0, 0.2, 0.8] + [0.0] * (c - 3) if c >= 3 else [0.2, 0.8]  # -0.0 keys as 0.0; 0.2 on an edge
    p[-1, :, 8:12] = torch.tensor(edge)[:, None]
    y = torch.randint(0, c, (b, n), generator=g)
    y[0, :12] = torch.arange(12) % c
    return p.to(DEVICE), y.to(dtype).to(DEVICE)


def _reference(p, y, num_bins, include_background, threshold):
    c = p.shape[1]
    p_sel, y_sel = select_tensor_voxels(p.transpose(0, 1).reshape(c, -1), y.reshape(-1), "gt")
    return sorted_statistics(p_sel, y_sel, NAMES, num_bins, include_background, threshold)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_statistics_are_the_sorted_paths(dtype, batch):
    c = 2 if dtype == torch.bool else 4
    p, y = _volumes(batch, c, 700, dtype, seed=batch)
    for include_background in (True, False):
        for num_bins, threshold in ((15, 1e-3), (5, 0.2), (20, 0.0)):  # 0.2: the threshold on a value
            got = triton_statistics(p, y, NAMES, num_bins, include_background, threshold)
            want = _reference(p, y, num_bins, include_background, threshold)
            for name in NAMES:
                # the counts exactly; the float64 sums in another order, a few ulps apart
                torch.testing.assert_close(got[name], want[name], rtol=1e-13, atol=1e-13, msg=name)


def test_the_values_are_the_cpus_and_calibration_errors_take_them_on_cuda():
    p, y = _volumes(2, 5, 3000, torch.int16)
    assert triton_path(p, y, NAMES, "gt")
    with use_triton(False):
        assert not triton_path(p, y, NAMES, "gt") and triton_errors(p, y, 1, NAMES) is None
    cpu = calibration_errors(p.cpu(), y.cpu(), NAMES, num_bins=15, foreground="gt", include_background=False)
    got = triton_errors(p, y, 1, NAMES, num_bins=15, foreground="gt", include_background=False)
    assert list(got) == NAMES and got == pytest.approx(cpu, rel=1e-12, abs=1e-14)
    if p.is_cuda:  # calibration_errors routes CUDA tensors here (CPU tensors take the bucket grid)
        assert calibration_errors(p, y, NAMES, num_bins=15, include_background=False) == got


def test_other_inputs_take_the_sorted_path():
    p, y = _volumes(1, 3, 50)
    assert not triton_path(p.double(), y, NAMES, "gt")
    assert not triton_path(p, y, NAMES, "union")
    assert not triton_path(p, y, ["ece", "nll"], "gt")
    assert not triton_path(p, y.float(), NAMES, "gt")


def test_nothing_selected_is_left_to_the_caller():
    p, y = _volumes(2, 3, 50)
    assert triton_statistics(p, torch.zeros_like(y), NAMES, 15, True, 1e-3) is None


@pytest.mark.parametrize(
    "spoil",
    [
        lambda p, y: p.__setitem__((1, 2, 7), float("nan")),
        lambda p, y: p.__setitem__((0, 0, 3), 1.5),
        lambda p, y: p.mul_(3.0),
        lambda p, y: y.__setitem__((1, 9), 7),
    ],
    ids=["nan", "above-1", "logits", "label-range"],
)
def test_bad_inputs_get_the_sorted_paths_message(spoil):
    p, y = _volumes(2, 3, 50, torch.int64)
    y[:, :] = torch.where(y == 0, 1, y)  # every voxel selected: the spoiled one too
    spoil(p, y)
    with pytest.raises(ValueError) as sorted_error:
        _reference(p, y, 15, True, 1e-3)
    with pytest.raises(ValueError) as triton_error:
        triton_statistics(p, y, NAMES, 15, True, 1e-3)
    assert str(triton_error.value) == str(sorted_error.value)


def test_a_triton_that_fails_hands_over_to_the_sorted_path_once(monkeypatch):
    import calib_monai.metrics.calibration_triton as module

    def broken(*args, **kwargs):
        raise RuntimeError("no C compiler")

    p, y = _volumes(1, 3, 50)
    monkeypatch.setattr(module, "triton_statistics", broken)
    with use_triton(True):  # restores the switch the failure turns off
        with pytest.warns(UserWarning, match="Triton kernels failed .*no C compiler.*sorted path"):
            assert triton_errors(p, y, 1, NAMES) is None
        assert not triton_path(p, y, NAMES, "gt")


@pytest.mark.parametrize("name", ["ece", "cece", "tace", "ml1ace_gt"])
def test_the_metric_class_takes_it_volume_by_volume(name):
    from calib_monai.metrics import SegmentationCalibrationMetric

    p, y = _volumes(3, 4, 700, torch.int16)
    y[1] = 0  # a volume without foreground: NaN and the warning, as on the other paths
    values = {}
    for on in (True, False):
        metric = SegmentationCalibrationMetric(metric_name=name, num_bins=15, foreground="gt", reduction="none")
        with use_triton(on), pytest.warns(UserWarning, match=r"volume\(s\) \[1\] have no foreground voxels"):
            metric(p, y[:, None])
        values[on] = metric.aggregate().cpu()
    assert torch.isnan(values[True][1]).all() and torch.isnan(values[False][1]).all()
    torch.testing.assert_close(values[True], values[False], rtol=1e-12, atol=1e-14, equal_nan=True)


def test_the_metric_class_names_y_pred_in_its_messages():
    from calib_monai.metrics import SegmentationCalibrationMetric

    p, y = _volumes(1, 3, 50)
    y[:, :] = 1
    with pytest.raises(ValueError, match=r"^y_pred must lie in \[0, 1\]"):
        SegmentationCalibrationMetric(metric_name="ece", foreground="gt")(p * 3.0, y[:, None])


@pytest.mark.parametrize("name", ["ece", "tace"])
def test_segmentation_calibration_takes_it_volume_by_volume(name, monkeypatch):
    import calib_monai.metrics.calibration_volume as module
    from calib_monai.metrics import segmentation_calibration

    taken = []
    original = module.triton_volume_statistics
    monkeypatch.setattr(module, "triton_volume_statistics", lambda *a: taken.append(original(*a)) or taken[-1])
    p, y = _volumes(3, 4, 700, torch.int32)
    y[1] = 0  # no foreground: the caller's path, NaN and the warning
    values = {}
    for on in (True, False):
        with use_triton(on), pytest.warns(UserWarning, match=r"volume\(s\) \[1\] have no foreground voxels"):
            values[on] = segmentation_calibration(p, y, name, num_bins=15, foreground="gt", reduction="none")
    assert [t is not None for t in taken] == [True, False, True, False, False, False]  # on: volumes 0 and 2
    torch.testing.assert_close(torch.as_tensor(values[True]), torch.as_tensor(values[False]), equal_nan=True)
    with use_triton(True), pytest.warns(UserWarning):
        assert segmentation_calibration(p, y, name, foreground="gt") == pytest.approx(
            float(values[False][[0, 2]].mean())
        )
