"""Prostate (MSD Task05) on tiny 4D files in the MSD layout: T2 + ADC channels, PZ/TZ labels, 22/3/7 ratios."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from calib_monai.data import Prostate

SHAPE = (10, 8, 3)
LABELS = {"0": "background", "1": "PZ", "2": "TZ"}


def _task05(root: Path, n: int = 4, labels=LABELS) -> Path:
    rng = np.random.default_rng(0)
    training = []
    for i in range(n):
        image = np.stack([rng.normal(300, 50, SHAPE), rng.normal(1500, 300, SHAPE)], -1).astype(np.float32)  # T2, ADC
        label = rng.integers(0, 3, SHAPE).astype(np.uint8)
        for folder, array in (("imagesTr", image), ("labelsTr", label)):
            (root / folder).mkdir(parents=True, exist_ok=True)
            path = root / folder / f"prostate_{i:02d}.nii.gz"
            nib.save(nib.Nifti1Image(array, np.diag([0.625, 0.625, 3.6, 1])), str(path))
        training.append(
            {k: f"./{f}/prostate_{i:02d}.nii.gz" for k, f in (("image", "imagesTr"), ("label", "labelsTr"))}
        )
    (root / "dataset.json").write_text(
        json.dumps({"name": "PROSTATE", "modality": {"0": "T2", "1": "ADC"}, "labels": labels, "training": training})
    )
    return root


def test_two_channels_scaled_per_channel(tmp_path):
    data = Prostate(_task05(tmp_path / "Task05_Prostate"), tmp_path / "run", roi_size=SHAPE)
    assert data.source == "prostate" and data.num_classes == 3 and data.label_names == LABELS
    datalist = data.datalist()
    assert [len(datalist[k]) for k in ("training", "validation", "test")] == [2, 1, 1]  # 22/3/7 ratios for 4 cases
    case, volume = datalist["test"][0], data.test_dataset()[0]
    raw = np.asarray(nib.load(case["image"]).dataobj).astype(np.float64)
    assert volume["image"].shape == (2, *SHAPE)
    for c in range(2):
        channel = raw[..., c]
        np.testing.assert_allclose(volume["image"][c].numpy(), (channel - channel.min()) / np.ptp(channel), atol=1e-5)
    np.testing.assert_array_equal(volume["label"][0].numpy(), np.asarray(nib.load(case["label"]).dataobj))
    assert len(data.train_dataset()) == 2 * SHAPE[2]


def test_default_roi_and_other_task_refused(tmp_path):
    data = Prostate(_task05(tmp_path / "Task05_Prostate"), tmp_path / "run")
    assert data.preprocessing()(data.datalist()["test"][0])["image"].shape == (2, 320, 320, SHAPE[2])
    with pytest.raises(ValueError, match="this is not that data set"):
        Prostate(_task05(tmp_path / "other", labels={"0": "background", "1": "PZ", "2": "CZ"}), tmp_path / "run2")
