"""What a new user sees: logits passed as probabilities raise a ValueError that says so and names the fix; an empty
foreground warns that the value is NaN; the torch path never copies a volume to the host."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
from ignite.engine import Engine

from calib_monai.handlers import SegmentationReport
from calib_monai.metrics import SegmentationCalibrationMetric, calibration_errors, ece, segmentation_calibration


def _logits(seed=0, shape=(2, 3, 6, 5, 4)):
    gen = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(shape, generator=gen)
    labels = torch.randint(1, shape[1], (shape[0], 1, *shape[2:]), generator=gen)
    return logits, labels


# --------------------------------------------------------------------------------------------- not probabilities


@pytest.mark.parametrize("as_numpy", [False, True], ids=["torch", "numpy"])
def test_logits_raise_a_message_that_names_argument_value_and_fix(as_numpy):
    logits, labels = _logits()
    lo = float(logits[0].min())  # volumes are checked in turn: the first one raises (all its voxels are selected)
    if as_numpy:
        logits, labels = logits.numpy(), labels.numpy()
    with pytest.raises(ValueError) as info:
        ece(logits, labels)
    message = str(info.value)
    assert message.startswith("probs must lie in [0, 1]")
    assert f"holds the value {lo:.9g}" in message  # the most negative value seen
    assert "looks like logits" in message and "torch.softmax(x, dim=1)" in message


@pytest.mark.parametrize("as_numpy", [False, True], ids=["torch", "numpy"])
def test_values_above_one_and_wrong_sums_raise(as_numpy):
    probs = torch.softmax(_logits(1)[0], dim=1)
    labels = _logits(1)[1]
    above = probs.clone()
    above[0, 1, 0, 0, 0] = 3.5  # one value above 1
    halves = probs / 2  # every voxel sums to 0.5
    if as_numpy:
        above, halves, labels = above.numpy(), halves.numpy(), labels.numpy()
    with pytest.raises(ValueError, match=r"holds the value 3\.5 .*looks like logits: apply torch\.softmax\(x, dim=1\)"):
        calibration_errors(above, labels)
    with pytest.raises(
        ValueError,
        match=r"probs must sum to 1 \(within 0\.01\) over the class dimension 1, but the class probabilities "
        r"of a voxel sum to 0\.5.*torch\.softmax\(x, dim=1\)",
    ):
        calibration_errors(halves, labels)


def test_messages_name_the_class_dim_of_the_layout_and_the_metric_argument():
    logits, labels = _logits(2)
    with pytest.raises(ValueError, match=re.escape("torch.softmax(x, dim=0)")):  # unbatched (C, *spatial)
        ece(logits[0], labels[0, 0])
    with pytest.raises(ValueError, match=r"^y_pred must lie in \[0, 1\].*looks like logits"):
        SegmentationCalibrationMetric()(y_pred=logits, y=labels)
    nan = torch.softmax(logits, dim=1)
    nan[0, 0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        ece(nan, labels)


def test_logits_with_an_empty_foreground_still_raise():
    # nothing selected: the whole volume is checked instead (the case where a check of the selection sees nothing)
    logits, labels = _logits(3)
    with pytest.raises(ValueError, match="looks like logits"):
        ece(logits, torch.zeros_like(labels))
    with pytest.raises(ValueError, match="looks like logits"):
        ece(logits.numpy(), np.zeros_like(labels.numpy()))


# --------------------------------------------------------------------------------------------- empty foreground

EMPTY = r"no foreground voxels .*NaN and is left out of the mean over volumes; use foreground='all'.*check the labels"


@pytest.mark.parametrize("as_numpy", [False, True], ids=["torch", "numpy"])
def test_empty_foreground_warns_and_returns_nan(as_numpy):
    logits, labels = _logits(4)
    probs, background = torch.softmax(logits, dim=1), torch.zeros_like(labels)
    if as_numpy:
        probs, background = probs.numpy(), background.numpy()
    with pytest.warns(UserWarning, match="the volume has " + EMPTY):
        assert np.isnan(ece(probs, background))
    with pytest.warns(UserWarning, match=EMPTY):
        out = calibration_errors(probs, background, ("ece", "cece", "tace", "nll"))
    assert all(np.isnan(v) for v in out.values())
    labels_one_empty = background.copy() if as_numpy else background.clone()
    labels_one_empty[0] = 1  # volume 0 all foreground, volume 1 empty
    with pytest.warns(UserWarning, match=r"volume\(s\) \[1\] have " + EMPTY):
        values = segmentation_calibration(probs, labels_one_empty, "ece", reduction="none")
    assert not np.isnan(values[0]) and np.isnan(values[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a selection that is not empty warns nothing
        ece(probs, labels_one_empty)


def test_metric_class_warns_for_empty_volumes_and_leaves_them_out_of_the_mean():
    logits, labels = _logits(5)
    probs = torch.softmax(logits, dim=1)
    labels[1] = 0
    metric = SegmentationCalibrationMetric("tace")
    with pytest.warns(UserWarning, match=r"volume\(s\) \[1\] have " + EMPTY):
        metric(y_pred=probs, y=labels)
    values = metric.aggregate("none")
    assert torch.isnan(values[1]) and float(metric.aggregate()) == pytest.approx(float(values[0]))


# --------------------------------------------------------------------------------------------- no host copies


class HostGuard(torch.Tensor):
    """A tensor that fails when more than ``LIMIT`` of its (derived) values are copied to the host."""

    LIMIT = 512

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.__array__):
            if args[0].numel() > cls.LIMIT:
                raise AssertionError(f"{func.__name__} of {args[0].numel()} values: a volume went to the host")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_volumes_are_never_copied_to_the_host():
    logits, labels = _logits(6, shape=(2, 3, 12, 10, 8))  # 960 voxels a volume: above the guard's limit
    probs = torch.softmax(logits, dim=1)
    guarded = probs.as_subclass(HostGuard)
    with pytest.raises(AssertionError, match="went to the host"):  # the guard works
        guarded.numpy()
    names = ("ece", "cece", "tace", "ace", "ml1ace", "nll", "brier")
    for fg in ("gt", "union", "all"):
        expected = calibration_errors(probs, labels, names, foreground=fg)
        assert calibration_errors(guarded, labels, names, foreground=fg) == expected
    for name in names:
        metric = SegmentationCalibrationMetric(name)
        metric(y_pred=guarded, y=labels)
        plain = SegmentationCalibrationMetric(name)
        plain(y_pred=probs, y=labels)
        torch.testing.assert_close(metric.aggregate("none").as_subclass(torch.Tensor), plain.aggregate("none"))


def test_report_computes_calibration_on_the_device(tmp_path):
    logits, labels = _logits(7, shape=(1, 3, 12, 10, 8))
    prob = torch.softmax(logits[0], dim=0)
    pred = torch.nn.functional.one_hot(prob.argmax(0), 3).permute(3, 0, 1, 2).float()
    item = {"prob": prob.as_subclass(HostGuard), "pred": pred, "label": labels[0]}  # the guard on the probabilities
    report = SegmentationReport(tmp_path, {"0": "background", "1": "a", "2": "b"}, surface_distances=False)
    engine = Engine(lambda e, batch: batch)
    report.attach(engine)
    engine.run([[item]], max_epochs=1)
    row = report.table.rows[0]
    assert row["ece"] == pytest.approx(ece(prob[None], labels), rel=1e-12)
    union = calibration_errors(prob[None], labels, ("tace",), foreground="union")
    assert row["tace_union"] == pytest.approx(union["tace"], rel=1e-12)
    count = report.table.reliability_data()["count"]
    assert count.sum() == int((labels > 0).sum())  # the diagram's bins come from the same (device) statistics


def test_an_empty_batch_is_a_clear_error():
    """A batch without volumes (or a volume without voxels) gave torch's and NumPy's reshape errors."""
    from calib_monai.metrics import SegmentationCalibrationMetric, ece, segmentation_metrics_per_volume

    probs, labels = torch.zeros(0, 3, 8, 8), torch.zeros(0, 1, 8, 8)
    for call in (
        lambda: ece(probs, labels),
        lambda: ece(probs.numpy(), labels.numpy()),
        lambda: SegmentationCalibrationMetric("ece")(probs, labels),
    ):
        with pytest.raises(ValueError, match=r"probs are empty \(shape \(0, 3, 8, 8\)\)"):
            call()
    with pytest.raises(ValueError, match=r"pred is empty \(shape \(0, 3, 8, 8\)\)"):
        segmentation_metrics_per_volume(probs, labels, 3)
