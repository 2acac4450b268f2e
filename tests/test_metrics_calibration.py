"""Calibration metrics: hand-worked values, peers (netcal, torchmetrics), invariants, exactness and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from calib_monai.metrics import (
    ace,
    brier,
    calibration_errors,
    cece,
    ece,
    ml1ace,
    ml1ace_gt,
    nll,
    segmentation_calibration,
    tace,
)


def _two_class(p1, labels, dtype=np.float64):
    p1 = np.asarray(p1, dtype=dtype)
    return np.stack([1 - p1, p1]), np.asarray(labels)


# ---------------------------------------------------------------------------------------------- hand-worked values


def test_ece_hand_worked_each_foreground():
    # p1 = [.9, .9, .3, .45], y = [1, 0, 0, 1] -> conf = [.9, .9, .7, .55], pred = [1, 1, 0, 0], correct = [1, 0, 1, 0]
    # 5 bins (0,.2] (.2,.4] (.4,.6] (.6,.8] (.8,1]
    probs, labels = _two_class([0.9, 0.9, 0.3, 0.45], [1, 0, 0, 1])
    # all: bin 4 {.9,.9}: 2/4*|.5-.9| = .2; bin 3 {.7}: 1/4*|1-.7| = .075; bin 2 {.55}: 1/4*|0-.55| = .1375 -> .4125
    assert ece(probs, labels, num_bins=5, foreground="all") == pytest.approx(0.4125, abs=1e-12)
    # gt (y != 0): voxels 0, 3: (|1-.9| + |0-.55|)/2 = .325
    assert ece(probs, labels, num_bins=5, foreground="gt") == pytest.approx(0.325, abs=1e-12)
    # union (pred 1 at voxels 0, 1; gt at 0, 3): bin 4 {.9,.9} 2/3*.4 + bin 2 {.55} 1/3*.55 = .45
    assert ece(probs, labels, num_bins=5, foreground="union") == pytest.approx(0.45, abs=1e-12)


def test_ece_argmax_ties_go_to_the_lowest_class_on_both_paths():
    # (.4, .4, .2): argmax is class 0, so label 1 is a wrong prediction and label 0 a right one (conf .4, bin (.2, .4]
    # of 5). Before the fix the NumPy path never tried class 0 and called label 1 right.
    probs = np.array([[0.4, 0.4], [0.4, 0.4], [0.2, 0.2]])  # (C=3, N=2)
    for labels, expected in ((np.array([1, 1]), 0.4), (np.array([0, 0]), 0.6)):
        assert ece(probs, labels, num_bins=5, foreground="all") == pytest.approx(expected, abs=1e-12)
        assert ece(torch.from_numpy(probs), torch.from_numpy(labels), 5, "all") == pytest.approx(expected, abs=1e-12)


THREE = np.array([[[0.7, 0.3, 0.1], [0.2, 0.3, 0.5], [0.1, 0.4, 0.4]]])  # (B=1, C=3, N=3): columns are voxels
THREE_Y = np.array([[0, 2, 1]])


def test_cece_hand_worked_with_and_without_background():
    # 2 bins (0,.5] (.5,1], N = 3, all voxels.
    # class 0: p = [.7,.3,.1], hit = [1,0,0]: bin 1 |1-.7| = .3, bin 0 |0-.4| = .4  -> .7/3
    # class 1: p = [.2,.3,.5] (.5 is in bin 0), hit = [0,0,1]: bin 0 |1-1.0| = 0     -> 0
    # class 2: p = [.1,.4,.4], hit = [0,1,0]: bin 0 |1-.9| = .1                      -> .1/3
    assert cece(THREE, THREE_Y, num_bins=2, foreground="all") == pytest.approx((0.7 / 3 + 0.1 / 3) / 3, abs=1e-12)
    assert cece(THREE, THREE_Y, num_bins=2, foreground="all", include_background=False) == pytest.approx(
        (0 + 0.1 / 3) / 2, abs=1e-12
    )
    # ECE of the same: conf = [.7,.4,.5], all correct: bin 1 |1-.7| + bin 0 |2-.9| = 1.4 -> 1.4/3
    assert ece(THREE, THREE_Y, num_bins=2, foreground="all") == pytest.approx(1.4 / 3, abs=1e-12)


def test_ml1ace_hand_worked_weights_every_non_empty_bin_equally():
    # THREE again, 2 bins (0,.5] (.5,1], all voxels; per class the mean over non-empty bins of |mean p - mean hit|:
    # class 0: bin 1 {.7 hit} |.7 - 1| = .3, bin 0 {.3, .1 no hit} |.2 - 0| = .2    -> (.3 + .2) / 2 = .25
    # class 1: bin 0 {.2, .3, .5; one hit} |1/3 - 1/3| = 0                            -> 0
    # class 2: bin 0 {.1, .4, .4; one hit} |.3 - 1/3| = 1/30                          -> 1/30
    # CECE weights the bins by their voxels (class 0: (1 * .3 + 2 * .2) / 3 = .7/3); mL1-ACE does not.
    with_bg = (0.25 + 0 + 1 / 30) / 3
    assert ml1ace(THREE, THREE_Y, num_bins=2, include_background=True) == pytest.approx(with_bg, abs=1e-12)
    assert ml1ace(THREE, THREE_Y, 2) == pytest.approx(1 / 60, abs=1e-12)  # default: every voxel, no background
    assert ml1ace(torch.from_numpy(THREE), torch.from_numpy(THREE_Y), 2, "all", True) == pytest.approx(17 / 180)
    # gt: voxels 1 (label 2) and 2 (label 1); class 0: bin 0 {.3, .1} .2; class 1: bin 0 {.3, .5 hit} |.4 - .5| = .1;
    # class 2: bin 0 {.4 hit, .4} |.4 - .5| = .1 -> (.2 + .1 + .1) / 3: the earlier default, now ml1ace_gt
    assert ml1ace_gt(THREE, THREE_Y, num_bins=2) == pytest.approx(0.4 / 3, abs=1e-12)
    assert ml1ace(THREE, THREE_Y, 2, "gt", True, "pooled") == pytest.approx(0.4 / 3, abs=1e-12)


def test_tace_and_ace_hand_worked():
    # p1 = [.2,.4,.6,.8], y = [0,1,0,1], R = 2 equal-mass bins of 2 voxels.
    # class 1 sorted: (.2,0) (.4,1) | (.6,0) (.8,1): |1-.6| + |1-1.4| = .8 -> .8/4 = .2; class 0 the mirror: .2
    probs, labels = _two_class([0.2, 0.4, 0.6, 0.8], [0, 1, 0, 1])
    assert tace(probs, labels, num_bins=2, foreground="all") == pytest.approx(0.2, abs=1e-12)
    # add p1 = .0005, y = 0: below the 1e-3 threshold for class 1 (unchanged, .2); class 0 gets p0 = .9995 (hit):
    # sorted (.2,0) (.4,1) | (.6,0) (.8,1) (.9995,1) with edges floor(5/2) = 2: |1-.6| + |2-2.3995| = .7995 -> /5
    probs, labels = _two_class([0.2, 0.4, 0.6, 0.8, 0.0005], [0, 1, 0, 1, 0])
    class0 = 0.7995 / 5
    assert tace(probs, labels, num_bins=2, foreground="all") == pytest.approx((0.2 + class0) / 2, abs=1e-12)
    # SVLS's tace_eval would divide each class term by R = 2 once more; ours is Nixon's weighting.
    # ACE keeps .0005 for class 1: (.0005,0) (.2,0) | (.4,1) (.6,0) (.8,1): |0-.2005| + |2-1.8| = .4005 -> /5
    assert ace(probs, labels, num_bins=2, foreground="all") == pytest.approx((0.4005 / 5 + class0) / 2, abs=1e-12)


def test_nll_and_brier_hand_worked():
    probs = np.array([[[0.8, 0.4], [0.2, 0.6]]])  # (B=1, C=2, N=2): voxel 0 (.8,.2) label 0; voxel 1 (.4,.6) label 1
    labels = np.array([[0, 1]])
    assert nll(probs, labels, foreground="all") == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2, abs=1e-12)
    # (.8-1)^2 + .2^2 = .08; .4^2 + (.6-1)^2 = .32 -> mean .2
    assert brier(probs, labels, foreground="all") == pytest.approx(0.2, abs=1e-12)


def test_reductions_mean_pooled_none():
    # volume 0: the 4-voxel case above (ECE "all" .4125); volume 1: all correct at conf .9 -> |1-.9| = .1
    p_a, y_a = _two_class([0.9, 0.9, 0.3, 0.45], [1, 0, 0, 1])
    p_b, y_b = _two_class([0.9, 0.9, 0.9, 0.9], [1, 1, 1, 1])
    probs, labels = np.stack([p_a, p_b]), np.stack([y_a, y_b])[:, None]
    kw = {"metric_name": "ece", "num_bins": 5, "foreground": "all"}
    np.testing.assert_allclose(segmentation_calibration(probs, labels, reduction="none", **kw), [0.4125, 0.1])
    assert segmentation_calibration(probs, labels, reduction="mean", **kw) == pytest.approx(0.25625)
    # pooled: bin 4 has 6 voxels, 5 correct, conf sum 5.4 -> |5-5.4| = .4; bins 3, 2 as before: .3 + .55 -> 1.25/8
    assert segmentation_calibration(probs, labels, reduction="pooled", **kw) == pytest.approx(1.25 / 8)
    # a volume without foreground is NaN per volume and left out of the mean
    labels_gt = labels.copy()
    labels_gt[1] = 0
    values = segmentation_calibration(probs, labels_gt, "ece", 5, "gt", "none")
    assert np.isnan(values[1]) and segmentation_calibration(probs, labels_gt, "ece", 5, "gt") == pytest.approx(0.325)


# ------------------------------------------------------------------------------------------------------ peers


def _random_case(seed, n=4000, c=4):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, c)) * 2.5
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return probs, rng.integers(0, c, size=n)


@pytest.mark.parametrize("seed", [0, 1])
def test_ece_equals_netcal_and_torchmetrics(seed):
    from netcal.metrics import ECE
    from torchmetrics.functional.classification import multiclass_calibration_error

    probs, labels = _random_case(seed)  # (N, C) float64, no confidence on a bin edge (continuous draws)
    edges = np.linspace(0, 1, 16)
    assert not np.isin(probs.max(axis=1), edges).any()
    ours = ece(probs.T, labels, num_bins=15, foreground="all")
    # netcal: bins [lo, hi) (last closed), confidences clipped to [eps, 1 - eps]: same bins off the edges.
    assert float(ECE(bins=15).measure(probs, labels)) == pytest.approx(ours, abs=1e-9)
    # torchmetrics: [lo, hi) float32 edges and float32 sums: equal to float32 rounding.
    tm = multiclass_calibration_error(torch.from_numpy(probs).float(), torch.from_numpy(labels), 4, 15, "l1")
    assert float(tm) == pytest.approx(ours, abs=1e-5)


# ------------------------------------------------------------------------------------------------- invariants


def test_perfectly_calibrated_ece_is_within_sampling_error():
    # p1 ~ U(0,1), y ~ Bernoulli(p1): calibrated by construction. In bin b (n_b voxels) acc_b - conf_b has standard
    # deviation <= sqrt(1/(4 n_b)); outside 4 sigma in any of the 15 bins with probability < 15 * 6.4e-5 = 1e-3, so
    # ECE <= sum_b n_b/N * 4 sqrt(1/(4 n_b)) = 2 sum_b sqrt(n_b)/N <= 2 sqrt(M/N) (Cauchy-Schwarz).
    rng = np.random.default_rng(7)
    n, m = 200_000, 15
    p1 = rng.random(n)
    labels = (rng.random(n) < p1).astype(np.int64)
    bound = 2 * math.sqrt(m / n)  # 0.0173
    probs = np.stack([1 - p1, p1])
    assert ece(probs, labels, num_bins=m, foreground="all") < bound
    assert cece(probs, labels, num_bins=m, foreground="all") < bound
    # the same labels against over-confident probabilities break the bound: the test can fail
    sharp = np.clip(0.5 + 1.8 * (p1 - 0.5), 0.0, 1.0)
    assert ece(np.stack([1 - sharp, sharp]), labels, num_bins=m, foreground="all") > 5 * bound


def test_permuting_voxels_changes_no_metric():
    rng = np.random.default_rng(3)
    logits = np.round(rng.normal(size=(2, 4, 6, 7, 5)) * 2)  # rounded: many tied probabilities
    probs = torch.softmax(torch.from_numpy(logits).float(), dim=1)
    labels = torch.from_numpy(rng.integers(0, 4, size=(2, 1, 6, 7, 5)))
    perm = torch.from_numpy(rng.permutation(6 * 7 * 5))
    probs_p = probs.reshape(2, 4, -1)[:, :, perm].reshape(probs.shape)
    labels_p = labels.reshape(2, 1, -1)[:, :, perm].reshape(labels.shape)
    for fn in (ece, cece, tace, ace, nll, brier):
        kw = {} if fn in (nll, brier) else {"num_bins": 7}  # NLL and Brier have no bins
        for fg in ("gt", "union", "all"):
            assert fn(probs_p, labels_p, foreground=fg, **kw) == pytest.approx(
                fn(probs, labels, foreground=fg, **kw), rel=1e-12, abs=1e-15
            ), (fn.__name__, fg)


def test_layouts_agree_and_float_labels_accepted():
    probs, labels = _random_case(5, n=40, c=3)
    p = torch.from_numpy(probs.T.reshape(3, 2, 4, 5))  # (C, *spatial)
    y = torch.from_numpy(labels.reshape(2, 4, 5))
    ref = ece(p, y, foreground="all")
    assert ece(p[None], y[None], foreground="all") == pytest.approx(ref)  # (B, C, *), (B, *)
    assert ece(p[None], y[None, None], foreground="all") == pytest.approx(ref)  # (B, 1, *)
    assert ece(p[None].numpy(), y[None, None].float().numpy(), foreground="all") == pytest.approx(ref)


def test_counts_are_exact_beyond_float32_range():
    # 17 volumes of 2^20 voxels (17.8 M > 2^24 = 16.8 M pooled), all with p1 = .75 (bin 11 of 15), half labelled 1: the
    # pooled top-label ECE is exactly |N/2 - .75 N| / N = .25, and the Brier score (label 1: .25^2 + .25^2 = .125;
    # label 0: .75^2 + .75^2 = 1.125) exactly .625. A float32 accumulator cannot count past 2^24:
    assert np.float32(2**24) + np.float32(1) == np.float32(2**24)
    # The volumes are broadcast views of one volume: no 200 MB arrays to build.
    n = 2**20
    one = np.stack([np.full(n, 0.25, dtype=np.float32), np.full(n, 0.75, dtype=np.float32)])
    probs = np.broadcast_to(one, (17, 2, n))
    labels = np.broadcast_to((np.arange(n) % 2).astype(np.uint8), (17, n))
    assert ece(probs, labels, num_bins=15, foreground="all") == 0.25
    assert brier(probs, labels, foreground="all") == 0.625


# ------------------------------------------------------------------------------------------------- bad input


P_OK = np.full((2, 4), 0.5)
Y_OK = np.array([0, 1, 1, 0])


@pytest.mark.parametrize(
    "probs, labels, kwargs, match",
    [
        (P_OK.astype(np.int64), Y_OK, {}, "floating-point"),
        (np.ones((1, 4)), Y_OK, {}, "at least 2 classes"),
        (P_OK * 3, Y_OK, {}, r"lie in \[0, 1\]"),
        (np.full((2, 4), 0.2), Y_OK, {}, "sum to 1"),
        (P_OK, np.array([0, 1, 1]), {}, "does not fit"),
        (P_OK, np.array([0, 1, 2, 0]), {}, r"labels must lie in \[0, 1\]"),
        (P_OK, np.array([0, 1, 0.5, 0]), {}, "integer class indices"),
        (P_OK, Y_OK, {"num_bins": 0}, "num_bins"),
        (P_OK, Y_OK, {"foreground": "background"}, "foreground"),
    ],
)
def test_bad_input_raises(probs, labels, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ece(probs, labels, **{"foreground": "all", **kwargs})


def test_bad_options_raise():
    with pytest.raises(ValueError, match="metric_name"):
        segmentation_calibration(P_OK, Y_OK, metric_name="mce")
    with pytest.raises(ValueError, match="reduction"):
        segmentation_calibration(P_OK, Y_OK, reduction="sum")
    with pytest.raises(ValueError, match="threshold"):
        tace(P_OK, Y_OK, threshold=-1.0)


# ------------------------------------------------------------------------------------------- fused calibration_errors


def _brute_tace(probs, labels, num_bins, foreground, include_background=True, threshold=1e-3):
    """TACE by its definition: per class, sort the selected p_k > threshold by (p_k, [y == k]), cut at
    floor(r n / R)."""
    p = np.asarray(probs, dtype=np.float64).reshape(probs.shape[0], probs.shape[1], -1)
    y = np.asarray(labels).reshape(p.shape[0], -1)
    keep = y != 0 if foreground != "all" else np.ones_like(y, dtype=bool)
    if foreground == "union":
        keep |= p.argmax(axis=1) != 0
    errors = []
    for k in range(0 if include_background else 1, p.shape[1]):
        v, t = p[:, k][keep], (y[keep] == k).astype(np.float64)
        v, t = v[v > threshold], t[v > threshold]
        if not v.size:
            continue
        order = np.lexsort((t, v))
        v, t, n = v[order], t[order], v.size
        edges = [r * n // num_bins for r in range(num_bins + 1)]
        errors.append(sum(abs(t[a:b].sum() - v[a:b].sum()) for a, b in zip(edges[:-1], edges[1:])) / n)
    return float(np.mean(errors)) if errors else float("nan")


def _tied_case(seed, shape=(3, 4, 9, 8, 5)):
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(size=shape) * 2)  # rounded logits: many exactly tied probabilities
    probs = torch.softmax(torch.from_numpy(logits).float(), dim=1)
    labels = torch.from_numpy(rng.integers(0, shape[1], size=(shape[0], 1, *shape[2:])))
    return probs, labels


ALL_METRICS = ("ece", "cece", "tace", "ace", "ml1ace", "nll", "brier")


@pytest.mark.parametrize("foreground", ["gt", "union", "all"])
@pytest.mark.parametrize("include_background", [True, False])
def test_calibration_errors_equal_separate_functions_and_brute_force(foreground, include_background):
    separate = {"ece": ece, "cece": cece, "tace": tace, "ace": ace, "ml1ace": ml1ace, "nll": nll, "brier": brier}
    for seed, (probs, labels) in enumerate([_tied_case(0), _tied_case(1), _tied_case(2, (2, 3, 11, 7, 3))]):
        kw = {"num_bins": 7, "foreground": foreground}
        out = calibration_errors(probs, labels, ALL_METRICS, include_background=include_background, **kw)
        assert list(out) == list(ALL_METRICS)
        for name, fn in separate.items():
            extra = {"include_background": include_background} if name in ("cece", "tace", "ace", "ml1ace") else {}
            extra.update({"reduction": "pooled"} if name == "ml1ace" else {})
            args = {"foreground": foreground} if name in ("nll", "brier") else kw  # no bins
            assert out[name] == pytest.approx(fn(probs, labels, **args, **extra), rel=0, abs=1e-12), (seed, name)
        # the additive metrics also equal the per-volume statistics path, summed (reduction="pooled")
        for name in ("ece", "cece", "ml1ace", "nll", "brier"):
            pooled = segmentation_calibration(probs, labels, name, 7, foreground, "pooled", include_background)
            assert out[name] == pytest.approx(pooled, rel=0, abs=1e-12), (seed, name)
        assert out["tace"] == pytest.approx(
            _brute_tace(probs, labels, 7, foreground, include_background), rel=0, abs=1e-10
        )
        assert out["ace"] == pytest.approx(
            _brute_tace(probs, labels, 7, foreground, include_background, threshold=-1.0), rel=0, abs=1e-10
        )
        # any subset, in any order, gives the same values
        sub = calibration_errors(probs, labels, ("tace", "ece"), include_background=include_background, **kw)
        assert list(sub) == ["tace", "ece"] and sub == {k: out[k] for k in ("tace", "ece")}


def test_calibration_errors_hand_worked_each_foreground():
    # the 4-voxel case of test_ece_hand_worked_each_foreground (5 bins) and the TACE case of test_tace_and_ace
    probs, labels = _two_class([0.9, 0.9, 0.3, 0.45], [1, 0, 0, 1])
    for foreground, expected in (("all", 0.4125), ("gt", 0.325), ("union", 0.45)):
        out = calibration_errors(probs, labels, ("ece", "cece"), num_bins=5, foreground=foreground)
        assert out["ece"] == pytest.approx(expected, abs=1e-12)
        # two classes: p0 = 1 - p1 and [y == 0] = 1 - [y == 1] make both class terms equal, so CECE is one of them
        assert out["cece"] == pytest.approx(cece(probs, labels, num_bins=5, foreground=foreground), abs=1e-12)
    # gt: voxels 0, 3 (p1 = .9 label 1, .45 label 1): class 1 bins (.8,1] |1-.9|, (.4,.6] |1-.45| -> .65/2;
    # class 0 (p0 = .1, .55, no hits): (0,.2] .1, (.4,.6] .55 -> .65/2; CECE = .325
    assert calibration_errors(probs, labels, ("cece",), num_bins=5)["cece"] == pytest.approx(0.325, abs=1e-12)
    probs, labels = _two_class([0.2, 0.4, 0.6, 0.8, 0.0005], [0, 1, 0, 1, 0])
    out = calibration_errors(probs, labels, ("tace", "ace"), num_bins=2, foreground="all")
    class0 = 0.7995 / 5
    assert out["tace"] == pytest.approx((0.2 + class0) / 2, abs=1e-12)
    assert out["ace"] == pytest.approx((0.4005 / 5 + class0) / 2, abs=1e-12)


def test_calibration_errors_bad_options_raise():
    with pytest.raises(ValueError, match="metric_name"):
        calibration_errors(P_OK, Y_OK, ("ece", "mce"))
    with pytest.raises(ValueError, match="at least one"):
        calibration_errors(P_OK, Y_OK, ())
    with pytest.raises(ValueError, match="sum to 1"):
        calibration_errors(np.full((2, 4), 0.2), Y_OK, foreground="all")
