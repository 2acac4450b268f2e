"""TrainedBundle (calib_monai.bundle): the one reader of a trained bundle, against the bundle's own ``inferring`` run.

nacl_flare is trained for one epoch on tiny phantoms into a copy of the bundle; the reference is that copy's
``inferring`` workflow (what ``python -m monai.bundle run inferring`` runs) on an image stored with flipped x/y axes
and anisotropic voxels, so the outputs must be inverted back onto the input's grid.
"""

from __future__ import annotations

import json
import shutil

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.bundle import ConfigWorkflow

from calib_monai.atomic import NotAFolderError
from calib_monai.bundle import OutputFiles, TrainedBundle, output_paths
from conftest import REPO_ROOT

# the test scripts a network for model.ts; torch >= 2.10 flags every torch.jit call as deprecated
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")

TINY = {"roi_size": [32, 32, 8], "batch_size": 8, "data#num_phantoms": 6, "data#spacing": [12.0, 12.0, 30.0]}
INFER = {"roi_size": TINY["roi_size"], "data#spacing": TINY["data#spacing"]}  # the trained grid
SHAPE = (40, 36, 10)
AFFINE = np.array([[-4.0, 0, 0, 80], [0, -4.0, 0, 70], [0, 0, 10.0, -50], [0, 0, 0, 1]])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A nacl_flare copy with ``models/model.pt`` (one epoch), a test image and the ``inferring`` outputs for it."""
    from calib_monai.data.phantoms import generate_phantom

    root = tmp_path_factory.mktemp("trained_bundle")
    bundle = root / "nacl_flare"
    shutil.copytree(REPO_ROOT / "bundles" / "nacl_flare" / "configs", bundle / "configs")
    common = {"bundle_root": str(bundle), "logging_file": False}
    train = ConfigWorkflow(
        config_file=str(bundle / "configs" / "train.json"),
        workflow_type="train",
        **common,
        **TINY,
        epochs=1,
        output_dir=str(bundle / "models"),
        **{"data#cache_dir": str(root / "phantoms")},
    )
    train.initialize()
    train.run()
    image, _, _ = generate_phantom(seed=7, index=0, shape=SHAPE, spacing=(4.0, 4.0, 10.0))
    image_path = root / "case.nii.gz"
    nib.save(nib.Nifti1Image(image, AFFINE), str(image_path))
    infer = ConfigWorkflow(
        config_file=str(bundle / "configs" / "inference.json"),
        workflow_type="infer",
        run_id="inferring",
        **common,
        **INFER,
        dataset_dir=str(image_path),
        output_dir=str(root / "reference"),
    )
    infer.initialize()
    infer.run()
    return {"bundle": bundle, "image": image_path, "reference": root / "reference"}


def _reference(trained):
    files = output_paths(trained["reference"], "case")
    return nib.load(str(files.segmentation)), nib.load(str(files.confidence))


def test_predict_equals_the_inferring_run_and_writes_its_files(trained, tmp_path):
    bundle = TrainedBundle(trained["bundle"], overrides=INFER, device="cpu")
    assert bundle.weights == trained["bundle"] / "models" / "model.pt"
    assert bundle.num_classes == 5 and bundle.label_names[4] == "pancreas" and bundle.in_channels == 1
    prediction = bundle.predict(trained["image"])
    segmentation, confidence, quality = prediction
    assert prediction.contours is None  # no contours.json: the bundle was not calibrated
    ref_seg, ref_conf = _reference(trained)
    assert segmentation.shape == confidence.shape == (1, *SHAPE)
    assert segmentation.dtype == torch.uint8 and confidence.dtype == torch.float32
    np.testing.assert_array_equal(segmentation[0].numpy(), np.asarray(ref_seg.dataobj))
    np.testing.assert_allclose(confidence[0].numpy(), np.asarray(ref_conf.dataobj), rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(segmentation.affine), AFFINE, atol=1e-5)  # the input's grid

    # written as the inferring run writes them: same names, dtypes, affines and voxels
    written = bundle.write(segmentation, confidence, quality, output_dir=tmp_path)
    assert written == output_paths(tmp_path, "case")._replace(inner=None, outer=None)
    # the quality JSON is the inferring run's (same case score, same review verdict)
    reference_quality = json.loads(output_paths(trained["reference"], "case").quality.read_text())
    mine = json.loads(written.quality.read_text())
    assert mine["case_score"] == pytest.approx(reference_quality["case_score"], rel=1e-6)
    assert (
        mine["review"] == reference_quality["review"] and mine["classes"].keys() == reference_quality["classes"].keys()
    )
    for path, reference in zip(written, (ref_seg, ref_conf)):
        out = nib.load(str(path))
        assert out.get_data_dtype() == reference.get_data_dtype() and out.shape == reference.shape == SHAPE
        np.testing.assert_allclose(out.affine, reference.affine, atol=1e-6)
        np.testing.assert_allclose(np.asarray(out.dataobj), np.asarray(reference.dataobj), rtol=0, atol=1e-6)
    # one output under another case name
    assert bundle.write(confidence=confidence, output_dir=tmp_path, case="other") == OutputFiles(
        None, tmp_path / "other_conf.nii.gz"
    )
    # a file where the folder should be: the package's one line, before MONAI's writers ("no suitable writer")
    (tmp_path / "blocked").write_text("")
    with pytest.raises(NotAFolderError, match=r"blocked is a file, not a folder: pass a folder"):
        bundle.write(segmentation, output_dir=tmp_path / "blocked")


def test_every_weights_layout_predicts_the_same(trained, tmp_path):
    """Plain, ``module.``-prefixed, ``{"model": ...}``, a custom key and TorchScript ``model.ts`` weights."""
    state = torch.load(trained["bundle"] / "models" / "model.pt", weights_only=True)
    layouts = {
        "module.pt": {f"module.{k}": v for k, v in state.items()},
        "checkpoint.pt": {"model": state, "optimizer": {"step": torch.tensor(1)}},
        "custom.pt": {"ema": state},
    }
    for name, content in layouts.items():
        torch.save(content, tmp_path / name)
    plain = TrainedBundle(trained["bundle"], overrides=INFER, device="cpu")
    torch.jit.save(torch.jit.script(plain.network), str(tmp_path / "model.ts"))
    expected = plain.predict(trained["image"])
    bundles = {
        name: TrainedBundle(
            trained["bundle"],
            overrides=INFER,
            device="cpu",
            weights=tmp_path / name,
            key_in_ckpt="ema" if name == "custom.pt" else "",
        )
        for name in (*layouts, "model.ts")
    }
    for name, bundle in bundles.items():
        segmentation, confidence, _ = bundle.predict(trained["image"])
        assert torch.equal(segmentation, expected[0]), name
        torch.testing.assert_close(confidence, expected[1], rtol=0, atol=1e-6, msg=name)

    # a bundle whose models/ holds only model.ts serves that
    ts_only = tmp_path / "ts_only"
    shutil.copytree(trained["bundle"] / "configs", ts_only / "configs")
    (ts_only / "models").mkdir()
    shutil.copy(tmp_path / "model.ts", ts_only / "models" / "model.ts")
    assert TrainedBundle(ts_only).weights == ts_only / "models" / "model.ts"


def test_bad_bundles_name_the_path_and_the_fix(trained, tmp_path):
    missing = tmp_path / "no_such_bundle"
    with pytest.raises(FileNotFoundError, match="not a bundle folder") as err:
        TrainedBundle(missing)
    assert str(missing) in str(err.value) and "configs/" in str(err.value)
    with pytest.raises(FileNotFoundError, match="evaluate_typo.json") as err:
        TrainedBundle(trained["bundle"], ("train.json", "evaluate_typo.json"))
    assert "inference.json" in str(err.value)  # the configs it does have

    untrained = tmp_path / "untrained"
    shutil.copytree(trained["bundle"] / "configs", untrained / "configs")
    bundle = TrainedBundle(untrained)  # configs only: labels are readable, the network is not
    assert bundle.weights is None and bundle.label_names[1] == "liver"
    with pytest.raises(FileNotFoundError, match="no weights") as err:
        _ = bundle.network
    assert str(untrained) in str(err.value) and "monai.bundle run training" in str(err.value)
    with pytest.raises(FileNotFoundError, match="checkpoint .*missing.pt not found"):
        _ = TrainedBundle(untrained, weights=tmp_path / "missing.pt").network
    torch.save({"model": {}}, tmp_path / "nested.pt")
    with pytest.raises(KeyError, match="no 'ema'"):
        _ = TrainedBundle(untrained, weights=tmp_path / "nested.pt", key_in_ckpt="ema").network
