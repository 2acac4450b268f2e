"""Bad weight files as users make them: random bytes, a cut-off or empty model.pt, a model.pt of another network,
Python objects instead of tensors. Every reader (the bundles' NetworkWeightsLoader, TrainedBundle and through it the
export) names the file, says what is wrong and how to fix it, and never advises to load the file unsafely."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from ignite.engine import Engine
from monai.networks.nets import UNet

from calib_monai.bundle import TrainedBundle, WeightsFileError, load_network_weights, unwrap_network, weights_state_dict
from calib_monai.export import export_bundle
from calib_monai.handlers import NetworkWeightsLoader

BUNDLE = Path(__file__).resolve().parents[1] / "bundles" / "nacl_hpc"


def _net(in_channels: int = 1) -> torch.nn.Module:
    return UNet(spatial_dims=2, in_channels=in_channels, out_channels=3, channels=(4, 8), strides=(2,))


class NotWeights:  # pickled by reference: weights_only loading refuses it
    pass


def _bad_files(folder: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, the reason the message must give)."""
    good = folder / "good.pt"
    torch.save(_net().state_dict(), good)
    data = good.read_bytes()
    files = {
        "random bytes": (b"\x13\x37" + bytes(range(256)) * 8, "it is not a PyTorch file (2050 bytes"),
        "cut off": (data[: len(data) // 2], "the file is cut off"),
        "empty": (b"", "the file is empty (0 bytes)"),
    }
    out = {}
    for name, (content, reason) in files.items():
        path = folder / f"{name.replace(' ', '_')}.pt"
        path.write_bytes(content)
        out[name] = (path, reason)
    objects = folder / "objects.pt"
    torch.save({"weight": NotWeights()}, objects)
    out["python objects"] = (objects, "it holds Python objects other than tensors and numbers")
    return out


@pytest.mark.parametrize("name", ["random bytes", "cut off", "empty", "python objects"])
def test_unreadable_model_pt_names_the_file_what_is_wrong_and_the_fix(tmp_path, name):
    path, reason = _bad_files(tmp_path)[name]
    loader = NetworkWeightsLoader(path, _net())
    with pytest.raises(WeightsFileError) as err:
        loader()
    message = str(err.value)
    assert message.startswith(f"{path} cannot be read as network weights: {reason}")
    assert "train the bundle again" in message and "weights_only" not in message and "\n" not in message


def test_model_pt_of_another_network_says_which_tensors_differ(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(_net(in_channels=2).state_dict(), path)  # a 2-channel network's weights into a 1-channel network
    with pytest.raises(WeightsFileError) as err:
        NetworkWeightsLoader(path, _net())()
    message = str(err.value)
    assert message.startswith(f"{path} holds the weights of another network than this UNet (")
    first = next(k for k, v in _net().state_dict().items() if v.ndim == 4)  # the first convolution's weight
    assert f"{first}: file (4, 2, 3, 3), network (4, 1, 3, 3)" in message
    assert "use the settings it was trained with, or train the bundle again" in message


def test_trained_bundle_and_export_name_a_cut_off_model_pt(tmp_path):
    bundle = tmp_path / "nacl_hpc"
    shutil.copytree(BUNDLE / "configs", bundle / "configs")
    (bundle / "models").mkdir()
    path, reason = _bad_files(tmp_path)["cut off"]
    shutil.copy(path, bundle / "models" / "model.pt")
    with pytest.raises(
        WeightsFileError, match=f"^{bundle / 'models' / 'model.pt'} cannot be read as network weights: {reason}"
    ):
        _ = TrainedBundle(bundle).network
    with pytest.raises(WeightsFileError, match="the file is cut off"):
        export_bundle(bundle, output_dir=tmp_path / "out")


def test_export_before_training_names_the_command_line_flag(tmp_path):
    """``calib-monai export bundles/nacl_flare`` before training told the user to pass ``weights=...``, a flag the
    command does not have: it is ``--checkpoint``."""
    bundle = tmp_path / "nacl_hpc"
    shutil.copytree(BUNDLE / "configs", bundle / "configs")
    with pytest.raises(FileNotFoundError) as err:
        export_bundle(bundle)
    message = str(err.value)
    assert message.startswith(f"checkpoint {bundle / 'models' / 'model.pt'} not found: train it first")
    assert "--checkpoint /path/to/model.pt" in message and "weights=" not in message


# ---- the layouts every reader of model.pt accepts ---------------------------------------------------------------
@pytest.fixture
def one_rank_group(tmp_path):
    """A single-process gloo group, so that a network can be wrapped in DistributedDataParallel here."""
    import torch.distributed as dist

    from calib_monai.bundle import finalize_distributed

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        finalize_distributed()  # also resets ignite's cached context, which later tests would otherwise still see


def _seeded_net():
    torch.manual_seed(1)
    return UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,))


@pytest.mark.parametrize("layout", ["plain", "module", "model", "model_module"])
def test_load_network_weights_reads_every_model_pt_layout(tmp_path, layout):
    source = _seeded_net().state_dict()
    state = {f"module.{k}": v for k, v in source.items()} if "module" in layout else source
    torch.save({"model": state, "optimizer": {}} if layout.startswith("model") else state, tmp_path / "model.pt")
    target = UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,))
    load_network_weights(target, tmp_path / "model.pt")  # strict
    for key, value in source.items():
        torch.testing.assert_close(target.state_dict()[key], value)
    assert not any(k.startswith("module.") for k in weights_state_dict(tmp_path / "model.pt"))


def test_load_network_weights_is_strict_and_unwraps(tmp_path, one_rank_group):
    torch.save({"other.weight": torch.zeros(1)}, tmp_path / "wrong.pt")
    n = len(_seeded_net().state_dict())
    with pytest.raises(
        ValueError,
        match=rf"^{tmp_path / 'wrong.pt'} holds the weights of another network than this UNet "
        rf"\({n} tensors of the network missing .*; 1 unexpected tensors \(e.g. other.weight\)\)",
    ):
        load_network_weights(_seeded_net(), tmp_path / "wrong.pt")
    source = _seeded_net().state_dict()
    wrapped = torch.nn.parallel.DistributedDataParallel(
        UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,))
    )
    load_network_weights(wrapped, source)  # a DDP network is loaded through its module
    assert unwrap_network(wrapped) is wrapped.module
    torch.testing.assert_close(wrapped.module.state_dict(), source)


def test_network_weights_loader_loads_a_module_prefixed_file_when_the_engine_starts(tmp_path):
    source = _seeded_net().state_dict()
    torch.save({f"module.{k}": v for k, v in source.items()}, tmp_path / "model.pt")
    target = UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), strides=(2,))
    engine = Engine(lambda e, b: None)
    NetworkWeightsLoader(tmp_path / "model.pt", target).attach(engine)
    engine.run([0], max_epochs=1)
    torch.testing.assert_close(target.state_dict(), source)
    with pytest.raises(FileNotFoundError, match="train the bundle first"):
        NetworkWeightsLoader(tmp_path / "missing.pt", target)()
