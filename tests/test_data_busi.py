"""BUSI on tiny PNGs in the release layout: normal excluded, masks united, depth-1 volumes, 256x256, classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from calib_monai.data import BUSI, inference_preprocessing

H, W = 30, 40


def _png(array: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def _busi(root: Path) -> Path:
    rng = np.random.default_rng(0)
    folder = root / "Dataset_BUSI_with_GT"
    for cls, n in (("benign", 3), ("malignant", 1), ("normal", 2)):
        for i in range(1, n + 1):
            grey = rng.integers(10, 250, (H, W)).astype(np.uint8)
            image = np.stack([grey] * 3, -1) if cls == "benign" else grey  # BUSI mixes RGB and grey PNGs
            _png(image, folder / cls / f"{cls} ({i}).png")
            mask = np.zeros((H, W), np.uint8)
            mask[5 + i : 15 + i, 10:20] = 255
            _png(mask, folder / cls / f"{cls} ({i})_mask.png")
    extra = np.zeros((H, W), np.uint8)
    extra[20:25, 30:38] = 255
    _png(extra, folder / "benign" / "benign (2)_mask_1.png")
    return root


def _expected_mask(cls: str, i: int) -> np.ndarray:
    mask = np.zeros((H, W), np.float32)
    mask[5 + i : 15 + i, 10:20] = 1
    if (cls, i) == ("benign", 2):
        mask[20:25, 30:38] = 1
    return mask


def test_cases_masks_and_depth_one_volumes(tmp_path):
    data = BUSI(_busi(tmp_path), tmp_path / "run", roi_size=(H, W, 1))
    assert data.num_classes == 2 and data.label_names == {"0": "background", "1": "lesion"}
    datalist = data.datalist()
    cases = sum(datalist.values(), [])
    assert len(cases) == 4 and not any("normal" in c["image"] for c in cases)  # 3 benign + 1 malignant
    assert [len(datalist[k]) for k in ("training", "validation", "test")] == [2, 1, 1]
    for subset, dataset in (("validation", data.val_dataset()), ("test", data.test_dataset())):
        case, volume = datalist[subset][0], dataset[0]
        assert volume["image"].shape == (1, H, W, 1) and volume["label"].shape == (1, H, W, 1)
        name = Path(case["image"]).stem  # e.g. "benign (2)"
        cls, i = name.split(" ")[0], int(name.split("(")[1].rstrip(")"))
        np.testing.assert_array_equal(volume["label"][0, ..., 0].numpy(), _expected_mask(cls, i))
        grey = np.asarray(Image.open(case["image"]).convert("L"), np.float64)
        np.testing.assert_allclose(
            volume["image"][0, ..., 0].numpy(), (grey - grey.min()) / (grey.max() - grey.min()), atol=1e-5
        )
    assert len(data.train_dataset()) == 2 and data.train_dataset()[0]["image"].shape == (1, H, W)


def test_default_size_type_classes_and_inference(tmp_path):
    data = BUSI(_busi(tmp_path), tmp_path / "run", classes="type")
    assert data.num_classes == 3 and data.label_names["2"] == "malignant"
    malignant = {
        "image": str(tmp_path / "Dataset_BUSI_with_GT" / "malignant" / "malignant (1).png"),
        "label": [str(tmp_path / "Dataset_BUSI_with_GT" / "malignant" / "malignant (1)_mask.png")],
    }
    volume = data.preprocessing()(malignant)
    assert volume["image"].shape == (1, 256, 256, 1)
    assert set(volume["label"].unique().tolist()) == {0.0, 2.0}
    image = inference_preprocessing(data)({"image": malignant["image"]})["image"]
    assert image.shape == (1, 256, 256, 1) and 0.0 <= float(image.min()) <= float(image.max()) <= 1.0


def test_image_without_mask_is_named(tmp_path):
    root = _busi(tmp_path)
    (root / "Dataset_BUSI_with_GT" / "benign" / "benign (3)_mask.png").unlink()
    with pytest.raises(ValueError, match=r"benign \(3\)\.png has no mask"):
        BUSI(root, tmp_path / "run")
    with pytest.raises(ValueError, match="has no benign/ or malignant/ folder"):
        BUSI(root / "Dataset_BUSI_with_GT" / "normal", tmp_path / "run")
