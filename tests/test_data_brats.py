"""BraTS 2019 on tiny files in the download layout: 4 channels in order, 4 -> 3, regions, empty slices dropped."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from calib_monai.data import BraTS

SHAPE = (12, 10, 8)
MODALITIES = ("flair", "t1", "t1ce", "t2")


def _brats(root: Path, cases=(("HGG", "BraTS19_A_1"), ("HGG", "BraTS19_B_1"), ("LGG", "BraTS19_C_1"))) -> Path:
    rng = np.random.default_rng(0)
    for grade, case in cases:
        folder = root / "MICCAI_BraTS_2019_Data_Training" / grade / case
        folder.mkdir(parents=True)
        for i, m in enumerate(MODALITIES):
            image = rng.integers(0, 100, SHAPE).astype(np.int16) + 1000 * i  # channel i lives in [1000 i, 1000 i + 99]
            nib.save(nib.Nifti1Image(image, np.eye(4)), str(folder / f"{case}_{m}.nii.gz"))
        label = np.zeros(SHAPE, np.uint8)
        label[3:9, 2:8, 2:5] = rng.choice([0, 1, 2, 4], (6, 6, 3))  # tumour in slices 2..4 only
        label[4, 4, 3] = 4
        nib.save(nib.Nifti1Image(label, np.eye(4)), str(folder / f"{case}_seg.nii.gz"))
    return root


def test_channels_labels_and_non_empty_training_slices(tmp_path):
    data = BraTS(_brats(tmp_path / "data"), tmp_path / "run", roi_size=SHAPE, resize=SHAPE)
    assert data.num_classes == 4 and data.label_names["3"] == "ET"
    datalist = data.datalist()
    assert [len(datalist[k]) for k in ("training", "validation", "test")] == [1, 1, 1]  # 235/35/65 ratios for 3
    case, volume = datalist["validation"][0], data.val_dataset()[0]
    assert [Path(p).name.split("_")[-1] for p in case["image"]] == [f"{m}.nii.gz" for m in MODALITIES]
    assert volume["image"].shape == (4, *SHAPE)
    for c, path in enumerate(case["image"]):  # per-channel min-max, channel order flair, t1, t1ce, t2
        raw = np.asarray(nib.load(path).dataobj).astype(np.float64)
        np.testing.assert_allclose(volume["image"][c].numpy(), (raw - raw.min()) / (raw.max() - raw.min()), atol=1e-5)
    raw_label = np.asarray(nib.load(case["label"]).dataobj)
    np.testing.assert_array_equal(volume["label"][0].numpy(), np.where(raw_label == 4, 3, raw_label))
    train = data.train_dataset()
    assert len(train) == 3  # slices 2, 3, 4 of the one training volume; the 5 empty ones are dropped
    assert all(float(train[i]["label"].max()) > 0 for i in range(len(train)))


def test_default_resize_gives_192x192x128(tmp_path):
    data = BraTS(_brats(tmp_path / "data"), tmp_path / "run")
    volume = data.preprocessing()(data.datalist()["test"][0])
    assert volume["image"].shape == (4, 192, 192, 128) and volume["label"].shape == (1, 192, 192, 128)
    assert set(volume["label"].unique().tolist()) <= {0.0, 1.0, 2.0, 3.0}


def test_missing_modality_and_wrong_folder(tmp_path):
    root = _brats(tmp_path / "data")
    (root / "MICCAI_BraTS_2019_Data_Training" / "LGG" / "BraTS19_C_1" / "BraTS19_C_1_t1ce.nii.gz").unlink()
    with pytest.raises(ValueError, match="BraTS t1ce file .*BraTS19_C_1_t1ce.nii.gz is missing"):
        BraTS(root, tmp_path / "run")
    with pytest.raises(ValueError, match=r"(?s)has no HGG/ or LGG/ folder.*Expected one of"):
        BraTS(tmp_path / "data" / "MICCAI_BraTS_2019_Data_Training" / "LGG", tmp_path / "run2")
