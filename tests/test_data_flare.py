"""FLARE component on tiny NIfTI files in the real download layouts: discovery, 13 -> 4 labels, split, bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.transforms import Invertd

from calib_monai.data import FLARE, find_flare_cases, split_cases, split_sizes
from calib_monai.data.transforms import unwrap_case_error

SHAPE = (12, 10, 6)
AFFINE = np.diag([2.0, 2.0, 5.0, 1.0])
# FLARE22 label value -> FLARE (liver 1, kidney 2, spleen 3, pancreas 4), written out by hand from the FLARE22 list:
# 1 liver, 2 right kidney, 3 spleen, 4 pancreas, 5 aorta, 6 IVC, 7 RAG, 8 LAG, 9 gallbladder, 10 esophagus,
# 11 stomach, 12 duodenum, 13 left kidney
EXPECTED_FLARE = [0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 2]


def _save(array: np.ndarray, path: Path, affine: np.ndarray = AFFINE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(array, affine), str(path))
    return path


def _case(rng: np.random.Generator, max_label: int) -> tuple[np.ndarray, np.ndarray]:
    image = rng.integers(-1000, 1000, SHAPE).astype(np.int16)
    label = np.zeros(SHAPE, dtype=np.uint8)
    label[2:10, 2:8, 1:5] = rng.integers(0, max_label + 1, (8, 6, 4))
    return image, label


def _flare21(root: Path, n: int = 3) -> Path:
    rng = np.random.default_rng(0)
    for i in range(n):
        image, label = _case(rng, 4)
        _save(image, root / "TrainingImg" / f"train_{i:03d}_0000.nii.gz")
        _save(label, root / "TrainingMask" / f"train_{i:03d}.nii.gz")
    return root


def _flare22(root: Path, n: int = 3, images: str = "imagesTr", labels: str = "labelsTr") -> Path:
    rng = np.random.default_rng(1)
    for i in range(1, n + 1):
        image, label = _case(rng, 13)
        _save(image, root / images / f"FLARE22_Tr_{i:04d}_0000.nii.gz")
        _save(label, root / labels / f"FLARE22_Tr_{i:04d}.nii.gz")
    return root


def _raw(path: str) -> np.ndarray:
    return np.asarray(nib.load(path).dataobj)


def _component(root: Path, out: Path, **kwargs) -> FLARE:
    # no resampling, ROI = whole volume: the preprocessed label must equal the mapped file voxel for voxel
    options = dict(output_dir=out, roi_size=SHAPE, spacing=None, split=(1, 1, 1), window=(-1000, 1000))
    return FLARE(str(root), **{**options, **kwargs})


def test_flare21_layout_pairs_and_preprocesses(tmp_path):
    layout, cases = find_flare_cases(_flare21(tmp_path / "FLARE21"))
    assert layout == "flare21" and len(cases) == 3
    assert all(Path(c["label"]).name == Path(c["image"]).name.replace("_0000", "") for c in cases)
    data = _component(tmp_path / "FLARE21", tmp_path / "run")
    assert data.source == "flare" and data.num_classes == 5
    train = data.train_dataset()
    assert len(train) == SHAPE[2]  # every axial slice of the one training volume
    case = data.datalist()["training"][0]
    volume = train.volumes[0]
    np.testing.assert_array_equal(volume["label"][0].numpy(), _raw(case["label"]))  # FLARE21 labels unchanged
    expected_image = (np.clip(_raw(case["image"]).astype(np.float32), -1000, 1000) + 1000) / 2000
    np.testing.assert_allclose(volume["image"][0].numpy(), expected_image, atol=1e-6)
    assert train[3]["image"].shape == (1, 12, 10) and torch.equal(train[3]["label"][0], volume["label"][0, :, :, 3])


@pytest.mark.parametrize("images, labels", [("imagesTr", "labelsTr"), ("images", "labels")])
def test_flare22_layout_maps_13_organs_to_4(tmp_path, images, labels):
    root = _flare22(tmp_path / "FLARE22", images=images, labels=labels)
    layout, cases = find_flare_cases(root)
    assert layout == "flare22" and [Path(c["image"]).name for c in cases][0] == "FLARE22_Tr_0001_0000.nii.gz"
    data = _component(root, tmp_path / "run")
    for subset, dataset in (("validation", data.val_dataset()), ("test", data.test_dataset())):
        raw = _raw(data.datalist()[subset][0]["label"])
        assert len(np.unique(raw)) >= 12  # the file really holds (nearly) all 13 organs
        mapped = dataset[0]["label"][0].numpy()
        np.testing.assert_array_equal(mapped, np.take(EXPECTED_FLARE, raw))
        assert dataset[0]["label"].meta["filename_or_obj"] == data.datalist()[subset][0]["label"]


def test_flare_crop_is_centred_on_the_foreground_and_keeps_context(tmp_path):
    root = tmp_path / "F"
    image = np.arange(np.prod(SHAPE), dtype=np.int16).reshape(SHAPE)
    label = np.zeros(SHAPE, dtype=np.uint8)
    label[8:11, 0:2, 4:6] = 1  # bounding box x 8..10, y 0..1, z 4..5 -> centres 9, 1, 5 (end-exclusive: (8+11)//2...)
    for i in range(3):
        _save(image, root / "imagesTr" / f"c{i}.nii.gz")
        _save(label, root / "labelsTr" / f"c{i}.nii.gz")
    data = FLARE(
        str(root), output_dir=tmp_path / "run", roi_size=(4, 4, 2), spacing=None, split=(1, 1, 1), window=(0, 10000)
    )
    volume = data.train_dataset().volumes[0]  # the training volumes are cropped around the organs
    # window start = clip(centre - roi // 2, 0, n - roi):
    # x: clip(9 - 2, 0, 8) = 7; y: clip(1 - 2, 0, 6) = 0; z: clip(5 - 1, 0, 4) = 4
    np.testing.assert_allclose(volume["image"][0].numpy(), image[7:11, 0:4, 4:6] / 10000.0, rtol=1e-6)
    assert int(volume["label"].sum()) == int(label.sum())  # the whole foreground is inside the window
    # validation and test volumes are scored whole, as inference serves them: the label chooses no crop
    for scored in (data.val_dataset()[0], data.test_dataset()[0]):
        np.testing.assert_allclose(scored["image"][0].numpy(), image / 10000.0, rtol=1e-6)
        np.testing.assert_array_equal(scored["label"][0].numpy(), label)


def test_flare_scored_volumes_do_not_depend_on_where_the_label_is(tmp_path):
    root = tmp_path / "F"
    image = np.random.default_rng(0).integers(-500, 500, SHAPE).astype(np.int16)
    for i, corner in enumerate(((0, 0, 0), (8, 6, 3), (4, 2, 1))):  # the same image, organs in different places
        label = np.zeros(SHAPE, dtype=np.uint8)
        label[corner[0] : corner[0] + 4, corner[1] : corner[1] + 4, corner[2] : corner[2] + 3] = 1
        _save(image, root / "imagesTr" / f"c{i}.nii.gz")
        _save(label, root / "labelsTr" / f"c{i}.nii.gz")
    data = FLARE(str(root), output_dir=tmp_path / "run", roi_size=(6, 6, 4), spacing=None, split=(1, 1, 1))
    scored = [data.val_dataset()[0]["image"], data.test_dataset()[0]["image"]]
    served = data.inference_preprocessing()({"image": str(root / "imagesTr" / "c0.nii.gz")})["image"]
    for volume in scored:  # what evaluate scores is what inference serves, wherever the organs are
        assert volume.shape == served.shape == (1, *SHAPE)
        torch.testing.assert_close(volume.as_tensor(), served.as_tensor())
    assert data.train_dataset().volumes[0]["image"].shape == (1, 6, 6, 4)  # training keeps the paper's crop


def test_split_sizes_keep_the_paper_ratio():
    assert split_sizes(360) == (240, 40, 80)
    assert split_sizes(361) == (241, 40, 80)
    assert split_sizes(90) == (60, 10, 20)
    assert split_sizes(12) == (8, 1, 3)  # round(12 * 40 / 360) = 1, round(12 * 80 / 360) = 3
    assert split_sizes(3) == (1, 1, 1)
    with pytest.raises(ValueError, match="cannot be split"):
        split_sizes(2)
    cases = [{"image": f"i{k:03d}", "label": f"l{k:03d}"} for k in range(36)]
    parts = split_cases(cases, (240, 40, 80), seed=7)
    assert [len(parts[k]) for k in ("training", "validation", "test")] == [24, 4, 8]
    assert sorted(c["image"] for part in parts.values() for c in part) == [c["image"] for c in cases]  # a partition
    assert parts == split_cases(list(reversed(cases)), (240, 40, 80), seed=7)  # listing order does not matter
    assert parts != split_cases(cases, (240, 40, 80), seed=8)


def test_datalist_is_written_and_reused(tmp_path, caplog):
    root = _flare21(tmp_path / "FLARE21", n=9)
    first = _component(root, tmp_path / "run", split=(240, 40, 80), seed=0).datalist()
    stored = json.loads((tmp_path / "run" / "datalist.json").read_text())
    assert [len(stored[k]) for k in ("training", "validation", "test")] == [6, 1, 2]
    assert stored["seed"] == 0 and stored["source"] == "flare" and stored["dataset_dir"] == str(root.resolve())
    assert {k: stored[k] for k in first} == first
    # a resumed run (even with another seed, or after cases were added) keeps the stored split, with a warning
    _save(np.zeros(SHAPE, np.int16), root / "TrainingImg" / "train_100_0000.nii.gz")
    _save(np.zeros(SHAPE, np.uint8), root / "TrainingMask" / "train_100.nii.gz")
    with caplog.at_level(logging.WARNING, logger="calib_monai"):
        assert _component(root, tmp_path / "run", split=(240, 40, 80), seed=123).datalist() == first
    assert "lists 9 cases but 10 are found" in caplog.text and "seed 0" in caplog.text
    assert _component(root, tmp_path / "fresh", split=(240, 40, 80), seed=123).datalist() != first
    with pytest.raises(ValueError, match="datalist.json was written for dataset_dir"):
        _component(_flare21(tmp_path / "other", n=3), tmp_path / "run").datalist()
    Path(first["test"][0]["image"]).unlink()
    with pytest.raises(ValueError, match="no longer exist"):
        _component(root, tmp_path / "run").datalist()


def test_dataset_dir_missing_empty_or_unknown_lists_the_layouts(tmp_path):
    with pytest.raises(ValueError, match=r"does not exist(.|\n)*TrainingImg(.|\n)*imagesTr"):
        FLARE(str(tmp_path / "nowhere"), output_dir=tmp_path / "run")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no known FLARE layout(.|\n)*Found: nothing"):
        FLARE(str(tmp_path / "empty"), output_dir=tmp_path / "run")
    (tmp_path / "odd" / "scans").mkdir(parents=True)
    (tmp_path / "odd" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"TrainingMask(.|\n)*Found: notes.txt, scans/"):
        FLARE(str(tmp_path / "odd"), output_dir=tmp_path / "run")
    (tmp_path / "bare" / "imagesTr").mkdir(parents=True)
    (tmp_path / "bare" / "labelsTr").mkdir()
    with pytest.raises(ValueError, match="no .nii/.nii.gz image files"):
        FLARE(str(tmp_path / "bare"), output_dir=tmp_path / "run")


def test_image_without_label_and_foreign_label_convention_are_errors(tmp_path):
    root = _flare22(tmp_path / "F")
    (root / "labelsTr" / "FLARE22_Tr_0002.nii.gz").unlink()
    with pytest.raises(ValueError, match=r"FLARE22_Tr_0002_0000.nii.gz has no label(.|\n)*FLARE22_Tr_0002.nii.gz"):
        FLARE(str(root), output_dir=tmp_path / "run")
    root = _flare22(tmp_path / "AMOS")
    (root / "dataset.json").write_text(json.dumps({"labels": {"0": "background", "1": "spleen", "2": "kidney right"}}))
    with pytest.raises(ValueError, match="names label 1 'spleen'(.|\n)*MSDDataset"):
        FLARE(str(root), output_dir=tmp_path / "run")


def _bad_flare21(root: Path, spoil) -> str:
    """Three good FLARE21 cases, then ``spoil(image_path, label_path)`` on train_001; returns the spoiled file."""
    _flare21(root)
    return spoil(root / "TrainingImg" / "train_001_0000.nii.gz", root / "TrainingMask" / "train_001.nii.gz")


def _shape_mismatch(image, label):
    _save(np.zeros((12, 10, 5), np.uint8), label)
    return image.name


def _foreign_label(image, label):
    array = _raw(str(label)).copy()
    array[0, 0, 0] = 7
    _save(array, label)
    return label.name


def _nan_image(image, label):
    array = _raw(str(image)).astype(np.float32)
    array[3, 3, 3] = np.nan
    _save(array, image)
    return image.name


def _fractional_label(image, label):
    _save(_raw(str(label)).astype(np.float32) * 0.5, label)
    return label.name


def _shifted_label(image, label):
    shifted = AFFINE.copy()
    shifted[0, 3] += 50.0  # the label's header 50 mm off its image: it trained without a word
    _save(_raw(str(label)), label, shifted)
    return label.name


def _truncated(image, label):
    image.write_bytes(image.read_bytes()[:50])
    return image.name


@pytest.mark.parametrize(
    "spoil, message",
    [
        (_shape_mismatch, r"spatial shape \(12, 10, 6\)(.|\n)*has \(12, 10, 5\)"),
        (_foreign_label, r"values \[7\] outside"),
        (_nan_image, "NaN"),
        (_truncated, "cannot read image"),
        (_fractional_label, "non-integer values"),
        (_shifted_label, r"does not lie on the grid of its image .*train_001_0000.nii.gz: 50 mm apart"),
    ],
)
@pytest.mark.parametrize("cache_rate", [1.0, 0.0])
def test_bad_input_stops_with_an_error_naming_the_file(tmp_path, spoil, message, cache_rate):
    name = _bad_flare21(tmp_path / "F", spoil)
    data = _component(tmp_path / "F", tmp_path / "run", cache_rate=cache_rate)
    with pytest.raises(ValueError, match=message) as info:
        for subset in ("training", "validation", "test"):
            data.volume_dataset(subset)[0]  # cached: fails while caching; uncached: when the item is read
    assert name in str(info.value)


def test_preprocessing_is_invertible_back_to_the_file_grid(tmp_path):
    root = tmp_path / "F"
    flipped = np.diag([-2.0, -2.0, 5.0, 1.0])  # stored LPS-like: RAS orientation flips two axes
    label = np.zeros(SHAPE, dtype=np.uint8)
    label[3:9, 2:6, 1:4] = 13  # left kidney, inside an 8 x 8 x 4 window
    for i in range(3):
        _save(np.arange(np.prod(SHAPE), dtype=np.int16).reshape(SHAPE), root / "imagesTr" / f"c{i}.nii.gz", flipped)
        _save(label, root / "labelsTr" / f"c{i}.nii.gz", flipped)
    data = _component(root, tmp_path / "run", roi_size=(8, 8, 4))
    volume = data.train_dataset().volumes[0]  # through the crop around the organs
    assert volume["label"].shape == (1, 8, 8, 4) and int((volume["label"] == 2).sum()) == int((label == 13).sum())
    restored = Invertd("label", transform=data.preprocessing(), orig_keys="label", nearest_interp=True)(dict(volume))
    np.testing.assert_array_equal(restored["label"][0].numpy(), np.where(label == 13, 2, 0))
    np.testing.assert_allclose(restored["label"].affine.numpy(), flipped)
    scored = data.val_dataset()[0]  # the evaluation chain, without the crop, inverts with its own instance
    restored = Invertd("label", transform=data.preprocessing("validation"), orig_keys="label", nearest_interp=True)(
        dict(scored)
    )
    np.testing.assert_array_equal(restored["label"][0].numpy(), np.where(label == 13, 2, 0))
    np.testing.assert_allclose(restored["label"].affine.numpy(), flipped)


def test_a_label_stored_in_another_orientation_trains_on_the_same_voxels(tmp_path):
    """The same label written LAS (x reversed, the affine saying so) against RAS images: the grids are equal, so
    it passes the geometry check and the pipeline's RAS orientation gives the preprocessed label of a RAS file."""
    _flare21(tmp_path / "ras")
    _flare21(tmp_path / "las")
    mask = tmp_path / "las" / "TrainingMask" / "train_001.nii.gz"
    las = AFFINE.copy()
    las[0, 0], las[0, 3] = -AFFINE[0, 0], AFFINE[0, 0] * (SHAPE[0] - 1)
    _save(_raw(str(mask))[::-1].copy(), mask, las)
    volumes = []
    for name in ("ras", "las"):
        data = _component(tmp_path / name, tmp_path / f"run_{name}")
        volumes.append(
            {subset: data.volume_dataset(subset)[0]["label"] for subset in ("training", "validation", "test")}
        )
    for subset in volumes[0]:
        assert torch.equal(volumes[0][subset].as_tensor(), volumes[1][subset].as_tensor()), subset


def test_an_image_with_another_number_of_channels_is_named_before_the_network(tmp_path):
    """A 2-channel image into the 1-channel FLARE bundle crashed in the network's first convolution, naming no file."""
    image = _save(
        np.arange(np.prod(SHAPE) * 2, dtype=np.int16).reshape(*SHAPE, 2), tmp_path / "two_channels_0000.nii.gz"
    )
    data = FLARE(None, output_dir=tmp_path / "out", roi_size=SHAPE, spacing=None)
    with pytest.raises(RuntimeError) as err:  # MONAI's Compose wraps it: "applying transform ..."
        data.inference_preprocessing()({"image": str(image)})
    message = str(unwrap_case_error(err.value))
    assert message.startswith(f"image {image} has 2 channel(s), but the {data.source} images this bundle takes have 1")
