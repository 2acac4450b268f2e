"""Hippocampus (MSD Task04, MbLS "HPC") on the real shared copy: 185/25/50 split, 64x64 slices, one training epoch."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
from training_check import assert_one_epoch_trains

from calib_monai.data import Hippocampus


@pytest.fixture(scope="module")
def hippocampus(hippocampus_few_dir, tmp_path_factory) -> Hippocampus:
    return Hippocampus(hippocampus_few_dir, output_dir=tmp_path_factory.mktemp("run"), split=(4, 1, 1))


def test_default_split_is_185_25_50(hippocampus_dir, tmp_path):
    data = Hippocampus(hippocampus_dir, output_dir=tmp_path)
    assert data.source == "hippocampus" and data.num_classes == 3 and data.roi_size == (64, 64, -1)
    datalist = data.datalist()
    assert [len(datalist[k]) for k in ("training", "validation", "test")] == [185, 25, 50]
    assert len({c["image"] for k in datalist for c in datalist[k]}) == 260


def test_volumes_are_min_max_scaled_and_padded_to_64(hippocampus):
    case, volume = hippocampus.datalist()["test"][0], hippocampus.test_dataset()[0]
    raw = np.asarray(nib.load(case["image"]).dataobj).astype(np.float64)
    h, w, d = raw.shape
    assert volume["image"].shape == (1, 64, 64, d)
    top, left = (64 - h) // 2, (64 - w) // 2
    expected = np.zeros((64, 64, d))
    expected[top : top + h, left : left + w] = (raw - raw.min()) / (raw.max() - raw.min())
    np.testing.assert_allclose(volume["image"][0].numpy(), expected, atol=1e-5)
    np.testing.assert_array_equal(
        volume["label"][0, top : top + h, left : left + w].numpy(), np.asarray(nib.load(case["label"]).dataobj)
    )


def test_one_training_epoch_of_a_2d_unet(hippocampus):
    train = hippocampus.train_dataset()
    assert len(train) == sum(nib.load(c["image"]).shape[2] for c in hippocampus.datalist()["training"])
    assert_one_epoch_trains(train, hippocampus.num_classes)


def test_another_task_is_refused(hippocampus_few_dir, tmp_path):
    description = json.loads((hippocampus_few_dir / "dataset.json").read_text())
    (tmp_path / "dataset.json").write_text(
        json.dumps({**description, "labels": {"0": "background", "1": "liver", "2": "tumour"}})
    )
    with pytest.raises(ValueError, match="this is not that data set"):
        Hippocampus(tmp_path, output_dir=tmp_path / "run")
