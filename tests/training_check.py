"""One real training epoch of a tiny MONAI 2D UNet over a dataset component's slices (shared by the data tests)."""

from __future__ import annotations

import numpy as np
import torch
from ignite.engine import Events
from monai.engines import SupervisedTrainer
from monai.losses import DiceCELoss
from monai.networks.nets import UNet
from torch.utils.data import DataLoader


def assert_one_epoch_trains(train_dataset, num_classes: int, in_channels: int = 1, batch_size: int = 32) -> None:
    """Every batch is seen once, every loss is finite and positive, and the weights move."""
    torch.manual_seed(0)
    network = UNet(spatial_dims=2, in_channels=in_channels, out_channels=num_classes, channels=(8, 16), strides=(2,))
    before = [p.detach().clone() for p in network.parameters()]
    loader = DataLoader(train_dataset, batch_size=batch_size, shuffle=True, num_workers=0)
    losses = []
    trainer = SupervisedTrainer(
        device=torch.device("cpu"),
        max_epochs=1,
        train_data_loader=loader,
        network=network,
        optimizer=torch.optim.Adam(network.parameters(), 1e-3),
        loss_function=DiceCELoss(to_onehot_y=True, softmax=True),
        decollate=False,  # keep engine.state.output a dict holding the batch loss
    )
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses.append(e.state.output["loss"].item()))
    trainer.run()
    assert trainer.state.iteration == len(loader) == -(-len(train_dataset) // batch_size)
    assert all(np.isfinite(losses)) and losses[0] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, network.parameters()))
