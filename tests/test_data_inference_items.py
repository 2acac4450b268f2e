"""Inference inputs that are not one NIfTI file per case: each component lists its own unlabelled inputs
(``inference_items``), its image-only preprocessing reads them, and the outputs are named after the case and written
on the grid of the (first) input file."""

from __future__ import annotations

from pathlib import Path

import itk
import nibabel as nib
import numpy as np
import pytest
import torch
from monai.data import DataLoader, Dataset
from monai.engines import SupervisedEvaluator
from monai.inferers import SliceInferer
from monai.networks.nets import UNet
from PIL import Image

from calib_monai.data import BUSI, PROMISE12, BraTS, MRBrainS, Prostate, image_datalist, segmentation_and_confidence

SHAPE = (14, 12, 5)
AFFINE = np.array([[-1.5, 0, 0, 10.0], [0, -1.2, 0, -4.0], [0, 0, 3.0, 2.0], [0, 0, 0, 1]])  # flipped, anisotropic
BRATS_CASES = (("HGG", "BraTS19_A_1"), ("HGG", "BraTS19_B_1"), ("LGG", "BraTS19_C_1"))
MRBRAINS_SUBJECTS = ("1", "4", "070")
BUSI_IMAGES = (
    ("benign", "benign (1)", (30, 40)),
    ("benign", "benign (2)", (26, 34)),
    ("malignant", "malignant (1)", (30, 40)),
)
PROMISE_SCANS = (("TrainingData_Part1", "Case00"), ("TrainingData_Part2", "Case01"), ("TestData", "Case30"))
PROMISE_SPACING, PROMISE_ORIGIN = (0.8, 0.7, 3.0), (10.0, -20.0, 5.0)


def _nifti(path: Path, shape=SHAPE, affine=AFFINE, seed=0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.random.default_rng(seed).integers(0, 500, shape).astype(np.int16)
    nib.save(nib.Nifti1Image(array, affine), str(path))


def _brats(root: Path) -> Path:
    for i, (grade, case) in enumerate(BRATS_CASES):
        folder = root / "MICCAI_BraTS_2019_Data_Training" / grade / case
        for j, m in enumerate(("flair", "t1", "t1ce", "t2", "seg")):
            _nifti(folder / f"{case}_{m}.nii.gz", seed=10 * i + j)
    return root / "MICCAI_BraTS_2019_Data_Training"


def _mrbrains(root: Path) -> Path:
    for i, subject in enumerate(MRBRAINS_SUBJECTS):
        for j, name in enumerate(("reg_T1.nii.gz", "FLAIR.nii.gz", "reg_IR.nii.gz", "T1.nii.gz")):
            _nifti(root / "training" / subject / "pre" / name, seed=10 * i + j)
        _nifti(root / "training" / subject / "segm.nii.gz")
    return root / "training"


def _busi(root: Path) -> Path:
    rng = np.random.default_rng(0)
    folder = root / "Dataset_BUSI_with_GT"
    for cls, name, shape in BUSI_IMAGES:
        (folder / cls).mkdir(parents=True, exist_ok=True)
        rgb = np.stack([rng.integers(10, 250, shape).astype(np.uint8)] * 3, -1)  # BUSI stores grey images as RGB
        Image.fromarray(rgb).save(folder / cls / f"{name}.png")
        for mask in ("_mask", "_mask_1"):
            Image.fromarray(np.zeros(shape, np.uint8)).save(folder / cls / f"{name}{mask}.png")
    return folder


def _promise(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for part, case in PROMISE_SCANS:
        for name, array in (
            (case, rng.normal(100, 20, SHAPE[::-1]).astype(np.float32)),
            (f"{case}_segmentation", np.zeros(SHAPE[::-1], np.uint8)),
        ):
            image = itk.image_from_array(array)  # ITK arrays are (z, y, x)
            image.SetSpacing(PROMISE_SPACING)
            image.SetOrigin(PROMISE_ORIGIN)
            (root / part).mkdir(parents=True, exist_ok=True)
            itk.imwrite(image, str(root / part / f"{name}.mhd"))
    return root


def _prostate(root: Path) -> Path:
    for i in range(2):
        _nifti(root / "imagesTs" / f"prostate_{i:02d}.nii.gz", shape=(*SHAPE, 2), seed=i)  # 4D: T2, ADC last
    return root


# the LPS -> RAS flip of ITK's MetaImage geometry: x and y negated
PROMISE_AFFINE = np.diag([-PROMISE_SPACING[0], -PROMISE_SPACING[1], PROMISE_SPACING[2], 1.0])
PROMISE_AFFINE[:3, 3] = (-PROMISE_ORIGIN[0], -PROMISE_ORIGIN[1], PROMISE_ORIGIN[2])

# component, constructor kwargs, layout writer (returns the release folder), case names, input channels
SETUPS = {
    "BraTS": (BraTS, {"resize": (16, 16, 8), "roi_size": (16, 16, 8)}, _brats, [c for _, c in BRATS_CASES], 4),
    "MRBrainS": (MRBrainS, {"roi_size": (16, 16, 8)}, _mrbrains, list(MRBRAINS_SUBJECTS), 3),
    "BUSI": (BUSI, {"roi_size": (16, 16, 1)}, _busi, [n for _, n, _ in BUSI_IMAGES], 1),
    "PROMISE12": (PROMISE12, {"in_plane_spacing": 1.0}, _promise, [c for _, c in PROMISE_SCANS], 1),
    "Prostate": (Prostate, {}, _prostate, ["prostate_00", "prostate_01"], 2),
}


def _geometry(name: str, case: str) -> tuple[tuple[int, ...], np.ndarray]:
    if name == "BUSI":
        shape = next(s for _, n, s in BUSI_IMAGES if n == case)
        return shape, np.eye(4)  # a PNG has no geometry: pixel grid (H, W), unit spacing
    if name == "PROMISE12":
        return SHAPE, PROMISE_AFFINE
    return SHAPE, AFFINE


def _build(name: str, tmp_path: Path):
    component, kwargs, write, cases, channels = SETUPS[name]
    return component(None, tmp_path / "run", **kwargs), write(tmp_path / name), cases, channels


@pytest.mark.parametrize("name", list(SETUPS))
def test_items_of_the_release_layout_one_case_and_one_file(tmp_path, name):
    data, release, cases, _ = _build(name, tmp_path)
    items = image_datalist(release, data)
    if name == "Prostate":  # default listing: one 4D NIfTI per case, named after the file
        assert [Path(item["image"]).name for item in items] == [f"{c}.nii.gz" for c in cases]
        return
    assert sorted(item["case"] for item in items) == sorted(cases)
    assert image_datalist(release.parent, data) == items  # the folder holding the release folder too
    first = items[0]
    if name == "BraTS":
        modalities = ("flair", "t1", "t1ce", "t2")
        assert [Path(p).name for p in first["image"]] == [f"{first['case']}_{m}.nii.gz" for m in modalities]
        one = Path(first["image"][0]).parent
        assert image_datalist(one, data) == [first]  # one case folder
        assert image_datalist(one.parent, data) == [i for i in items if Path(i["image"][0]).parent.parent == one.parent]
        assert image_datalist(first["image"][2], data) == [first]  # one modality file of the case
    elif name == "MRBrainS":
        assert [Path(p).name for p in first["image"]] == ["reg_T1.nii.gz", "FLAIR.nii.gz", "reg_IR.nii.gz"]
        assert [item["case"] for item in items] == list(MRBRAINS_SUBJECTS)  # numeric id order
        subject = Path(first["image"][0]).parent.parent
        assert image_datalist(subject, data) == [first] == image_datalist(subject / "pre", data)
    else:  # BUSI, PROMISE12: one image file, no masks / segmentations listed
        assert not any("_mask" in item["image"] or "_segmentation" in item["image"] for item in items)
        assert image_datalist(first["image"], data) == [first]
        mask = first["image"].replace(".png", "_mask.png").replace(".mhd", "_segmentation.mhd")
        with pytest.raises(ValueError, match="not a (BUSI image|PROMISE12 scan) to segment"):
            image_datalist(mask, data)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no"):
        image_datalist(tmp_path / "empty", data)


def test_repeated_case_names_and_a_missing_modality_are_errors(tmp_path):
    data, release, _, _ = _build("BraTS", tmp_path)
    original = release / "HGG" / "BraTS19_A_1"
    copy = release / "HGG_copy" / "BraTS19_A_1"
    copy.mkdir(parents=True)
    for p in original.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    with pytest.raises(ValueError, match=r"BraTS19_A_1.* and .*HGG_copy.* are both the case 'BraTS19_A_1'"):
        image_datalist(release, data)
    assert len(image_datalist(release / "HGG_copy", data)) == 1
    (release / "LGG" / "BraTS19_C_1" / "BraTS19_C_1_t1ce.nii.gz").unlink()
    with pytest.raises(ValueError, match="BraTS t1ce file .*BraTS19_C_1_t1ce.nii.gz is missing"):
        image_datalist(release / "LGG", data)


@pytest.mark.parametrize("name", list(SETUPS))
def test_inference_end_to_end_writes_case_named_outputs_on_the_input_grid(tmp_path, name):
    data, release, cases, channels = _build(name, tmp_path)
    items = image_datalist(release, data)
    preprocessing = data.inference_preprocessing()
    image = preprocessing(dict(items[0]))["image"]
    assert image.shape[0] == channels and image.dtype == torch.float32
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    loader = DataLoader(Dataset(items, transform=preprocessing), batch_size=1)
    torch.manual_seed(0)
    network = UNet(
        spatial_dims=2, in_channels=channels, out_channels=data.num_classes, channels=(4, 8), strides=(2,)
    ).eval()
    evaluator = SupervisedEvaluator(
        device=torch.device("cpu"),
        val_data_loader=loader,
        network=network,
        inferer=SliceInferer(roi_size=(16, 16), sw_batch_size=4, spatial_dim=2, progress=False),
        postprocessing=segmentation_and_confidence(preprocessing, tmp_path / "out"),
    )
    evaluator.run()
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted(f"{c}_{kind}.nii.gz" for c in cases for kind in ("conf", "seg"))
    for case in cases:
        shape, affine = _geometry(name, case)
        seg = nib.load(tmp_path / "out" / f"{case}_seg.nii.gz")
        conf = nib.load(tmp_path / "out" / f"{case}_conf.nii.gz")
        for output in (seg, conf):
            assert output.shape == shape
            np.testing.assert_allclose(output.affine, affine, atol=1e-4)
        assert set(np.unique(np.asarray(seg.dataobj)).tolist()) <= set(range(data.num_classes))
        confidence = np.asarray(conf.dataobj)
        assert confidence.min() >= 1.0 / data.num_classes - 1e-5 and confidence.max() <= 1.0 + 1e-5


def test_an_empty_dataset_dir_lists_the_test_split_by_case_name(tmp_path):
    release = _brats(tmp_path / "BraTS")
    data = BraTS(release, tmp_path / "run", resize=(16, 16, 8), roi_size=(16, 16, 8), split=(1, 1, 1))
    (item,) = image_datalist("", data)
    assert item == {"image": data.datalist()["test"][0]["image"], "case": Path(item["image"][0]).parent.name}
