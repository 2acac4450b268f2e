"""Hippocampus (MSD Task04, MbLS "HPC") on the real shared copy: 185/25/50 split, 64x64 slices, one training epoch."""

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

from calib_monai.data import Hippocampus

NUM_CASES = 6


@pytest.fixture(scope="module")
def few_cases_dir(hippocampus_dir, tmp_path_factory) -> Path:
    """A task folder whose dataset.json lists the first real cases by absolute path (no data copied)."""
    description = json.loads((hippocampus_dir / "dataset.json").read_text())
    training = [{k: str((hippocampus_dir / item[k]).resolve()) for k in ("image", "label")}
                for item in description["training"][:NUM_CASES]]  # fmt: skip
    root = tmp_path_factory.mktemp("hippocampus_few")
    (root / "dataset.json").write_text(json.dumps({**description, "numTraining": NUM_CASES, "training": training}))
    return root


@pytest.fixture(scope="module")
def hippocampus(few_cases_dir, tmp_path_factory) -> Hippocampus:
    return Hippocampus(few_cases_dir, output_dir=tmp_path_factory.mktemp("run"), split=(4, 1, 1))


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
    np.testing.assert_array_equal(volume["label"][0, top : top + h, left : left + w].numpy(),
                                  np.asarray(nib.load(case["label"]).dataobj))  # fmt: skip


def test_one_training_epoch_of_a_2d_unet(hippocampus):
    train = hippocampus.train_dataset()
    assert len(train) == sum(nib.load(c["image"]).shape[2] for c in hippocampus.datalist()["training"])
    torch.manual_seed(0)
    network = UNet(spatial_dims=2, in_channels=1, out_channels=hippocampus.num_classes, channels=(8, 16), strides=(2,))
    before = [p.detach().clone() for p in network.parameters()]
    loader = DataLoader(train, batch_size=32, shuffle=True, num_workers=0)
    losses = []
    trainer = SupervisedTrainer(
        device=torch.device("cpu"), max_epochs=1, train_data_loader=loader, network=network,
        optimizer=torch.optim.Adam(network.parameters(), 1e-3),
        loss_function=DiceCELoss(to_onehot_y=True, softmax=True), decollate=False,
    )  # fmt: skip
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses.append(e.state.output["loss"].item()))
    trainer.run()
    assert trainer.state.iteration == len(loader) == -(-len(train) // 32)
    assert all(np.isfinite(losses)) and losses[0] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, network.parameters()))


def test_another_task_is_refused(few_cases_dir, tmp_path):
    description = json.loads((few_cases_dir / "dataset.json").read_text())
    (tmp_path / "dataset.json").write_text(json.dumps({**description, "labels": {"0": "background", "1": "liver",
                                                                                   "2": "tumour"}}))
    with pytest.raises(ValueError, match="this is not that data set"):
        Hippocampus(tmp_path, output_dir=tmp_path / "run")
