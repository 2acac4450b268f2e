"""Post-hoc calibration modules: temperature recovery, argmax kept, storage and the slice-wise transform."""

from __future__ import annotations

import logging

import pytest
import torch
from ignite.engine import Engine
from torch.nn import functional as F

from calib_monai.export import SegmentationWithConfidence
from calib_monai.handlers import RecalibrationFitter
from calib_monai.recalibration import (
    CalibrateLogitsd,
    LocalTemperatureScaling,
    RecalibrationSettings,
    TemperatureScaling,
    calibrate_volume,
    calibration_voxels,
    fit_temperature,
    load_calibration,
)
from calib_monai.recalibration.fitting import split_volumes
from calib_monai.recalibration.stored import publish_calibration

TEMPERATURE_ALL = RecalibrationSettings(method="temperature", voxels="all")


def _drawn_with_temperature(t0: float, n: int = 200_000, classes: int = 3, seed: int = 0):
    """Logits and labels drawn from ``softmax(logits / t0)``: the NLL-optimal temperature is ``t0``."""
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(n, classes, generator=g)
    labels = torch.multinomial(torch.softmax(logits / t0, dim=1), 1, generator=g)[:, 0]
    return logits, labels


@pytest.mark.parametrize("t0", [0.5, 1.0, 2.5])
def test_fit_recovers_the_temperature_the_labels_were_drawn_with(t0):
    logits, labels = _drawn_with_temperature(t0)
    assert fit_temperature(logits, labels) == pytest.approx(t0, rel=0.03)
    assert float(TemperatureScaling().fit(logits, labels).temperature) == pytest.approx(t0, rel=0.03)


def test_fit_is_clipped_to_the_temperature_range_with_a_warning(caplog):
    # every voxel labelled 1 where the logits say 0: the NLL falls towards a uniform softmax, T -> inf
    wrong = torch.tensor([[5.0, 0.0]]).repeat(100, 1), torch.ones(100, dtype=torch.long)
    with caplog.at_level(logging.WARNING, logger="calib_monai"):
        assert fit_temperature(*wrong) == 100.0
    assert "clipped" in caplog.text and "next to no information" in caplog.text


def test_fit_rejects_bad_voxels():
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        fit_temperature(torch.zeros(4, 3), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="NaN or inf"):
        fit_temperature(torch.tensor([[0.0, float("nan")]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="finite number > 0"):
        TemperatureScaling(0.0)


def test_temperature_and_local_temperature_keep_the_argmax():
    g = torch.Generator().manual_seed(1)
    logits, image = 4 * torch.randn(6, 4, 16, 16, generator=g), torch.rand(6, 1, 16, 16, generator=g)
    labels = logits.argmax(1)
    lts = LocalTemperatureScaling(4, 1).fit(logits, image, labels, steps=20)
    for module in (TemperatureScaling(3.0), lts):
        assert torch.equal(module(logits, image).argmax(1), logits.argmax(1))
    assert torch.allclose(TemperatureScaling(2.0)(logits), logits / 2)


def test_local_temperature_lowers_the_nll_of_overconfident_logits():
    # the labels follow softmax(logits / 3): the logits are three times too confident everywhere
    g = torch.Generator().manual_seed(2)
    logits = 4 * torch.randn(32, 3, 12, 12, generator=g)
    labels = torch.multinomial(torch.softmax(logits / 3, 1).movedim(1, -1).reshape(-1, 3), 1, generator=g).reshape(
        32, 12, 12
    )
    image = torch.rand(32, 1, 12, 12, generator=g)
    lts = LocalTemperatureScaling(3, 1).fit(logits, image, labels, steps=150)
    with torch.no_grad():
        before, after = F.cross_entropy(logits, labels), F.cross_entropy(lts(logits, image), labels)
        mean_t = float(lts.temperature_map(logits, image).mean())
    assert after < 0.8 * before and 2.0 < mean_t < 4.0


def test_stored_calibration_round_trip_and_weights_check(tmp_path, caplog):
    weights = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, weights)
    path = tmp_path / "calibration.pt"
    publish_calibration(TemperatureScaling(1.7), path, weights, voxels=10)
    assert float(load_calibration(path, weights).temperature) == pytest.approx(1.7)
    assert float(load_calibration(tmp_path).temperature) == pytest.approx(1.7)  # the folder finds the file
    assert '"temperature": 1.7' in (tmp_path / "calibration.json").read_text()
    lts = LocalTemperatureScaling(3, 2, hidden=4)
    publish_calibration(lts, tmp_path / "own" / "lts.pt", weights)
    x, z = torch.rand(2, 2, 8, 8), torch.randn(2, 3, 8, 8)
    assert torch.equal(load_calibration(tmp_path / "own" / "lts.pt", weights)(z, x), lts(z, x))
    torch.save({"w": torch.zeros(2)}, weights)  # retrained: the calibration belongs to other weights
    with caplog.at_level(logging.WARNING):
        assert load_calibration(tmp_path / "own" / "lts.pt", weights) is None  # a file of its own: not applied
    assert "fitted for other weights" in caplog.text
    # calibration.pt in a folder without manifest: its record names other weights, so the folder is refused
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(ValueError, match=r"no manifest.json in .*calibration.pt was fitted for the weights sha256"):
        load_calibration(path, weights)
    assert load_calibration(tmp_path / "missing.pt") is None
    (tmp_path / "bad.pt").write_text("not a calibration")
    with pytest.raises(
        ValueError, match="bad.pt cannot be read as a calibration file of calib_monai: it is not a PyTorch file"
    ):
        load_calibration(tmp_path / "bad.pt")


def test_transform_calibrates_each_slice_and_keeps_the_uncalibrated_softmax():
    g = torch.Generator().manual_seed(3)
    logits, image = torch.randn(3, 10, 10, 4, generator=g), torch.rand(1, 10, 10, 4, generator=g)
    out = CalibrateLogitsd("pred", TemperatureScaling(2.0), uncalibrated_key="raw")({"pred": logits, "image": image})
    assert torch.allclose(out["pred"], logits / 2) and torch.allclose(out["raw"], torch.softmax(logits, 0))
    lts = LocalTemperatureScaling(3, 1)
    torch.nn.init.normal_(lts.body[-1].weight, generator=g)  # a temperature that varies over the slice
    volume = calibrate_volume(lts, logits, image)
    for d in range(4):  # slice d of the volume = the 2D module on slice d
        expected = lts(logits[None, ..., d], image[None, ..., d])[0]
        assert torch.allclose(volume[..., d], expected, atol=1e-6)
    assert CalibrateLogitsd("pred", None)({"pred": logits})["pred"] is logits


def test_exported_wrapper_equals_the_eager_calibrated_network():
    torch.manual_seed(0)
    net = torch.nn.Conv2d(1, 3, 3, padding=1)
    calibration = TemperatureScaling(2.5)
    wrapper = SegmentationWithConfidence(net, calibration=calibration).eval()
    scripted = torch.jit.script(wrapper)
    x = torch.rand(1, 1, 8, 8, 5)
    segmentation, confidence = scripted(x)
    slices = x.movedim(4, 1).reshape(5, 1, 8, 8)
    with torch.no_grad():
        prob = torch.softmax(calibration(net(slices), slices), 1).reshape(1, 5, 3, 8, 8).movedim(1, 4)
        raw_seg = SegmentationWithConfidence(net)(x)[0]
    assert torch.allclose(confidence, prob.max(1, keepdim=True).values, atol=1e-6)
    assert torch.equal(segmentation, raw_seg)  # the segmentation is unchanged by the temperature


def test_fitter_on_an_engine_recovers_the_temperature_and_writes_the_file(tmp_path):
    g = torch.Generator().manual_seed(4)
    volumes = []
    for _ in range(3):  # volumes (C, H, W, D) whose labels are drawn from softmax(logits / 2)
        logits = 3 * torch.randn(3, 24, 24, 6, generator=g)
        label = torch.multinomial(torch.softmax(logits / 2, 0).movedim(0, -1).reshape(-1, 3), 1, generator=g)
        volumes.append({"pred": logits, "label": label.reshape(1, 24, 24, 6), "image": torch.rand(1, 24, 24, 6)})
    weights = tmp_path / "model.pt"
    torch.save({}, weights)
    engine = Engine(lambda e, batch: [batch])
    RecalibrationFitter(tmp_path / "calibration.pt", weights, TEMPERATURE_ALL).attach(engine)
    engine.run(volumes, max_epochs=1)
    fitted = load_calibration(tmp_path / "calibration.pt", weights)
    assert float(fitted.temperature) == pytest.approx(2.0, rel=0.05)
    record = torch.load(tmp_path / "calibration.pt", weights_only=True)
    # 2-fold cross-fitting (the default): the served temperature is fitted on all 3 volumes, and each volume of the
    # range is scored by the fit of the other fold (a seeded half, round(1.5) = 2, and the rest)
    split = split_volumes(3, 0.5, seed=0)
    assert len(split.fit) == 2 and len(split.range) == 1 and not set(split.fit) & set(split.range)
    assert record["split"]["crossfit"] and not record["split"]["in_sample"]
    assert record["split"]["fit_volumes"] == [f"volume_{i:04d}" for i in range(3)]
    folds = record["split"]["folds"]
    assert len(folds) == 2 and all(not set(f["fit"]) & set(f["scored"]) for f in folds)
    assert sorted(v for f in folds for v in f["scored"]) == [f"volume_{i:04d}" for i in range(3)]
    assert record["volumes"] == 3 and record["voxels"] == 3 * 24 * 24 * 6
    # temperature scaling fits on the ground-truth foreground voxels only by default, where the papers' ECE is measured
    engine = Engine(lambda e, batch: [batch])
    RecalibrationFitter(tmp_path / "fg.pt", weights, RecalibrationSettings(method="temperature")).attach(engine)
    engine.run(volumes, max_epochs=1)
    foreground = sum(int((v["label"] > 0).sum()) for v in volumes)
    assert torch.load(tmp_path / "fg.pt", weights_only=True)["voxels"] == foreground < 3 * 24 * 24 * 6
    # the numbers of the volume it did not fit: T = 2 is the truth, so the held-out NLL and ECE fall too
    assert record["range_volumes_nll_after"] < record["range_volumes_nll_before"]
    assert record["range_volumes_ece_after"] < record["range_volumes_ece_before"]
    assert record["in_sample_nll_after"] < record["in_sample_nll_before"]
    with pytest.raises(ValueError, match="calibration_method must be one of"):
        RecalibrationSettings(method="platt")
    with pytest.raises(ValueError, match=r"calibration_voxels must be one of \('foreground', 'all'\)"):
        RecalibrationSettings(voxels="background")
    with pytest.raises(TypeError, match="RecalibrationFitter settings must be a RecalibrationSettings, got dict"):
        RecalibrationFitter(tmp_path / "c.pt", weights, {"method": "temperature"})


def test_calibration_voxels_keep_the_foreground_and_share_the_budget_between_volumes():
    # volume a: labels [0, 1, 2, 0] with logits 0..3 per class row; volume b: 6 foreground voxels
    a = (torch.arange(8.0).reshape(2, 4), torch.tensor([0, 1, 2, 0]))
    b = (torch.ones(2, 2, 3), torch.ones(2, 3, dtype=torch.long))
    logits, labels = calibration_voxels([a, b], "foreground")
    assert labels.tolist() == [1, 2] + [1] * 6
    assert logits[:2].tolist() == [[1.0, 5.0], [2.0, 6.0]]  # (N, C): voxel 1 and voxel 2 of volume a
    assert calibration_voxels([a, b], "all")[1].tolist() == [0, 1, 2, 0] + [1] * 6
    # at most max_voxels in all, the same share (2) from each volume
    assert calibration_voxels([a, b], "all", max_voxels=4)[1].shape == (4,)
    assert calibration_voxels([a, b], "all", max_voxels=4, seed=3)[1][2:].tolist() == [1, 1]
    with pytest.raises(ValueError, match="one of"):
        calibration_voxels([a], "inside")
