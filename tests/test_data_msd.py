"""MSDDataset on a few real Task04_Hippocampus cases: preprocessing, slices, and one training epoch of a 2D UNet."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from ignite.engine import Events
from monai.engines import SupervisedTrainer
from monai.losses import DiceCELoss
from monai.networks.nets import UNet
from torch.utils.data import DataLoader

from calib_monai.data import MSDDataset

NUM_CASES = 6


@pytest.fixture(scope="module")
def few_cases_dir(hippocampus_dir, tmp_path_factory) -> Path:
    """A task folder whose dataset.json lists the first cases of the real data (absolute paths; no data copied)."""
    description = json.loads((hippocampus_dir / "dataset.json").read_text())
    training = [{k: str((hippocampus_dir / item[k]).resolve()) for k in ("image", "label")}
                for item in description["training"][:NUM_CASES]]  # fmt: skip
    root = tmp_path_factory.mktemp("hippocampus_few")
    (root / "dataset.json").write_text(json.dumps({**description, "numTraining": NUM_CASES, "training": training}))
    return root


@pytest.fixture(scope="module")
def hippocampus(few_cases_dir, tmp_path_factory) -> MSDDataset:
    return MSDDataset(few_cases_dir, output_dir=tmp_path_factory.mktemp("run"), split=(4, 1, 1), seed=0)


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


def test_percentile_normalisation_clips_to_the_volume_percentiles(few_cases_dir, tmp_path):
    data = MSDDataset(few_cases_dir, tmp_path, roi_size=(-1, -1, -1), split=(4, 1, 1), intensity="percentile")
    case, volume = data.datalist()["test"][0], data.test_dataset()[0]
    raw = np.asarray(nib.load(case["image"]).dataobj).astype(np.float64)
    low, high = np.percentile(raw, [0.5, 99.5])
    np.testing.assert_allclose(volume["image"][0].numpy(), np.clip((raw - low) / (high - low), 0, 1), atol=1e-5)


def test_one_training_epoch_of_a_2d_unet_over_the_slices(hippocampus):
    torch.manual_seed(0)
    network = UNet(spatial_dims=2, in_channels=1, out_channels=hippocampus.num_classes, channels=(8, 16), strides=(2,))
    before = [p.detach().clone() for p in network.parameters()]
    loader = DataLoader(hippocampus.train_dataset(), batch_size=32, shuffle=True, num_workers=0)
    losses = []
    trainer = SupervisedTrainer(
        device=torch.device("cpu"), max_epochs=1, train_data_loader=loader, network=network,
        optimizer=torch.optim.Adam(network.parameters(), 1e-3),
        loss_function=DiceCELoss(to_onehot_y=True, softmax=True),
        decollate=False,  # keep engine.state.output a dict holding the batch loss
    )  # fmt: skip
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses.append(e.state.output["loss"].item()))
    trainer.run()
    assert trainer.state.iteration == len(loader) == -(-len(hippocampus.train_dataset()) // 32)
    assert all(np.isfinite(losses)) and losses[0] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, network.parameters()))


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
