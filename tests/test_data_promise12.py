"""PROMISE12 on tiny MetaImage files in the release layout: pairing, in-plane resampling, percentile scaling."""

from __future__ import annotations

from pathlib import Path

import itk
import numpy as np
import pytest

from calib_monai.data import PROMISE12

D, H, W = 4, 16, 12  # ITK arrays are (z, y, x)


def _mhd(array: np.ndarray, path: Path, spacing=(0.3125, 0.3125, 3.0)) -> None:
    image = itk.image_from_array(array)
    image.SetSpacing(spacing)
    path.parent.mkdir(parents=True, exist_ok=True)
    itk.imwrite(image, str(path))


def _promise(root: Path, n: int = 4) -> Path:
    rng = np.random.default_rng(0)
    for i in range(n):
        part = root / f"TrainingData_Part{1 + i % 2}"
        _mhd(rng.normal(100, 20, (D, H, W)).astype(np.float32), part / f"Case{i:02d}.mhd")
        label = np.zeros((D, H, W), np.uint8)
        label[1:3, 4:12, 3:9] = 1
        _mhd(label, part / f"Case{i:02d}_segmentation.mhd")
    _mhd(np.zeros((D, H, W), np.float32), root / "TestData" / "Case00.mhd")  # unlabelled: skipped
    return root


def test_pairs_resamples_in_plane_and_scales(tmp_path):
    data = PROMISE12(_promise(tmp_path / "promise12"), tmp_path / "run", roi_size=(-1, -1, -1))
    assert data.num_classes == 2 and data.label_names == {"0": "background", "1": "prostate"}
    datalist = data.datalist()
    assert sum(len(v) for v in datalist.values()) == 4 and [len(datalist[k]) for k in datalist] == [2, 1, 1]
    assert all(c["label"] == c["image"].replace(".mhd", "_segmentation.mhd") for v in datalist.values() for c in v)
    volume = data.val_dataset()[0]
    # 0.3125 mm -> 0.625 mm in-plane halves H and W; the 3 mm slices are kept
    assert volume["image"].shape == (1, W // 2, H // 2, D)
    np.testing.assert_allclose(np.abs(np.diag(volume["image"].affine.numpy()))[:3], [0.625, 0.625, 3.0], atol=1e-6)
    image = volume["image"].numpy()
    assert image.min() == 0.0 and image.max() == pytest.approx(1.0) and (image == 0.0).mean() < 0.05
    assert set(volume["label"].unique().tolist()) == {0.0, 1.0}
    assert int(volume["label"].sum()) == 2 * (8 // 2) * (6 // 2)  # the 2 x 8 x 6 box at half the in-plane size


def test_default_roi_and_missing_layout(tmp_path):
    data = PROMISE12(_promise(tmp_path / "promise12", n=3), tmp_path / "run")
    assert data.preprocessing()(data.datalist()["training"][0])["image"].shape == (1, 256, 256, D)
    with pytest.raises(ValueError, match=r"(?s)no CaseNN.mhd image with a CaseNN_segmentation.mhd.*Expected one of"):
        PROMISE12(tmp_path / "promise12" / "TestData", tmp_path / "run2")
