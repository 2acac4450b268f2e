"""MSDDataset on a few real Task04_Hippocampus cases: preprocessing, slices, and one training epoch of a 2D UNet."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import torch
from training_check import assert_one_epoch_trains

from calib_monai.data import MSDDataset


@pytest.fixture(scope="module")
def hippocampus(hippocampus_few_dir, tmp_path_factory) -> MSDDataset:
    return MSDDataset(hippocampus_few_dir, output_dir=tmp_path_factory.mktemp("run"), split=(4, 1, 1), seed=0)


def test_classes_and_split_come_from_dataset_json(hippocampus):
    assert hippocampus.num_classes == 3
    assert hippocampus.label_names == {"0": "background", "1": "Anterior", "2": "Posterior"}
    datalist = hippocampus.datalist()
    assert [len(datalist[k]) for k in ("training", "validation", "test")] == [4, 1, 1]
    assert (hippocampus.output_dir / "datalist.json").is_file()


def test_training_slices_have_the_right_shapes_and_labels(hippocampus):
    train = hippocampus.train_dataset()
    raw_depths = [nib.load(c["image"]).shape[2] for c in hippocampus.datalist()["training"]]  # identity affines
    assert len(train) == sum(raw_depths)
    labels = set()
    for i in range(0, len(train), 7):
        item = train[i]
        assert item["image"].shape == (1, 64, 64) and item["label"].shape == (1, 64, 64)
        assert item["image"].dtype == torch.float32
        assert 0.0 <= float(item["image"].min()) <= float(item["image"].max()) <= 1.0
        labels |= set(item["label"].unique().tolist())
    assert labels == {0.0, 1.0, 2.0}


def test_volumes_are_min_max_normalised_and_padded_symmetrically(hippocampus):
    case = hippocampus.datalist()["validation"][0]
    volume = hippocampus.val_dataset()[0]
    raw = np.asarray(nib.load(case["image"]).dataobj).astype(np.float64)
    h, w, d = raw.shape
    assert volume["image"].shape == (1, 64, 64, d) and volume["label"].shape == (1, 64, 64, d)
    expected = np.zeros((64, 64, d))
    top, left = (64 - h) // 2, (64 - w) // 2  # ResizeWithPadOrCrop pads symmetrically, the extra voxel after
    expected[top : top + h, left : left + w] = (raw - raw.min()) / (raw.max() - raw.min())
    np.testing.assert_allclose(volume["image"][0].numpy(), expected, atol=1e-5)
    assert volume["image"].meta["filename_or_obj"] == case["image"]
    raw_label = np.asarray(nib.load(case["label"]).dataobj)
    np.testing.assert_array_equal(volume["label"][0, top : top + h, left : left + w].numpy(), raw_label)


def test_percentile_normalisation_clips_to_the_volume_percentiles(hippocampus_few_dir, tmp_path):
    data = MSDDataset(hippocampus_few_dir, tmp_path, roi_size=(-1, -1, -1), split=(4, 1, 1), intensity="percentile")
    case, volume = data.datalist()["test"][0], data.test_dataset()[0]
    raw = np.asarray(nib.load(case["image"]).dataobj).astype(np.float64)
    low, high = np.percentile(raw, [0.5, 99.5])
    np.testing.assert_allclose(volume["image"][0].numpy(), np.clip((raw - low) / (high - low), 0, 1), atol=1e-5)


def test_one_training_epoch_of_a_2d_unet_over_the_slices(hippocampus):
    assert_one_epoch_trains(hippocampus.train_dataset(), hippocampus.num_classes)


def test_msd_errors_name_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="has no dataset.json"):
        MSDDataset(tmp_path, output_dir=tmp_path / "run")
    (tmp_path / "dataset.json").write_text(json.dumps({"labels": {"0": "background", "2": "organ"}, "training": []}))
    for folder in ("imagesTr", "labelsTr"):
        (tmp_path / folder).mkdir()
        nib.save(nib.Nifti1Image(np.zeros((4, 4, 4), np.uint8), np.eye(4)), str(tmp_path / folder / "a.nii.gz"))
    with pytest.raises(ValueError, match=r"0..K-1 without gaps, got \[0, 2\]"):
        MSDDataset(tmp_path, output_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="intensity must be"):
        MSDDataset(tmp_path, output_dir=tmp_path / "run", intensity="zscore")
