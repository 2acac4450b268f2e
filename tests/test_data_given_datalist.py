"""Every data component honours a datalist written beforehand with ``"given": true`` (what MONAI Label's train task
writes for the submitted labels, ``calib_monai.label.fine_tune``): with ``dataset_dir`` empty, as in the bundles'
default, it reads no data set folder and lists exactly the given cases. The training runs themselves are in
``tests/test_monai_label_fine_tune.py``."""

from __future__ import annotations

import json

import pytest

from calib_monai import data

COMPONENTS = {
    "ACDC": data.ACDC,
    "BraTS": data.BraTS,
    "BUSI": data.BUSI,
    "FLARE": data.FLARE,
    "Hippocampus": data.Hippocampus,
    "KiTS": data.KiTS,
    "MRBrainS": data.MRBrainS,
    "PROMISE12": data.PROMISE12,
    "Prostate": data.Prostate,
}


def _given(folder, cases: int = 3) -> dict:
    (folder / "files").mkdir(parents=True)
    items = []
    for i in range(cases):
        image, label = folder / "files" / f"case_{i}.nii.gz", folder / "files" / f"case_{i}_label.nii.gz"
        image.touch()
        label.touch()
        items.append({"image": str(image), "label": str(label)})
    datalist = {"given": True, "training": items[1:], "validation": items[:1], "test": []}
    (folder / "out").mkdir()
    (folder / "out" / "datalist.json").write_text(json.dumps(datalist))
    return datalist


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_empty_dataset_dir_with_a_given_datalist_lists_the_given_cases(tmp_path, name):
    given = _given(tmp_path)
    component = COMPONENTS[name](dataset_dir="", output_dir=tmp_path / "out")
    assert component.datalist() == {k: given[k] for k in ("training", "validation", "test")}


@pytest.mark.parametrize("name", sorted(set(COMPONENTS) - {"FLARE"}))
def test_empty_dataset_dir_without_a_given_datalist_still_says_what_to_pass(tmp_path, name):
    with pytest.raises(ValueError, match="dataset_dir"):
        COMPONENTS[name](dataset_dir="", output_dir=tmp_path / "out").datalist()


def test_generic_msd_needs_its_dataset_json_even_with_a_given_datalist(tmp_path):
    _given(tmp_path)
    with pytest.raises(ValueError, match="MSD task folder"):
        data.MSDDataset(dataset_dir="", output_dir=tmp_path / "out")
