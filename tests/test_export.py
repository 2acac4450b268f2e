"""Export of a bundle (calib_monai.export): TorchScript and torch.export models that run with torch alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from monai.bundle import ConfigParser

from calib_monai.bundle import TrainedBundle
from calib_monai.export import SegmentationWithConfidence, export_bundle

# loading model.ts here is the point of the test; torch >= 2.10 flags every torch.jit call as deprecated
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.load` is deprecated:DeprecationWarning")

BUNDLE = Path(__file__).resolve().parents[1] / "bundles" / "nacl_flare"
EXAMPLE_SHAPE = (2, 1, 64, 64, 3)
VOLUME_SHAPE = (1, 1, 32, 96, 3)  # another batch, depth and in-plane size than the export example: all dynamic

# runs in a fresh interpreter that imports torch only: what a deployment without calib_monai/monai has
LOAD_AND_RUN = """
import sys, warnings
import torch
warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load is deprecated in torch >= 2.10
out = sys.argv[1]
volume = torch.load(out + "/volume.pt")
slices = volume.movedim(4, 1).flatten(0, 1)
with torch.no_grad():
    logits = torch.jit.load(out + "/model.ts").eval()(slices)
    ts = torch.jit.load(out + "/segmentation_confidence.ts").eval()(volume)
    pt2 = torch.export.load(out + "/segmentation_confidence.pt2").module()(volume)
assert "calib_monai" not in sys.modules and "monai" not in sys.modules, sorted(sys.modules)
torch.save({"logits": logits, "ts": tuple(ts), "pt2": tuple(pt2)}, out + "/outputs.pt")
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random-init nacl_flare network saved as the checkpoint and exported (nothing is trained)."""
    tmp = tmp_path_factory.mktemp("export")
    parser = ConfigParser()
    parser.read_config(str(BUNDLE / "configs" / "train.json"))
    parser["bundle_root"] = str(BUNDLE)
    torch.manual_seed(0)
    torch.save(parser.get_parsed_content("network_def").state_dict(), tmp / "model.pt")
    paths = export_bundle(BUNDLE, output_dir=tmp / "out", checkpoint=tmp / "model.pt", example_shape=EXAMPLE_SHAPE)
    return tmp, paths


def test_written_files(exported):
    tmp, paths = exported
    assert sorted(Path(p).name for p in paths.values()) == [
        "model.ts",
        "segmentation_confidence.pt2",
        "segmentation_confidence.ts",
    ]
    assert all(Path(p).parent == tmp / "out" and Path(p).stat().st_size > 0 for p in paths.values())
    # MONAI's ckpt_export put the bundle's configs and metadata into model.ts
    extra = {"metadata.json": "", "train.json": ""}
    torch.jit.load(paths["model.ts"], _extra_files=extra)
    assert json.loads(extra["train.json"])["network_def"]["_target_"] == "calib_monai.networks.backbone"
    assert "network_data_format" in json.loads(extra["metadata.json"])
    info = {"export.json": ""}
    torch.jit.load(paths["segmentation_confidence.ts"], _extra_files=info)
    assert json.loads(info["export.json"])["dynamic"] == "B, H, W, D"
    program = torch.export.load(paths["segmentation_confidence.pt2"])
    assert program.example_inputs is not None


def test_loaded_with_torch_only_equal_eager(exported):
    tmp, paths = exported
    out = Path(paths["model.ts"]).parent
    volume = torch.rand(VOLUME_SHAPE, generator=torch.Generator().manual_seed(1))
    torch.save(volume, out / "volume.pt")
    subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(out)], check=True, timeout=120)
    outputs = torch.load(out / "outputs.pt")

    network = TrainedBundle(BUNDLE, ("train.json",), device="cpu", weights=tmp / "model.pt").network
    with torch.no_grad():
        logits = network(volume.movedim(4, 1).flatten(0, 1))
        segmentation, confidence = SegmentationWithConfidence(network).eval()(volume)
    assert outputs["logits"].shape == (VOLUME_SHAPE[-1], 5, *VOLUME_SHAPE[2:4])
    torch.testing.assert_close(outputs["logits"], logits, rtol=0, atol=1e-6)
    for name in ("ts", "pt2"):
        seg, conf = outputs[name]
        assert seg.shape == conf.shape == (VOLUME_SHAPE[0], 1, *VOLUME_SHAPE[2:])
        assert seg.dtype == torch.int64 and conf.dtype == torch.float32
        assert torch.equal(seg, segmentation), name
        torch.testing.assert_close(conf, confidence, rtol=0, atol=1e-6, msg=name)
        assert conf.min() >= 1 / 5 - 1e-6 and conf.max() <= 1 + 1e-6
        assert 0 <= seg.min() and seg.max() < 5


@pytest.mark.parametrize("spatial_dim", [0, 1, 2])
def test_wrapper_equals_slice_loop(spatial_dim):
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Conv2d(2, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))
    model = SegmentationWithConfidence(network, spatial_dim=spatial_dim).eval()
    volume = torch.randn(2, 2, 6, 7, 5)
    with torch.no_grad():
        segmentation, confidence = model(volume)
        # reference: the network on each slice separately, stacked back along the slice axis
        axis = spatial_dim + 2
        logits = torch.stack([network(s) for s in volume.unbind(axis)], dim=axis)
    probabilities = torch.softmax(logits, dim=1)
    assert segmentation.shape == confidence.shape == (2, 1, 6, 7, 5)
    assert torch.equal(segmentation, probabilities.argmax(dim=1, keepdim=True))
    torch.testing.assert_close(confidence, probabilities.amax(dim=1, keepdim=True), rtol=0, atol=1e-6)


def test_wrapper_equals_slice_loop_bundle_network(exported):
    tmp, _ = exported
    network = TrainedBundle(BUNDLE, ("train.json",), device="cpu", weights=tmp / "model.pt").network
    volume = torch.rand(1, 1, 32, 32, 3, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        segmentation, confidence = SegmentationWithConfidence(network).eval()(volume)
        logits = torch.stack([network(s) for s in volume.unbind(4)], dim=4)
    probabilities = torch.softmax(logits, dim=1)
    assert torch.equal(segmentation, probabilities.argmax(dim=1, keepdim=True))
    # a batch of 3 slices vs 3 batches of 1: CPU convolutions may block the sums differently (~2e-6 seen)
    torch.testing.assert_close(confidence, probabilities.amax(dim=1, keepdim=True), rtol=0, atol=1e-5)


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="spatial_dim"):
        SegmentationWithConfidence(torch.nn.Identity(), spatial_dim=3)
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        export_bundle(BUNDLE, output_dir=tmp_path, checkpoint=tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="example_shape"):
        torch.save({}, tmp_path / "empty.pt")
        export_bundle(BUNDLE, output_dir=tmp_path, checkpoint=tmp_path / "empty.pt", example_shape=(1, 1, 64, 64))


def test_cli_help():
    result = subprocess.run(
        [sys.executable, "-m", "calib_monai.cli", "export", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PAGER": "cat", "PATH": ""},
    )
    assert result.returncode == 0, result.stderr
    assert "bundle_dir" in result.stdout + result.stderr
