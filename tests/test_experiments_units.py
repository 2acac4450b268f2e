"""Pieces of the experiment harness with known answers: temperature fits, seeded noise, training-data subsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calib_monai.data import FLARE
from studies import EvaluatedVolume, VolumeLocalTemperature, VolumeTemperature, add_gaussian_noise
from studies.study import format_mean_std, heading, write_table


def _volumes_at_temperature(temperature: float, count: int = 4, seed: int = 0) -> list[EvaluatedVolume]:
    """Volumes whose labels are drawn from softmax(logits / temperature): the calibrating temperature is known."""
    generator = torch.Generator().manual_seed(seed)
    volumes = []
    for i in range(count):
        logits = 4.0 * torch.randn((3, 24, 24, 6), generator=generator)
        probs = torch.softmax(logits / temperature, dim=0).permute(1, 2, 3, 0).reshape(-1, 3)
        label = torch.multinomial(probs, 1, generator=generator).reshape(1, 24, 24, 6)
        image = torch.rand((1, 24, 24, 6), generator=generator)
        volumes.append(EvaluatedVolume(f"v{i}", image, label, logits))
    return volumes


def _nll(volumes, calibrate) -> float:
    total = sum(float(-torch.log(calibrate(v).gather(0, v.label).clamp_min(1e-12)).sum()) for v in volumes)
    return total / sum(v.label.numel() for v in volumes)


def test_temperature_scaling_recovers_the_generating_temperature():
    volumes = _volumes_at_temperature(2.5)
    # every voxel's label is drawn at T = 2.5; keeping only label > 0 (the default, as the bundles) selects on the
    # outcome, so the generating temperature is recovered from all voxels
    ts = VolumeTemperature(voxels="all").fit(volumes)
    assert ts.temperature == pytest.approx(2.5, rel=0.06)
    # fitting on a voxel sample gives nearly the same temperature
    assert VolumeTemperature(max_voxels=5000, voxels="all").fit(volumes).temperature == pytest.approx(
        ts.temperature, rel=0.1
    )
    identity = lambda v: torch.softmax(v.logits, dim=0)  # noqa: E731
    assert _nll(volumes, ts) < _nll(volumes, identity)


def test_local_temperature_scaling_lowers_nll_and_keeps_the_argmax():
    volumes = _volumes_at_temperature(2.5)
    lts = VolumeLocalTemperature(steps=150).fit(volumes)
    identity = lambda v: torch.softmax(v.logits, dim=0)  # noqa: E731
    assert _nll(volumes, lts) < 0.9 * _nll(volumes, identity)
    for v in volumes:
        t = lts.temperature_map(v)
        assert t.shape == (1, 24, 24, 6) and bool((t > 0).all())
        assert torch.equal(lts(v).argmax(0), v.logits.argmax(0))
    with pytest.raises(RuntimeError, match="fit must run"):
        VolumeLocalTemperature()(volumes[0])


def test_gaussian_noise_is_seeded_with_the_asked_sigma():
    image = torch.zeros((1, 100, 100, 10))
    assert add_gaussian_noise(image, 0.0, 3) is image
    a, b, c = add_gaussian_noise(image, 0.05, 3), add_gaussian_noise(image, 0.05, 3), add_gaussian_noise(image, 0.05, 4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.std()) == pytest.approx(0.05, rel=0.02) and abs(float(a.mean())) < 0.002


def test_train_fraction_keeps_a_nested_share_of_the_training_volumes(tmp_path):
    data = FLARE("", tmp_path, roi_size=(48, 48, 8), spacing=(6.4, 6.4, 24.0), split=(8, 1, 3), num_phantoms=12)
    full = data.train_dataset()
    half = data.train_dataset(fraction=0.5)
    quarter = data.train_dataset(fraction=0.25)
    depths = [int(data.volume_dataset("training")[v]["image"].shape[-1]) for v in range(8)]
    assert len(full) == sum(depths) and len(half) == sum(depths[:4]) and len(quarter) == sum(depths[:2])
    assert torch.equal(half[0]["image"], full[0]["image"])  # the first cases of the seeded split
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="train_fraction"):
            data.train_dataset(fraction=bad)


def test_tables_write_csv_and_markdown(tmp_path):
    text = write_table(
        [{"method": "nacl", "ECE": 0.12345}, {"method": "ce_dice", "ECE": "0.2 ± 0.1"}], tmp_path / "t", "Title"
    )
    assert text.splitlines()[:4] == ["### Title", "", "| method | ECE |", "|---|---|"]
    assert "| nacl | 0.1235 |" in text and (tmp_path / "t.csv").read_text().splitlines()[1] == "nacl,0.12345"
    assert format_mean_std(0.12345, 0.01) == "0.123 ± 0.010" and format_mean_std(float("nan")) == "n/a"
    assert heading("dice_RV") == "DSC RV" and heading("mean_hd95") == "mean HD95" and heading("tace") == "TACE"
    assert heading("ml1ace") == "mL1-ACE" and heading("ml1ace_union") == "mL1-ACE union"


def test_dice_without_surface_distances_is_the_same_dice():
    from calib_monai.metrics import segmentation_metrics_per_volume

    generator = torch.Generator().manual_seed(1)
    label = torch.randint(0, 3, (2, 1, 12, 12, 5), generator=generator)
    pred = torch.where(torch.rand(label.shape, generator=generator) < 0.8, label, torch.zeros_like(label))
    pred[1][pred[1] == 2] = 0  # class 2 missed in volume 1: DSC 0 by the convention
    full = segmentation_metrics_per_volume(pred, label, num_classes=3)
    fast = segmentation_metrics_per_volume(pred, label, num_classes=3, surface_distances=False)
    assert set(fast) == {"dice"} and np.array_equal(fast["dice"], full["dice"]) and fast["dice"][1, 1] == 0.0
