"""Training from submitted labels for every data set's bundle: ``calib_monai.label.fine_tune.FineTune`` (what MONAI
Label's Train runs) on a few tiny labels written here in each data set's own format (NIfTI volumes for ACDC, MSD
Hippocampus and FLARE, a 4-channel NIfTI for BraTS, PNG images and masks for the 2D BUSI), one epoch: the bundle's own
``training`` from the served ``model.pt`` and its ``calibrate`` on the held-out labels run as subprocesses, no data set
folder (``--dataset_dir`` stays empty: the data component takes the given datalist), and the new weights, calibration
and validated range are published. No shared data and no MONAI Label needed (main environment)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.bundle import ConfigParser

from calib_monai.label.fine_tune import FineTune, SubmittedLabel, served_calibration
from conftest import REPO_ROOT

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
CASES = 3  # 2 to train on, 1 held out (validation_fraction 0.2)


def _blob(shape: tuple[int, ...], index: int, classes: int) -> np.ndarray:
    """A label of nested boxes (value c inside c - 1...), shifted per case, every class present."""
    label = np.zeros(shape, dtype=np.uint8)
    for c in range(1, classes):
        lo = [2 + c + index % 2 for _ in shape[:2]]
        hi = [s - 2 - c for s in shape[:2]]
        label[lo[0] : hi[0], lo[1] : hi[1], ...] = c
    return label


def _image(label: np.ndarray, seed: int, scale: float = 100.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (label * scale + rng.normal(0, scale / 10, label.shape)).astype(np.float32)


def _affine(spacing: tuple[float, float, float]) -> np.ndarray:
    return np.diag([*spacing, 1.0])


def _nifti_cases(folder: Path, shape, classes: int, spacing=(1.0, 1.0, 1.0), channels: int = 1, hu: bool = False):
    cases = []
    for i in range(CASES):
        label = _blob(shape, i, classes)
        image = _image(label, i, scale=60.0 if hu else 100.0) - (100.0 if hu else 0.0)  # FLARE: within its HU window
        if channels > 1:  # channels last, as MONAI Label serves a multi-channel NIfTI
            image = np.stack([image * (k + 1) for k in range(channels)], -1)
        nib.save(nib.Nifti1Image(image, _affine(spacing)), str(folder / f"case_{i}.nii.gz"))
        cases.append((f"case_{i}", folder / f"case_{i}.nii.gz", label))
    return cases


def _png_cases(folder: Path, shape, classes: int):
    from PIL import Image

    cases = []
    for i in range(CASES):
        label = _blob(shape, i, classes)[..., 0]
        grey = np.clip(_image(label, i) + 50, 0, 255).astype(np.uint8)
        Image.fromarray(np.stack([grey] * 3, -1)).save(folder / f"case_{i}.png")  # BUSI stores grey as RGB
        cases.append((f"case_{i}", folder / f"case_{i}.png", label))
    return cases


# bundle, how its submitted images look, the tiny settings of both runs
SETS = {
    "acdc": (
        "ce_dice_acdc",
        lambda f: _nifti_cases(f, (36, 36, 3), 4),
        {"roi_size": [32, 32, -1], "data#resize": [32, 32]},
    ),
    "hippocampus": ("ce_dice_hpc", lambda f: _nifti_cases(f, (30, 36, 4), 3), {"roi_size": [32, 32, -1]}),
    "flare": (
        "ce_dice_flare",
        lambda f: _nifti_cases(f, (36, 36, 4), 5, spacing=(8.0, 8.0, 20.0), hu=True),
        {"roi_size": [32, 32, 4], "data#spacing": [8.0, 8.0, 20.0]},
    ),
    "brats": (
        "ce_dice_brats",
        lambda f: _nifti_cases(f, (36, 36, 4), 4, channels=4),
        {"roi_size": [32, 32, 4], "data#resize": [32, 32, 4]},
    ),
    "busi": ("ce_dice_busi", lambda f: _png_cases(f, (40, 36, 1), 2), {"roi_size": [32, 32, 1]}),
}


def _served_bundle(tmp_path: Path, name: str) -> Path:
    """The bundle's configs and an initial ``models/model.pt`` (seeded initial weights), as a server serves it."""
    bundle = tmp_path / name
    shutil.copytree(REPO_ROOT / "bundles" / name / "configs", bundle / "configs")
    (bundle / "models").mkdir()
    parser = ConfigParser()
    parser.read_config(str(bundle / "configs" / "train.json"))
    parser["bundle_root"] = str(bundle)
    torch.manual_seed(0)
    torch.save(parser.get_parsed_content("network_def").state_dict(), bundle / "models" / "model.pt")
    return bundle


def _submit(folder: Path, cases, label_names: dict[int, str], png: bool) -> list[SubmittedLabel]:
    """Labels as Slicer's module saves them: segment i has value i + 1, in the order of ``label_info`` (here the
    reverse of the bundle's order, so the names must map them back)."""
    order = [v for v in sorted(label_names, reverse=True) if v > 0]
    submitted = []
    for case, image, label in cases:
        slicer = np.zeros_like(label)
        for position, value in enumerate(order):
            slicer[label == value] = position + 1
        if png:
            from PIL import Image

            path = folder / f"{case}_label.png"
            Image.fromarray(slicer).save(path)
        else:
            path = folder / f"{case}_label.nii.gz"
            nib.save(nib.Nifti1Image(slicer, nib.load(str(image)).affine), str(path))
        info = [{"name": label_names[v], "idx": p + 1} for p, v in enumerate(order)]
        submitted.append(SubmittedLabel(case, str(image), str(path), info))
    return submitted


@pytest.mark.parametrize("dataset", sorted(SETS))
def test_fine_tune_from_submitted_labels(tmp_path, dataset, caplog):
    name, write, tiny = SETS[dataset]
    bundle = _served_bundle(tmp_path, name)
    (tmp_path / "datastore").mkdir()
    cases = write(tmp_path / "datastore")
    config = json.loads((bundle / "configs" / "train.json").read_text())
    label_names = {int(k): v for k, v in config["label_names"].items()}
    submitted = _submit(tmp_path / "datastore", cases, label_names, png=dataset == "busi")
    served = (bundle / "models" / "model.pt").read_bytes()

    # no calibration.json is served yet: the bundle's default method (configs/calibrate.json), and it says so
    default = json.loads((bundle / "configs" / "calibrate.json").read_text())["calibration_method"]
    method, source = served_calibration(bundle)
    assert method == default and "calibration.json is missing" in source and "configs/calibrate.json" in source

    fine_tune = FineTune(bundle, epochs=1, overrides={"batch_size": 4, **tiny})
    with caplog.at_level("INFO", logger="calib_monai.label"):
        stats = fine_tune.run(submitted, label_names)

    # how many labels it trained and validated on: in the answer and in the log
    assert (stats["trained_on"], stats["validated_on"]) == (CASES - 1, 1)
    assert stats["epoch"] == 1 and stats["total_epochs"] == 1
    assert stats["calibration_method"] == default and "missing" in stats["calibration_source"]
    assert any(
        f"fine-tuned on {CASES - 1} submitted label(s)" in r.message and "on 1 held out" in r.message
        for r in caplog.records
    )
    # the data component trained on the given datalist, not on a data set folder
    datalist = json.loads((fine_tune.models / "datalist.json").read_text())
    assert datalist["given"] and len(datalist["training"]) == CASES - 1 and len(datalist["validation"]) == 1
    assert "preprocessing" in (fine_tune.workdir / "training.log").read_text()
    # published: new weights, a calibration of them with the default method and the validated range re-measured on
    # the held-out label
    models = bundle / "models"
    assert (models / "model.pt").read_bytes() != served
    assert (models / "model.previous.pt").read_bytes() == served
    record = json.loads((models / "calibration.json").read_text())
    assert record["method"] == default
    validated = json.loads((models / "validated_range.json").read_text())
    assert len(validated["scores"]) == 1
    import hashlib

    sha = hashlib.sha256((models / "model.pt").read_bytes()).hexdigest()
    assert record["weights_sha256"] == sha and validated["weights_sha256"] == sha


def test_brats_labels_are_written_in_the_files_values(tmp_path):
    """BraTS files hold the enhancing tumour as 4 (the bundle's class 3): a submitted ET segment is written as 4."""
    from calib_monai.label.labels import remap_label, stored_values

    bundle = tmp_path / "ce_dice_brats"
    shutil.copytree(REPO_ROOT / "bundles" / "ce_dice_brats" / "configs", bundle / "configs")
    assert stored_values(bundle) == {0: 0, 1: 1, 2: 2, 3: 4}
    label = np.array([0, 1, 2, 3], dtype=np.uint8).reshape(2, 2, 1)
    nib.save(nib.Nifti1Image(label, np.eye(4)), str(tmp_path / "label.nii.gz"))
    remap_label(
        tmp_path / "label.nii.gz", tmp_path / "out.nii.gz", {0: 0, 1: 1, 2: 2, 3: 3}, "c", stored=stored_values(bundle)
    )
    assert np.asarray(nib.load(str(tmp_path / "out.nii.gz")).dataobj).ravel().tolist() == [0, 1, 2, 4]


def test_label_on_another_grid_is_refused_naming_both_files(tmp_path):
    from calib_monai.label.labels import remap_label

    image, label = tmp_path / "image.nii.gz", tmp_path / "label.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 2), np.float32), np.eye(4)), str(image))
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 2), np.uint8), _affine((2.0, 2.0, 1.0))), str(label))
    with pytest.raises(ValueError, match=r"label of c \(label.nii.gz\) is not on the grid of its image image.nii.gz"):
        remap_label(label, tmp_path / "out.nii.gz", {0: 0}, "c", image=image)


def test_a_failed_run_is_told_in_one_line():
    from calib_monai.label.fine_tune import _failure_line

    assert _failure_line("loading\nERROR: loss (NACLLoss): alpha must be >= 0\n") == (
        "ERROR: loss (NACLLoss): alpha must be >= 0"
    )
    traceback = "Traceback (most recent call last):\n  File \"x.py\"\nRuntimeError: Failed to evaluate:\n'$expr'\n"
    assert _failure_line(traceback) == "RuntimeError: Failed to evaluate: '$expr'"


def test_an_unreadable_label_is_refused_naming_it(tmp_path):
    from calib_monai.label.labels import check_label

    (tmp_path / "label.nrrd").write_bytes(b"NRRD0004\nnot really\n")
    with pytest.raises(ValueError, match=r"label label.nrrd cannot be read as a NIfTI or PNG label map"):
        check_label(tmp_path / "label.nrrd", None, None, {0: "background", 1: "liver"}, "c")
