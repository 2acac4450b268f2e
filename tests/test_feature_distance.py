"""Feature distances: Ledoit-Wolf shrinkage against the formula written out per case, the full-conformal distances
on a hand-worked set and their ranks uniform for exchangeable cases, JSON round trips, and the bottleneck hook on real
MONAI networks (shapes, and the pooled mean equal to the mean over every slice and position)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from monai.inferers import SliceInferer

from calib_monai.metrics.feature_distance import MahalanobisDistance, feature_distance_from_dict, ledoit_wolf_covariance
from calib_monai.metrics.network_features import BottleneckFeatures, bottleneck_module_name
from calib_monai.networks import backbone


def reference_ledoit_wolf(x: np.ndarray) -> tuple[np.ndarray, float]:
    """Ledoit & Wolf (2004), Lemma 3.2-3.3 written per case: b2 from each x_k x_k^T, not the compact identity."""
    n, p = x.shape
    xc = x - x.mean(0)
    s = sum(np.outer(r, r) for r in xc) / n
    m = np.trace(s) / p
    d2 = np.linalg.norm(s - m * np.eye(p), "fro") ** 2
    b2_bar = sum(np.linalg.norm(np.outer(r, r) - s, "fro") ** 2 for r in xc) / n**2
    shrink = min(b2_bar, d2) / d2
    return shrink * m * np.eye(p) + (1 - shrink) * s, shrink


def test_ledoit_wolf_hand_worked_and_reference():
    # 4 cases in 2D, centred already: (1,0), (-1,0), (0,2), (0,-2): S = diag(0.5, 2), m = 1.25, d2 = 2 * 0.75^2 = 1.125
    # sum_k ||x_k x_k^T - S||^2: (1,0): (0.5^2 + 2^2) = 4.25 twice; (0,2): (0.5^2 + 2^2) = 4.25 twice -> 17 / 16
    # b2 = 1.0625 < d2 -> s = 1.0625 / 1.125 = 0.9444...; C = diag(0.5 (1 - s) + 1.25 s, 2 (1 - s) + 1.25 s)
    x = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    cov, shrink = ledoit_wolf_covariance(x)
    s = 1.0625 / 1.125
    assert shrink == pytest.approx(s, rel=1e-12)
    np.testing.assert_allclose(cov, np.diag([0.5 * (1 - s) + 1.25 * s, 2 * (1 - s) + 1.25 * s]), rtol=1e-12)
    rng = np.random.default_rng(0)
    for n, p in ((6, 4), (30, 5), (5, 12)):
        x = rng.normal(size=(n, p)) * rng.uniform(0.1, 3, size=p) + rng.normal(size=p)
        cov, shrink = ledoit_wolf_covariance(x)
        ref_cov, ref_shrink = reference_ledoit_wolf(x)
        assert shrink == pytest.approx(ref_shrink, rel=1e-10)
        np.testing.assert_allclose(cov, ref_cov, rtol=1e-10, atol=1e-12)


def test_mahalanobis_equals_hand_computed_distance_without_projection():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 3)) * [1.0, 4.0, 0.5]
    model = MahalanobisDistance(max_dim=3).fit(x)
    assert model.components is None
    cov, _ = reference_ledoit_wolf(x)
    for v in (np.array([0.3, -2.0, 1.0]), x[0], np.zeros(3)):
        diff = v - x.mean(0)
        assert model.distance(v) == pytest.approx(math.sqrt(diff @ np.linalg.solve(cov, diff)), rel=1e-9)


def test_json_round_trip():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(25, 256))
    queries = np.stack([x[0] + 0.1, x.mean(0), x[3] * 5])
    model = MahalanobisDistance().fit(x)
    record = json.loads(json.dumps(model.to_dict()))
    assert len(record["components"]) == 16 and len(record["reference"]) == 25
    back = feature_distance_from_dict(record)
    np.testing.assert_allclose(back.distance(queries), model.distance(queries), rtol=1e-12)
    np.testing.assert_allclose(back.conformal_distances(x[3] * 5), model.conformal_distances(x[3] * 5), rtol=1e-12)
    assert np.isnan(model.distance(np.stack([x[0], np.full(256, np.inf)]))[1])
    # a record without one of to_dict's keys is refused in one line naming them
    with pytest.raises(
        ValueError, match=r"^the stored feature distance lacks \['max_dim'\]: store it with to_dict\(\)$"
    ):
        feature_distance_from_dict({k: v for k, v in record.items() if k != "max_dim"})


def test_bad_inputs_name_the_argument():
    x = np.random.default_rng(4).normal(size=(5, 3))
    with pytest.raises(ValueError, match="features: cases \\[1\\] have NaN"):
        MahalanobisDistance().fit(np.where(np.arange(5)[:, None] == 1, np.nan, x))
    with pytest.raises(ValueError, match="at least 3 cases"):
        MahalanobisDistance().fit(x[:2])
    with pytest.raises(ValueError, match="all 5 feature vectors are equal"):
        MahalanobisDistance().fit(np.ones((5, 3)))
    with pytest.raises(ValueError, match="max_dim must be >= 1"):
        MahalanobisDistance(max_dim=0)
    with pytest.raises(ValueError, match="expected 3 features"):
        MahalanobisDistance().fit(x).distance(np.zeros(4))
    with pytest.raises(ValueError, match="method 'gauss' is not 'mahalanobis'"):
        feature_distance_from_dict({"method": "gauss"})


@pytest.mark.parametrize(
    ("name", "module", "channels", "cells"),
    [
        ("unet", "model.1.submodule.1.submodule.1.submodule.1.submodule", 256, 4 * 4),  # 64 / 2^4
        ("attention_unet", "model.1.submodule.1.submodule.1.submodule.1.submodule", 256, 4 * 4),
        ("dynunet", "bottleneck", 320, 2 * 2),  # 64 / 2^5
        ("unet_plus_plus", "net.conv_4_0", 256, 4 * 4),
    ],
)
def test_bottleneck_hook_on_monai_networks(name, module, channels, cells):
    torch.manual_seed(0)
    net = backbone(name, spatial_dims=2, in_channels=1, out_channels=3).eval()
    assert bottleneck_module_name(net) == module
    assert bottleneck_module_name(torch.nn.DataParallel(net)) == "module." + module
    # the hpc bundle's inferer: 2D slices along the last axis, a batch of 4 slices per forward pass
    inferer = SliceInferer(roi_size=(64, 64), sw_batch_size=4, spatial_dim=2, progress=False)
    image = torch.rand(1, 1, 64, 64, 7)
    seen = []
    handle = net.get_submodule(module).register_forward_hook(lambda m, a, out: seen.append(out.detach().double()))
    with BottleneckFeatures(net) as features, torch.no_grad():
        inferer(image, net)
    handle.remove()
    pooled = features.pop()
    assert [s.shape[0] for s in seen] == [4, 3]  # two unequal batches of slices
    assert pooled.vector.shape == (channels,) and pooled.slices == 7 and pooled.positions == 7 * cells
    expected = torch.cat(seen).mean(dim=(0, 2, 3)).numpy()  # every slice and position weighted equally
    np.testing.assert_allclose(pooled.vector, expected, rtol=1e-10)
    assert pooled.finite
    with pytest.raises(RuntimeError, match="no forward pass"):
        features.pop()
    with torch.no_grad():
        net(torch.rand(2, 1, 64, 64))  # after the with block: no hook any more
    with pytest.raises(RuntimeError, match="no forward pass"):
        features.pop()
    features.start()  # started once, popped per case (as a config's CaseQualityd would)
    with torch.no_grad():
        net(torch.rand(2, 1, 64, 64))
    assert features.pop().slices == 2
    with torch.no_grad():
        net(torch.rand(3, 1, 64, 64))
    assert features.pop().slices == 3
    features.stop()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script, as bundles export model.ts
def test_unsupported_backbones_and_torchscript():
    with pytest.raises(ValueError, match="not supported for backbone SwinUNETR"):
        BottleneckFeatures(backbone("swin_unetr", 2, 1, 3))
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3)))
    with pytest.raises(ValueError, match="TorchScript"):
        bottleneck_module_name(scripted)
    with pytest.raises(ValueError, match="module_name: 'nope' is not a submodule"):
        BottleneckFeatures(backbone("unet", 2, 1, 3), module_name="nope")


def test_full_conformal_distances_hand_worked():
    # 1D (no projection, Ledoit-Wolf shrinkage 0 in one dimension): d = |x - mean| / sqrt(var), var with divisor n.
    # validation 0, 2, 4; new case 10: each point against the other three
    model = MahalanobisDistance(max_dim=1).fit([[0.0], [2.0], [4.0]])

    def dist(x, others):
        others = np.asarray(others, dtype=np.float64)
        return abs(x - others.mean()) / others.std()

    expected = [dist(0, [2, 4, 10]), dist(2, [0, 4, 10]), dist(4, [0, 2, 10]), dist(10, [0, 2, 4])]
    np.testing.assert_allclose(model.conformal_distances([10.0]), expected, rtol=1e-12)
    assert expected[-1] == pytest.approx(8 / math.sqrt(8 / 3))  # the largest of the four
    at_mean = model.conformal_distances([2.0])
    assert (at_mean >= at_mean[-1]).all()  # at the mean: every distance is >= the case's
    with pytest.raises(ValueError, match="features: expected 1 finite features"):
        model.conformal_distances([np.nan])


def test_full_conformal_ranks_are_uniform_for_exchangeable_cases():
    # the rank p = #{d_j >= d_case} / (n + 1) of a case drawn like the validation cases: P(p <= j / (n + 1)) =
    # j / (n + 1) over the draws
    # (the projection is part of the fit, so compare on low-dimensional features, no projection)
    rng = np.random.default_rng(5)
    n, draws = 9, 400
    p_values = []
    for _ in range(draws):
        x = rng.normal(size=(n + 1, 3))
        distances = MahalanobisDistance(max_dim=3).fit(x[:n]).conformal_distances(x[n])
        p_values.append(float((distances >= distances[-1]).mean()))
    share = np.mean(np.asarray(p_values) <= 0.2)  # 2 / 10
    assert abs(share - 0.2) < 4 * math.sqrt(0.2 * 0.8 / draws)
