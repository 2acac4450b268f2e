"""Bad weight files as users make them: random bytes, a cut-off or empty model.pt, a model.pt of another network,
Python objects instead of tensors. Every reader (the bundles' NetworkWeightsLoader, TrainedBundle and through it the
export) names the file, says what is wrong and how to fix it, and never advises to load the file unsafely."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from monai.networks.nets import UNet

from calib_monai.bundle import TrainedBundle, WeightsFileError
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
