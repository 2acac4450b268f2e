"""ACDC on the real shared copy: patient split from splits/*.list, 224x224 slices, and one training epoch."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from training_check import assert_one_epoch_trains

from calib_monai.data import ACDC

SUBSETS = ("training", "validation", "test")


def _lists(acdc_dir: Path) -> dict[str, list[str]]:
    names = {"training": "train.list", "validation": "val.list", "test": "test.list"}
    return {k: (acdc_dir / "splits" / f).read_text().split() for k, f in names.items()}


@pytest.fixture(scope="module")
def few_acdc(acdc_dir, tmp_path_factory) -> Path:
    """A folder in the ACDC layout linking 4 + 1 + 1 real patients (symbolic links: no data copied)."""
    root = tmp_path_factory.mktemp("acdc_few")
    lists = _lists(acdc_dir)
    chosen = {"training": lists["training"][:4], "validation": lists["validation"][:1], "test": lists["test"][:1]}
    (root / "database" / "training").mkdir(parents=True)
    (root / "splits").mkdir()
    for subset, patients in chosen.items():
        for p in patients:
            (root / "database" / "training" / p).symlink_to(acdc_dir / "database" / "training" / p)
        name = {"training": "train", "validation": "val", "test": "test"}[subset]
        (root / "splits" / f"{name}.list").write_text("\n".join(patients) + "\n")
    return root


@pytest.fixture(scope="module")
def acdc_few(few_acdc, tmp_path_factory) -> ACDC:
    return ACDC(few_acdc, output_dir=tmp_path_factory.mktemp("run"))


def test_split_lists_keep_both_frames_of_a_patient_together(acdc_dir, tmp_path):
    data = ACDC(acdc_dir, output_dir=tmp_path)
    assert data.num_classes == 4 and data.label_names == {"0": "background", "1": "RV", "2": "Myo", "3": "LV"}
    datalist = data.datalist()
    assert [len(datalist[k]) for k in SUBSETS] == [140, 20, 40]  # 70/10/20 patients x (ED, ES)
    lists = _lists(acdc_dir)
    for subset in SUBSETS:
        patients = [Path(c["image"]).parent.name for c in datalist[subset]]
        assert sorted(set(patients)) == sorted(lists[subset])
        assert all(patients.count(p) == 2 for p in set(patients))
        assert all(
            Path(c["label"]).name == Path(c["image"]).name.replace(".nii.gz", "_gt.nii.gz") for c in datalist[subset]
        )


def test_seeded_split_is_by_patient(acdc_dir, tmp_path):
    datalist = ACDC(acdc_dir, output_dir=tmp_path, use_split_lists=False, seed=3).datalist()
    patients = {k: {Path(c["image"]).parent.name for c in datalist[k]} for k in SUBSETS}
    assert [len(patients[k]) for k in SUBSETS] == [70, 10, 20]
    assert [len(datalist[k]) for k in SUBSETS] == [140, 20, 40]
    assert not (patients["training"] & patients["validation"]) and not (patients["training"] & patients["test"])
    assert patients["test"] != {
        Path(c["image"]).parent.name
        for c in ACDC(acdc_dir, output_dir=tmp_path / "other", use_split_lists=False, seed=4).datalist()["test"]
    }


def test_volumes_are_resized_in_plane_and_the_192_crop_is_their_centre(acdc_few, few_acdc, tmp_path):
    case = acdc_few.datalist()["validation"][0]
    volume = acdc_few.val_dataset()[0]
    raw_label = np.asarray(nib.load(case["label"]).dataobj)
    h, w, d = raw_label.shape
    assert volume["image"].shape == (1, 224, 224, d) and volume["label"].shape == (1, 224, 224, d)
    # nearest-neighbour resize (identity affine): output pixel i takes input floor(i * n / 224)
    rows, cols = np.floor(np.arange(224) * h / 224).astype(int), np.floor(np.arange(224) * w / 224).astype(int)
    np.testing.assert_array_equal(volume["label"][0].numpy(), raw_label[rows][:, cols])
    image = volume["image"]
    assert float(image.min()) == 0.0 and abs(float(image.max()) - 1.0) < 1e-6
    cropped = ACDC(few_acdc, output_dir=tmp_path, roi_size=(192, 192, -1)).val_dataset()[0]
    assert cropped["image"].shape == (1, 192, 192, d)
    torch.testing.assert_close(cropped["image"].as_tensor(), image.as_tensor()[:, 16:208, 16:208])


def test_one_training_epoch_of_a_2d_unet(acdc_few):
    train = acdc_few.train_dataset()
    depths = [nib.load(c["image"]).shape[2] for c in acdc_few.datalist()["training"]]
    assert len(acdc_few.datalist()["training"]) == 8 and len(train) == sum(depths)
    assert_one_epoch_trains(train, acdc_few.num_classes, batch_size=16)


def test_unlisted_patient_and_wrong_folder_are_errors(few_acdc, tmp_path):
    with pytest.raises(ValueError, match="has no patientNNN folders"):
        ACDC(tmp_path, output_dir=tmp_path / "run")
    root = tmp_path / "acdc"
    (root / "splits").mkdir(parents=True)
    (root / "database").symlink_to(few_acdc / "database")
    for name in ("train", "val", "test"):
        (root / "splits" / f"{name}.list").write_text("patient999\n")
    with pytest.raises(ValueError, match="lists no subset for patient"):
        ACDC(root, output_dir=tmp_path / "run").datalist()
