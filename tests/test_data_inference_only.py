"""dataset_dir=None: every component is a preprocessing-only component (bundle inference.json) without a data set."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image

from calib_monai.data import (
    ACDC,
    BUSI,
    FLARE,
    PROMISE12,
    BraTS,
    Hippocampus,
    KiTS,
    MRBrainS,
    MSDDataset,
    Prostate,
    image_datalist,
    inference_preprocessing,
)
from calib_monai.data.transforms import unwrap_case_error

SHAPE = (12, 10, 4)

# component, constructor kwargs (small sizes: fast), input channels, expected preprocessed shape (None: not fixed)
COMPONENTS = [
    (ACDC, {"resize": (16, 16)}, 1, (1, 16, 16, 4)),
    (BraTS, {"resize": (16, 16, 8)}, 4, (4, 16, 16, 8)),
    (Prostate, {}, 2, (2, *SHAPE)),
    (PROMISE12, {"in_plane_spacing": 1.0}, 1, (1, *SHAPE)),
    (KiTS, {"spacing": (2.0, 2.0, 2.0)}, 1, None),
    (MRBrainS, {}, 3, (3, *SHAPE)),
    (Hippocampus, {}, 1, (1, *SHAPE)),
    (BUSI, {"roi_size": (16, 20, 1)}, 1, (1, 16, 20, 1)),
]
IDS = [c[0].__name__ for c in COMPONENTS]


def _image(tmp_path: Path, component: type, channels: int) -> Path:
    rng = np.random.default_rng(0)
    if component is BUSI:
        path = tmp_path / "in" / "benign (1).png"
        path.parent.mkdir(parents=True)
        Image.fromarray(rng.integers(10, 250, (30, 40, 3)).astype(np.uint8)).save(path)  # RGB, as many BUSI PNGs
        return path
    shape = SHAPE if channels == 1 else (*SHAPE, channels)  # NIfTI stores modalities last (4D)
    path = tmp_path / "in" / "case_0000.nii.gz"
    path.parent.mkdir(parents=True)
    nib.save(nib.Nifti1Image(rng.integers(-200, 400, shape).astype(np.float32), np.eye(4)), str(path))
    return path


@pytest.mark.parametrize(("component", "kwargs", "channels", "shape"), COMPONENTS, ids=IDS)
def test_dataset_dir_none_is_a_preprocessing_only_component(tmp_path, component, kwargs, channels, shape):
    output_dir = tmp_path / "run"
    data = component(None, output_dir, **kwargs)
    assert data.inference_only and data._dataset_root() is None
    assert not output_dir.exists()  # nothing written (and no data set read)
    assert data.num_classes == len(data.label_names) >= 2
    preprocessing = inference_preprocessing(data)
    assert preprocessing is data.inference_preprocessing()
    image = preprocessing({"image": str(_image(tmp_path, component, channels))})["image"]
    assert image.shape[0] == channels and image.dtype == torch.float32
    if shape is not None:
        assert tuple(image.shape) == shape
    assert float(image.min()) >= 0.0 and float(image.max()) <= 1.0 and float(image.max()) > 0.0
    for method in (data.datalist, data.train_dataset, data.val_dataset, data.test_dataset):
        with pytest.raises(ValueError, match="built without a dataset_dir .*inference only.*pass dataset_dir="):
            method()
    with pytest.raises(ValueError, match="dataset_dir is empty.*built without a data set.*images to segment"):
        image_datalist("", data)
    with pytest.raises(ValueError, match="dataset_dir is empty.*built without a data set.*images to segment"):
        image_datalist(None, data)


@pytest.mark.parametrize(("component", "kwargs"), [(c[0], c[1]) for c in COMPONENTS], ids=IDS)
def test_an_empty_dataset_dir_for_training_still_names_the_expected_layout(tmp_path, component, kwargs):
    expected = "must name an MSD task folder" if issubclass(component, MSDDataset) else "dataset_dir is empty; expected"
    with pytest.raises(ValueError, match=expected):
        component("", tmp_path / "run", **kwargs)


def test_the_channel_check_still_applies_without_a_data_set(tmp_path):
    data = BraTS(None, tmp_path / "run", resize=(16, 16, 8))
    with pytest.raises(RuntimeError) as info:  # MONAI's Compose wraps the CaseDataError naming the file
        inference_preprocessing(data)({"image": str(_image(tmp_path, BraTS, 1))})
    message = str(unwrap_case_error(info.value))  # the channels are counted as the channels are put first
    assert "case_0000.nii.gz has 1 channel(s), but the" in message and "have 4 (FLAIR, T1, T1ce, T2)" in message


def test_msd_dataset_without_known_classes_needs_its_dataset_json(tmp_path):
    with pytest.raises(ValueError, match="reads its classes from the task's dataset.json.*Hippocampus, Prostate"):
        MSDDataset(None, tmp_path / "run")


def test_flare_keeps_the_phantoms_for_an_empty_dataset_dir(tmp_path):
    for empty in ("", None):
        data = FLARE(empty, tmp_path / "run", cache_dir=tmp_path / "cache")
        assert data.source == "phantom" and not data.inference_only
        assert not (tmp_path / "cache").exists()  # phantoms are written on first use of the datalist only
