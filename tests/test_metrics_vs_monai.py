"""Our calibration metrics against MONAI 1.6.1's ``CalibrationErrorMetric`` where the two definitions agree.

MONAI's metric is a *classwise* ECE: for each volume and each channel k, equal-width bins of ``p_k`` over *all*
voxels, compared with the one-hot ``[y == k]``; then the mean over channels and volumes. That is our CECE with
``foreground="all"`` averaged over volumes (``SegmentationCalibrationMetric("cece", reduction="mean")``); with
``calibration_reduction="average"`` (non-empty bins weighted equally) it is our mL1-ACE, averaged the same way.
Bins: ours are ``(e_k, e_{k+1}]`` with ``e_k = k / M`` rounded to the inputs' dtype (the papers' code compares in
float32). MONAI's edges are ``k (1 + eps32) / M`` in float32, so a value on an edge also falls in the lower bin,
whatever its ``right`` flag (its ``small_left_edge`` case, checked below). MONAI accumulates in float32 (ours:
int64 counts, float64 sums), hence a tolerance of 1e-6 relative. Where the definitions differ (not compared): our
ECE bins the *top-label* confidence, and our default voxel selection is the ground-truth foreground, which MONAI has
no option for.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from monai.metrics import CalibrationErrorMetric

from calib_monai.metrics import SegmentationCalibrationMetric, cece

NUM_CLASSES, NUM_BINS = 4, 15


def _volumes(seed: int, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (batch, 1, 12, 10, 6), generator=gen)
    logits = 2.5 * F.one_hot(labels[:, 0], NUM_CLASSES).permute(0, 4, 1, 2, 3).double()
    logits += torch.randn(logits.shape, generator=gen, dtype=torch.float64) * 1.5
    return torch.softmax(logits, dim=1), labels


def _monai(probs: torch.Tensor, labels: torch.Tensor, **kwargs) -> float:
    metric = CalibrationErrorMetric(num_bins=NUM_BINS, **kwargs)
    metric(probs, F.one_hot(labels[:, 0], NUM_CLASSES).permute(0, 4, 1, 2, 3).to(probs.dtype))
    return float(metric.aggregate())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classwise_ece_on_all_voxels_equals_monai_calibration_error(seed):
    probs, labels = _volumes(seed)
    ours = SegmentationCalibrationMetric("cece", num_bins=NUM_BINS, foreground="all", reduction="mean")
    ours(probs, labels)
    assert float(ours.aggregate()) == pytest.approx(_monai(probs, labels), rel=1e-6)
    # one volume: the plain function
    assert cece(probs[:1], labels[:1], NUM_BINS, foreground="all") == pytest.approx(
        _monai(probs[:1], labels[:1]), rel=1e-6
    )


def test_without_background_equals_monai_without_background():
    probs, labels = _volumes(3)
    ours = SegmentationCalibrationMetric("cece", num_bins=NUM_BINS, foreground="all", include_background=False)
    ours(probs, labels)
    assert float(ours.aggregate()) == pytest.approx(_monai(probs, labels, include_background=False), rel=1e-6)


def test_values_on_bin_edges_fall_in_the_lower_bin_as_in_monai():
    # 4 bins; voxel A p = (0.5, 0.5, 0) label 0, voxel B p = (0.3, 0.6, 0.1) label 1. With (l, r] bins:
    # class 0: 0.5 and 0.3 share (0.25, 0.5] -> |0.5 - 0.4| = 0.1; class 1: 0.5 in (0.25, 0.5], 0.6 in (0.5, 0.75]
    # -> (0.5 + 0.4) / 2 = 0.45; class 2: 0 and 0.1 share bin 0 -> 0.05. Mean 0.2 ([l, r) bins would give 1/6).
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.3, 0.6, 0.1]], dtype=torch.float64).T.reshape(1, 3, 2, 1, 1)
    labels = torch.tensor([0, 1]).reshape(1, 1, 2, 1, 1)
    ours = cece(probs.contiguous(), labels, num_bins=4, foreground="all")
    assert ours == pytest.approx(0.2, rel=1e-12)
    for right in (False, True):
        metric = CalibrationErrorMetric(num_bins=4, right=right)
        metric(probs, F.one_hot(labels[:, 0], 3).permute(0, 4, 1, 2, 3).double())
        assert float(metric.aggregate()) == pytest.approx(ours, rel=1e-6)


@pytest.mark.parametrize("include_background", [True, False])
def test_ml1ace_on_all_voxels_equals_monai_average_calibration_error(include_background):
    # calibration_reduction="average": the mean over each (volume, channel)'s non-empty bins, then over channels
    # and volumes: our mL1-ACE per volume on all voxels, averaged over volumes
    probs, labels = _volumes(4)
    ours = SegmentationCalibrationMetric(
        "ml1ace", num_bins=NUM_BINS, foreground="all", include_background=include_background
    )
    ours(probs, labels)
    monai = _monai(probs, labels, calibration_reduction="average", include_background=include_background)
    assert float(ours.aggregate()) == pytest.approx(monai, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_confidences_on_rounded_edges_fall_in_the_lower_bin_as_monai_small_left_edge(dtype):
    """MONAI's ``small_left_edge`` binning case: p = 0.8, 0.2, 0.4, 0.6 with 5 bins land in bins 3, 0, 1, 2 (counts
    [1, 1, 1, 1, 0], as its test states). float32(0.2) = 0.2000000030 lies *above* 0.2, so a rule with edges at k / M
    as real numbers put it in bin 1; the edges are k / M rounded to the confidences' dtype, so it stays in bin 0."""
    from monai.metrics.calibration import calibration_binning

    from calib_monai.metrics import reliability_diagram_data
    from calib_monai.metrics.calibration import equal_width_bin

    p1 = torch.tensor([0.8, 0.2, 0.4, 0.6], dtype=dtype)
    assert equal_width_bin(p1, 5).tolist() == [3, 0, 1, 2]
    _, _, monai_counts = calibration_binning(p1.reshape(1, 1, 4), torch.tensor([[[1, 0, 0, 1]]]), num_bins=5)
    assert monai_counts.flatten().tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]  # the test case's stated expectation
    probs = torch.stack([1 - p1, p1]).reshape(1, 2, 4, 1, 1)
    labels = torch.tensor([1, 0, 0, 1]).reshape(1, 1, 4, 1, 1)
    for given in (probs, probs.numpy()):  # torch and NumPy inputs
        data = reliability_diagram_data(given, labels, num_bins=5, foreground="all", classwise=True)
        assert data["count"][1].tolist() == [1, 1, 1, 1, 0]
        # top-label bins of max(p, 1 - p) = 0.8, 0.8, 0.6, 0.6: bins 3 and 2 (0.6 and 0.8 are edges too)
        top = reliability_diagram_data(given, labels, num_bins=5, foreground="all")
        assert top["count"].tolist() == [0, 0, 2, 2, 0]
