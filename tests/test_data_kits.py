"""KiTS19 on tiny files in the release layout: (slices, H, W) arrays become axial slices, window, split, errors."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from calib_monai.data import KiTS

D, H, W = 6, 12, 10
# the KiTS19 affine: array axis 0 (slices) -> -z, axis 1 -> -y, axis 2 -> -x; voxel sizes as the target spacing
AFFINE = np.array([[0, 0, -1.62, 0], [0, -1.62, 0, 0], [-3.22, 0, 0, 0], [0, 0, 0, 1.0]])


def _kits(root: Path, n: int = 4, affine: np.ndarray = AFFINE) -> Path:
    rng = np.random.default_rng(0)
    for i in range(n):
        folder = root / "data" / f"case_{i:05d}"
        folder.mkdir(parents=True)
        nib.save(
            nib.Nifti1Image(rng.integers(-200, 400, (D, H, W)).astype(np.int16), affine), str(folder / "imaging.nii.gz")
        )
        nib.save(
            nib.Nifti1Image(rng.integers(0, 3, (D, H, W)).astype(np.uint8), affine), str(folder / "segmentation.nii.gz")
        )
    test_case = root / "data" / "case_00210"  # a challenge test case: no segmentation
    test_case.mkdir()
    nib.save(nib.Nifti1Image(np.zeros((D, H, W), np.int16), affine), str(test_case / "imaging.nii.gz"))
    return root


def test_slices_are_axial_and_windowed(tmp_path):
    data = KiTS(_kits(tmp_path / "kits19"), tmp_path / "run", roi_size=(W, H, D))
    assert data.num_classes == 3 and data.label_names == {"0": "background", "1": "kidney", "2": "tumor"}
    datalist = data.datalist()
    assert sum(len(v) for v in datalist.values()) == 4  # case_00210 has no segmentation
    case = datalist["training"][0]
    raw_image = np.asarray(nib.load(case["image"]).dataobj).astype(np.float64)
    raw_label = np.asarray(nib.load(case["label"]).dataobj)
    train = data.train_dataset()
    n_train = len(datalist["training"])
    assert len(train) == n_train * D
    for k in range(D):  # RAS: slice k is raw axial slice D-1-k, (x, y) = raw (W-1-x, H-1-y)
        item = train[k]
        assert item["image"].shape == (1, W, H)
        expected_label = raw_label[D - 1 - k][::-1, ::-1].T
        np.testing.assert_array_equal(item["label"][0].numpy(), expected_label)
        expected_image = (np.clip(raw_image[D - 1 - k][::-1, ::-1].T, -79, 304) + 79) / 383
        np.testing.assert_allclose(item["image"][0].numpy(), expected_image, atol=1e-5)


def test_default_resampling_and_crop_size(tmp_path):
    data = KiTS(_kits(tmp_path / "kits19", n=3), tmp_path / "run")
    assert data.datalist_path.parent == tmp_path / "run"
    volume = data.preprocessing()(data.datalist()["test"][0])
    assert volume["image"].shape == (1, 160, 160, 80)
    np.testing.assert_allclose(np.abs(np.diag(volume["image"].affine.numpy()))[:3], [1.62, 1.62, 3.22], atol=1e-5)
    assert [len(v) for v in data.datalist().values()] == [1, 1, 1]


def test_a_copy_without_the_kits_affine_is_refused(tmp_path):
    with pytest.raises(ValueError, match="would\\s+not be axial"):
        KiTS(_kits(tmp_path / "kits19", n=3, affine=np.diag([1.0, 1.0, 1.0, 1.0])), tmp_path / "run")
    with pytest.raises(ValueError, match="has no case_NNNNN folders"):
        KiTS(tmp_path / "kits19" / "data" / "case_00000", tmp_path / "run2")
