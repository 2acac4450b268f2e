"""Reliability-diagram data and PNG, per-volume DSC / HD95 / ASD through MONAI, and method rankings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.metrics import calibration_binning

from calib_monai.metrics import (
    ece,
    friedman_rank,
    mean_case_rank,
    reliability_diagram_data,
    save_reliability_diagram,
    segmentation_metrics_per_volume,
    sum_rank,
)


def _case(seed=0, shape=(2, 3, 7, 6)):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(2.0 * torch.randn(shape, generator=gen), dim=1)
    labels = torch.randint(0, shape[1], (shape[0], 1, *shape[2:]), generator=gen)
    return probs, labels


# ------------------------------------------------------------------------------------------------- reliability


def test_reliability_data_hand_worked_and_consistent_with_ece():
    # p1 = [.9, .9, .3, .45], y = [1, 0, 0, 1]: conf [.9, .9, .7, .55], correct [1, 0, 1, 0], 5 bins
    p1 = np.array([0.9, 0.9, 0.3, 0.45])
    probs, labels = np.stack([1 - p1, p1]), np.array([1, 0, 0, 1])
    data = reliability_diagram_data(probs, labels, num_bins=5, foreground="all")
    np.testing.assert_array_equal(data["count"], [0, 0, 1, 1, 2])
    np.testing.assert_allclose(data["confidence"], [np.nan, np.nan, 0.55, 0.7, 0.9])
    np.testing.assert_allclose(data["accuracy"], [np.nan, np.nan, 0.0, 1.0, 0.5])
    probs_t, labels_t = _case()
    d = reliability_diagram_data(probs_t, labels_t, num_bins=15)
    ok = d["count"] > 0
    from_bins = (d["count"][ok] * np.abs(d["accuracy"][ok] - d["confidence"][ok])).sum() / d["count"].sum()
    assert from_bins == pytest.approx(ece(probs_t, labels_t), abs=1e-12)


def test_classwise_reliability_matches_monai_calibration_binning():
    probs, labels = _case(1)
    onehot = torch.nn.functional.one_hot(labels[:, 0], 3).movedim(-1, 1).float()
    mean_p, mean_gt, counts = calibration_binning(probs, onehot, num_bins=10, right=True)  # (lo, hi] bins
    ours = reliability_diagram_data(probs, labels, num_bins=10, foreground="all", classwise=True)
    # MONAI bins per volume; pool its bins over the batch by count-weighting
    total = counts.sum(dim=0).numpy()
    np.testing.assert_array_equal(ours["count"], total)
    with np.errstate(invalid="ignore"):
        pooled_p = (torch.nan_to_num(mean_p) * counts).sum(0).numpy() / total
        pooled_gt = (torch.nan_to_num(mean_gt) * counts).sum(0).numpy() / total
    np.testing.assert_allclose(ours["confidence"], pooled_p, rtol=1e-5)
    np.testing.assert_allclose(ours["accuracy"], pooled_gt, rtol=1e-5)


def test_reliability_png_is_written(tmp_path):
    probs, labels = _case(2)
    path = save_reliability_diagram(reliability_diagram_data(probs, labels), tmp_path / "plots" / "rel.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    with pytest.raises(ValueError, match="top-label"):
        save_reliability_diagram(reliability_diagram_data(probs, labels, classwise=True), tmp_path / "x.png")


# ------------------------------------------------------------------------------------------------ segmentation


def test_segmentation_metrics_hand_worked_spacing_and_empty_classes():
    # 1 volume 8x8, 4 classes. class 1: gt rows 2-5 x cols 2-4 (12 px), pred rows 2-4 x cols 2-4 (9 px):
    #   DSC = 2*9/(12+9) = 6/7; surface distances: the gt's last row (row 5) is 1 row from the pred -> HD95 in
    #   (0, 1] rows. class 2: absent from both. class 3: predicted but absent from the gt.
    gt = torch.zeros(1, 1, 8, 8, dtype=torch.long)
    pred = torch.zeros(1, 1, 8, 8, dtype=torch.long)
    gt[0, 0, 2:6, 2:5] = 1
    pred[0, 0, 2:5, 2:5] = 1
    pred[0, 0, 7, 7] = 3
    out = segmentation_metrics_per_volume(pred, gt, num_classes=4)
    assert out["dice"][0, 0] == pytest.approx(6 / 7)
    assert out["hd95"][0, 0] == pytest.approx(1.0)
    assert np.isnan(out["dice"][0, 1:]).all() and np.isnan(out["hd95"][0, 1:]).all()
    # rows 2 mm apart: the one-row gap becomes 2 mm
    out_mm = segmentation_metrics_per_volume(pred, gt, num_classes=4, spacing=(2.0, 1.0))
    assert out_mm["hd95"][0, 0] == pytest.approx(2.0)
    # isotropic 2 mm voxels scale every distance by 2
    out_iso = segmentation_metrics_per_volume(pred, gt, num_classes=4, spacing=2.0)
    assert out_iso["asd"][0, 0] == pytest.approx(2.0 * out["asd"][0, 0]) and out["asd"][0, 0] > 0
    papers = segmentation_metrics_per_volume(pred, gt, num_classes=4, empty_class="papers")
    np.testing.assert_allclose(papers["dice"][0], [6 / 7, 1.0, 0.0])  # class 2 absent from both -> 1
    np.testing.assert_allclose(papers["hd95"][0, 1:], [0.0, 0.0])
    # a class in the gt but never predicted: DSC 0, distances inf (in both conventions)
    missed = segmentation_metrics_per_volume(torch.zeros_like(gt), gt, num_classes=2)
    assert missed["dice"][0, 0] == 0.0 and np.isinf(missed["hd95"][0, 0]) and np.isinf(missed["asd"][0, 0])
    with pytest.raises(ValueError, match="empty_class"):
        segmentation_metrics_per_volume(pred, gt, num_classes=4, empty_class="zero")
    with pytest.raises(ValueError, match="num_classes"):
        segmentation_metrics_per_volume(pred, gt)
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        segmentation_metrics_per_volume(pred, gt, num_classes=2)


def test_segmentation_metrics_accept_probabilities():
    probs, labels = _case(3, shape=(2, 3, 9, 9))
    from_probs = segmentation_metrics_per_volume(probs, labels)
    from_map = segmentation_metrics_per_volume(probs.argmax(1, keepdim=True), labels, num_classes=3)
    for key in ("dice", "hd95", "asd"):
        assert from_probs[key].shape == (2, 2)
        np.testing.assert_array_equal(from_probs[key], from_map[key])


# ----------------------------------------------------------------------------------------------------- ranking


def test_rankings_hand_worked():
    # 3 methods x 2 metrics: DSC (higher better), ECE (lower better)
    scores = np.array([[0.90, 0.10], [0.85, 0.05], [0.80, 0.20]])
    # DSC ranks [1, 2, 3], ECE ranks [2, 1, 3] -> sum [3, 3, 6]; Friedman (mean) [1.5, 1.5, 3]
    np.testing.assert_array_equal(sum_rank(scores, [True, False]), [3, 3, 6])
    np.testing.assert_array_equal(friedman_rank(scores, [True, False]), [1.5, 1.5, 3])
    # ties share the average rank; NaN ranks last
    np.testing.assert_array_equal(sum_rank(np.array([[1.0], [1.0], [np.nan]]), False), [1.5, 1.5, 3])
    # mean-case-rank: 2 methods, 2 cases, metrics (DSC, ECE).
    # case 0: A (.9, .1), B (.8, .2) -> A ranks [1, 1] mean 1, B 2; case 1: A (.7, .3), B (.8, .1) -> A 2, B 1
    cases = np.array([[[0.9, 0.1], [0.7, 0.3]], [[0.8, 0.2], [0.8, 0.1]]])
    np.testing.assert_array_equal(mean_case_rank(cases, [True, False]), [1.5, 1.5])
    with pytest.raises(ValueError, match="methods, cases, metrics"):
        mean_case_rank(scores, True)
