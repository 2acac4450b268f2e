"""Synthetic abdominal CT phantoms: determinism, caching, labels and HU ranges, and the FLARE component on them."""

from __future__ import annotations

import logging

import nibabel as nib
import numpy as np
import pytest
import torch

from calib_monai.data import FLARE, generate_phantom, write_phantom_dataset
from calib_monai.data.phantoms import PHANTOM_FOV_MM, phantom_shape

SMALL = (48, 48, 16)  # 8 x 8 x 15 mm voxels: the whole abdomen, coarse, fast


def test_phantom_is_deterministic_per_seed_and_index():
    image_a, label_a, affine_a = generate_phantom(3, 1, SMALL)
    image_b, label_b, affine_b = generate_phantom(3, 1, SMALL)
    np.testing.assert_array_equal(image_a, image_b)
    np.testing.assert_array_equal(label_a, label_b)
    np.testing.assert_array_equal(affine_a, affine_b)
    assert not np.array_equal(image_a, generate_phantom(3, 2, SMALL)[0])  # another case
    assert not np.array_equal(image_a, generate_phantom(4, 1, SMALL)[0])  # another seed


def test_phantom_geometry_labels_and_hounsfield_units():
    image, label, affine = generate_phantom(0, 0, (64, 64, 24))
    assert image.dtype == np.int16 and label.dtype == np.uint8 and image.shape == label.shape == (64, 64, 24)
    # RAS affine whose voxels tile the fixed field of view, centred on the origin
    np.testing.assert_allclose(np.diag(affine)[:3], [f / n for f, n in zip(PHANTOM_FOV_MM, (64, 64, 24))])
    np.testing.assert_allclose(affine[:3, 3] + np.diag(affine)[:3] * (np.array([64, 64, 24]) - 1) / 2, 0, atol=1e-9)
    values = set(np.unique(label).tolist())
    assert {1, 2, 3, 4, 13} <= values <= {0, 1, 2, 3, 4, 5, 6, 9, 13}  # FLARE22 values; both kidneys present
    # patient's right kidney (2) lies at lower RAS x than the left kidney (13), the liver (1) right of the spleen (3)
    x = np.arange(64)[:, None, None]
    centre_x = {v: float(np.broadcast_to(x, label.shape)[label == v].mean()) for v in (1, 2, 3, 13)}
    assert centre_x[2] < 32 < centre_x[13] and centre_x[1] < centre_x[3]
    median = {v: float(np.median(image[label == v])) for v in values}
    assert float(image[:4, :4, :].mean()) < -950  # air in the corners, outside the body
    for organ in (1, 2, 3, 4, 13):
        assert 20 < median[organ] < 250, (organ, median[organ])  # soft tissue, contrast enhanced
    assert median[9] < median[1] - 30  # bile darker than liver
    assert median[5] > median[4] + 30  # enhanced aorta brighter than pancreas
    assert -1024 <= image.min() and image.max() < 1500


def test_phantom_cache_reuses_files_and_extends_deterministically(tmp_path):
    root = write_phantom_dataset(tmp_path / "ph", num_phantoms=3, seed=5, shape=SMALL)
    first = root / "imagesTr" / "Phantom_0000_0000.nii.gz"
    stamp = first.stat().st_mtime_ns
    write_phantom_dataset(root, num_phantoms=4, seed=5, shape=SMALL)
    assert first.stat().st_mtime_ns == stamp  # cached case not regenerated
    assert sorted(p.name for p in (root / "labelsTr").iterdir()) == [f"Phantom_000{i}.nii.gz" for i in range(4)]
    # the added case is the one the generator gives for (seed, index), independent of how many were requested
    image, label, affine = generate_phantom(5, 3, SMALL)
    written = nib.load(root / "imagesTr" / "Phantom_0003_0000.nii.gz")
    np.testing.assert_array_equal(np.asarray(written.dataobj), image)
    np.testing.assert_allclose(written.affine, affine)
    np.testing.assert_array_equal(np.asarray(nib.load(root / "labelsTr" / "Phantom_0003.nii.gz").dataobj), label)


def test_flare_defaults_to_phantoms_and_logs_where(tmp_path, caplog):
    spacing = (6.4, 6.4, 12.0)
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        data = FLARE(
            "",
            output_dir=tmp_path / "run",
            cache_dir=tmp_path / "cache",
            roi_size=(48, 48, 16),
            spacing=spacing,
            num_phantoms=4,
            seed=0,
        )
    assert data.source == "phantom" and data.num_classes == 5
    assert data.label_names == {"0": "background", "1": "liver", "2": "kidney", "3": "spleen", "4": "pancreas"}
    assert data.phantom_shape == phantom_shape(spacing) == (60, 60, 20)  # generated on the training grid
    assert "phantoms" not in caplog.text  # nothing said (or generated) until the data are used
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        datalist = data.datalist()
    message = caplog.text
    assert "phantoms" in message and str(data.phantom_root) in message and "--dataset_dir" in message
    assert [len(datalist[k]) for k in ("training", "validation", "test")] == [2, 1, 1]
    train = data.train_dataset()
    assert len(train) == 2 * 16
    item = train[5]
    assert item["image"].shape == item["label"].shape[0:1] + (48, 48) and item["image"].dtype == torch.float32
    labels = torch.cat([train.volumes[v]["label"].flatten() for v in range(2)])
    assert set(labels.unique().tolist()) == {0.0, 1.0, 2.0, 3.0, 4.0}  # FLARE22 13 (left kidney) mapped to 2
    volume = data.val_dataset()[0]
    assert volume["image"].shape == (1, 60, 60, 20)  # scored whole (the crop around the organs is for training)
    assert 0.0 <= float(volume["image"].min()) < float(volume["image"].max()) <= 1.0
    assert volume["image"].meta["filename_or_obj"] == datalist["validation"][0]["image"]
    np.testing.assert_allclose(np.diag(volume["image"].affine.numpy())[:3], spacing)


def test_phantom_generation_rejects_bad_sizes():
    with pytest.raises(ValueError, match="phantom_shape"):
        generate_phantom(0, 0, (4, 64, 64))
    with pytest.raises(ValueError, match="num_phantoms"):
        FLARE("", output_dir="run", num_phantoms=2)
