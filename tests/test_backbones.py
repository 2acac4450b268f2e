"""Every backbone builds from its name and takes a real training step on a 2D batch."""

from __future__ import annotations

import pytest
import torch

from calib_monai.networks import BACKBONES, backbone


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_backbone_trains_one_step(name):
    torch.manual_seed(0)
    kwargs = {"img_size": (64, 64)}  # what a bundle passes to every backbone; only unetr uses it
    if name in ("unetr", "swin_unetr"):  # keep the transformers small for a CPU test
        kwargs.update(
            {"feature_size": 12} if name == "swin_unetr" else {"hidden_size": 96, "mlp_dim": 192, "num_heads": 4}
        )
    net = backbone(name, spatial_dims=2, in_channels=2, out_channels=3, **kwargs)
    x = torch.rand(2, 2, 64, 64)
    y = torch.randint(0, 3, (2, 64, 64))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    logits = net(x)
    assert logits.shape == (2, 3, 64, 64)
    loss = torch.nn.functional.cross_entropy(logits, y)
    loss.backward()
    before = [p.detach().clone() for p in net.parameters()]
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, net.parameters()))


def test_unknown_backbone_names_the_choices():
    with pytest.raises(ValueError, match="unknown backbone 'transunet'.*'dynunet'"):
        backbone("transunet")


def test_unetr_needs_img_size():
    with pytest.raises(ValueError, match="img_size"):
        backbone("unetr")
