"""Metrics as their papers define them: mL1-ACE (per volume, every voxel, no background, 20 bins), classwise ECE
over every voxel, the earlier ground-truth-foreground mL1-ACE, and num_bins refused in every calibration metric."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from calib_monai.handlers import SegmentationCalibrationError
from calib_monai.metrics import (
    METRIC_DEFINITIONS,
    SegmentationCalibrationMetric,
    ace,
    calibration_errors,
    cece,
    cece_all,
    ece,
    metric_definition,
    ml1ace,
    ml1ace_gt,
    reliability_diagram_data,
    segmentation_calibration,
    tace,
)

THREE = np.array([[[0.7, 0.3, 0.1], [0.2, 0.3, 0.5], [0.1, 0.4, 0.4]]])  # (B=1, C=3, N=3): columns are voxels
THREE_Y = np.array([[0, 2, 1]])


def _volumes(num: int, shape=(48, 48, 16), temperature: float = 1.0, seed: int = 0):
    """Blobs of varying sharpness, ``(B, 3, *shape)`` float32, and labels drawn voxel by voxel from the probabilities
    at temperature 1 (``temperature`` < 1 sharpens the returned probabilities: an overconfident model)."""
    probs, labels = [], []
    for b in range(num):
        g = torch.Generator().manual_seed(seed + b)
        grid = torch.stack(torch.meshgrid(*(torch.linspace(-1, 1, n) for n in shape), indexing="ij"))
        r1 = (grid[0] + 0.3) ** 2 + grid[1] ** 2 + grid[2] ** 2
        r2 = (grid[0] - 0.4) ** 2 + (grid[1] - 0.2) ** 2 + grid[2] ** 2
        logits = torch.stack([torch.zeros_like(r1), 6 * (0.25 - r1), 4 * (0.12 - r2)])
        logits = logits + 0.8 * torch.randn(logits.shape, generator=g)
        p = logits.softmax(0)
        labels.append(torch.multinomial(p.reshape(3, -1).T.double(), 1, generator=g)[:, 0].reshape(shape))
        probs.append((logits / temperature).softmax(0))
    return torch.stack(probs), torch.stack(labels)[:, None]


def _brute_ml1ace(p: np.ndarray, y: np.ndarray, num_bins: int, classes, average: bool = True) -> float:
    """One volume ``p (C, N)`` float64, every voxel: per class, bins ``(k/M, (k+1)/M]`` (0 in the first) by loops."""
    per_class = []
    for k in classes:
        gaps, weights = [], []
        for b in range(num_bins):
            lo, hi = b / num_bins, (b + 1) / num_bins
            members = [i for i in range(p.shape[1]) if (lo < p[k, i] <= hi) or (b == 0 and p[k, i] == 0)]
            if members:
                gaps.append(abs(np.mean([p[k, i] for i in members]) - np.mean([y[i] == k for i in members])))
                weights.append(len(members) / p.shape[1])
        per_class.append(np.mean(gaps) if average else float(np.dot(gaps, weights)))
    return float(np.mean(per_class))


def test_perfectly_calibrated_model_scores_about_zero_on_the_papers_definitions():
    probs, labels = _volumes(2)
    assert ml1ace(probs, labels) < 0.03  # measured 0.013 (finite voxels: sparse high bins are noisy)
    assert cece_all(probs, labels) < 0.005  # measured 0.0025
    # the earlier default (ground-truth foreground, background included) is far from 0 on the same model
    assert ml1ace_gt(probs, labels) > 0.2  # measured 0.36
    # and both named metrics see an overconfident model
    sharp, _ = _volumes(2, temperature=0.5)
    assert ml1ace(sharp, labels) > 3 * ml1ace(probs, labels)
    assert cece_all(sharp, labels) > 3 * cece_all(probs, labels)


def test_ml1ace_defaults_are_per_volume_all_voxels_no_background_20_bins():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 40)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = rng.integers(0, 3, size=(2, 40))
    per_volume = [_brute_ml1ace(probs[b], labels[b], 20, (1, 2)) for b in range(2)]
    assert ml1ace(probs, labels) == pytest.approx(np.mean(per_volume), abs=1e-12)
    assert ml1ace(torch.from_numpy(probs), torch.from_numpy(labels)) == pytest.approx(np.mean(per_volume), abs=1e-12)
    np.testing.assert_allclose(ml1ace(probs, labels, reduction="none"), per_volume, atol=1e-12)
    classwise = [_brute_ml1ace(probs[b], labels[b], 20, (1, 2), average=False) for b in range(2)]
    assert cece_all(probs, labels) == pytest.approx(np.mean(classwise), abs=1e-12)
    # pooled: both volumes' voxels binned together
    pooled = _brute_ml1ace(probs.transpose(1, 0, 2).reshape(3, -1), labels.reshape(-1), 20, (1, 2))
    assert ml1ace(probs, labels, reduction="pooled") == pytest.approx(pooled, abs=1e-12)


def test_hand_worked_tiny_case():
    # THREE, 2 bins (0,.5] (.5,1], every voxel, background excluded (see test_metrics_calibration for the classes):
    # class 1: bin 0 {.2, .3, .5; one hit} |1/3 - 1/3| = 0; class 2: bin 0 {.1, .4, .4; one hit} |.3 - 1/3| = 1/30
    assert ml1ace(THREE, THREE_Y, num_bins=2) == pytest.approx((0 + 1 / 30) / 2, abs=1e-12)
    # classwise ECE weights the bins by their voxels: class 1 0, class 2 3/3 * 1/30
    assert cece_all(THREE, THREE_Y, num_bins=2) == pytest.approx((0 + 1 / 30) / 2, abs=1e-12)
    assert cece_all(THREE, THREE_Y, 2, include_background=True) == pytest.approx((0.7 / 3 + 0 + 0.1 / 3) / 3)
    # gt voxels 1 and 2, background included: (.2 + .1 + .1) / 3 (test_metrics_calibration works it out)
    assert ml1ace_gt(THREE, THREE_Y, num_bins=2) == pytest.approx(0.4 / 3, abs=1e-12)


def test_named_metrics_in_the_metric_class_and_segmentation_calibration():
    probs, labels = _volumes(2, shape=(16, 16, 6))
    for name, function in (("ml1ace", ml1ace), ("cece_all", cece_all)):
        metric = SegmentationCalibrationMetric(name)
        metric(y_pred=probs, y=labels)
        expected = function(probs, labels, reduction="none")
        np.testing.assert_allclose(metric.aggregate("none").numpy(), expected, atol=1e-12)
        assert float(metric.aggregate()) == pytest.approx(function(probs, labels), abs=1e-12)
        assert segmentation_calibration(probs, labels, name) == pytest.approx(function(probs, labels), abs=1e-12)
    gt = SegmentationCalibrationMetric("ml1ace_gt", reduction="pooled")
    gt(y_pred=probs, y=labels)
    assert float(gt.aggregate()) == pytest.approx(ml1ace_gt(probs, labels), abs=1e-12)
    # the other metrics keep the foreground papers' defaults
    assert metric_definition("ece") == ("ece", 15, "gt", True)
    assert metric_definition("ml1ace") == ("ml1ace", 20, "all", False)
    assert metric_definition("ml1ace", 10, "union", True) == ("ml1ace", 10, "union", True)
    assert set(METRIC_DEFINITIONS) == {"ml1ace", "ml1ace_gt", "cece_all"}
    handler = SegmentationCalibrationError(metric_name="cece_all")
    assert (handler.metric_fn.metric_name, handler.metric_fn.foreground, handler.metric_fn.num_bins) == (
        "cece",
        "all",
        20,
    )


def test_a_foreground_contradicting_the_name_is_refused():
    with pytest.raises(
        ValueError, match=r"^foreground of metric 'cece_all' must be 'all' \(its definition\), got 'gt'\.$"
    ):
        SegmentationCalibrationMetric("cece_all", foreground="gt")
    with pytest.raises(ValueError, match=r"^foreground of metric 'ml1ace_gt' must be 'gt'"):
        segmentation_calibration(THREE, THREE_Y, "ml1ace_gt", foreground="all")
    with pytest.raises(ValueError, match=r"^metric_name must be one of"):
        calibration_errors(THREE, THREE_Y, ("cece_all",))  # names of calibration_errors are the formulas


BAD_BINS = [0, -5, 2.5, True, None, "15", np.float64(3.0)]
CALLS = {
    "ece": lambda b: ece(THREE, THREE_Y, num_bins=b),
    "cece": lambda b: cece(THREE, THREE_Y, num_bins=b),
    "tace": lambda b: tace(THREE, THREE_Y, num_bins=b),
    "ace": lambda b: ace(THREE, THREE_Y, num_bins=b),
    "ml1ace": lambda b: ml1ace(THREE, THREE_Y, num_bins=b),
    "ml1ace_gt": lambda b: ml1ace_gt(THREE, THREE_Y, num_bins=b),
    "cece_all": lambda b: cece_all(THREE, THREE_Y, num_bins=b),
    "calibration_errors": lambda b: calibration_errors(torch.from_numpy(THREE), torch.from_numpy(THREE_Y), num_bins=b),
    "segmentation_calibration": lambda b: segmentation_calibration(
        THREE, THREE_Y, "cece", num_bins=b, foreground="all"
    ),
    "reliability": lambda b: reliability_diagram_data(THREE, THREE_Y, num_bins=b),
    "metric class": lambda b: SegmentationCalibrationMetric("ml1ace", num_bins=b),
    "handler": lambda b: SegmentationCalibrationError("ece", num_bins=b),
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("num_bins", BAD_BINS)
def test_num_bins_must_be_a_positive_integer_everywhere(call, num_bins):
    if num_bins is None and call in ("segmentation_calibration", "metric class", "handler"):
        CALLS[call](num_bins)  # None: the metric's own number of bins
        return
    with pytest.raises(ValueError, match=rf"^num_bins must be an integer >= 1, got {re.escape(repr(num_bins))}\.$"):
        CALLS[call](num_bins)


@pytest.mark.parametrize(("name", "reduction"), [("ml1ace", "average"), ("cece_all", "expected")])
def test_defaults_equal_monai_calibration_error_as_the_authors_evaluate(name, reduction):
    # the authors' evaluation (inference_eval.yaml): CalibrationErrorHandler, 20 bins, include_background False,
    # per case then the mean; "average" is mL1-ACE, "expected" the classwise ECE over every voxel
    from monai.metrics import CalibrationErrorMetric

    probs, labels = _volumes(2, shape=(20, 20, 6))
    monai = CalibrationErrorMetric(num_bins=20, include_background=False, calibration_reduction=reduction)
    monai(probs, torch.nn.functional.one_hot(labels[:, 0], 3).permute(0, 4, 1, 2, 3).float())
    ours = {"ml1ace": ml1ace, "cece_all": cece_all}[name](probs, labels)
    assert ours == pytest.approx(float(monai.aggregate()), rel=1e-5)
