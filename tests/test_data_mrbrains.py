"""MRBrainS18 on tiny files in the release layout: 3 channels, 10 labels -> GM/WM/CSF, leave-one-subject-out folds."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from calib_monai.data import MRBrainS

SHAPE = (8, 6, 4)
SUBJECTS = ("1", "4", "5", "7", "14", "070", "148")  # the MRBrainS18 training subjects, in numeric order
# written out from the MRBrainS18 label list: 1 cortical GM, 2 basal ganglia -> GM 1; 3 WM, 4 WM lesions -> WM 2;
# 5 extracerebral CSF, 6 ventricles -> CSF 3; 7 cerebellum, 8 brain stem, 9 infarction, 10 other -> 0
TISSUE = np.array([0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0])


def _mrbrains(root: Path) -> Path:
    x, y, z = np.meshgrid(*(np.arange(s) for s in SHAPE), indexing="ij")
    ramps = {"reg_T1.nii.gz": x, "FLAIR.nii.gz": y, "reg_IR.nii.gz": z}  # one distinct ramp per modality
    rng = np.random.default_rng(0)
    for i, subject in enumerate(reversed(SUBJECTS)):  # written out of order: the order must come from the ids
        pre = root / "training" / subject / "pre"
        pre.mkdir(parents=True)
        for name, ramp in ramps.items():
            nib.save(nib.Nifti1Image((ramp * (i + 2) + 50).astype(np.float32), np.eye(4)), str(pre / name))
        label = rng.integers(0, 11, SHAPE).astype(np.uint8)
        nib.save(nib.Nifti1Image(label, np.eye(4)), str(root / "training" / subject / "segm.nii.gz"))
    return root


def test_channels_and_tissue_labels(tmp_path):
    data = MRBrainS(_mrbrains(tmp_path / "MRBrainS18"), tmp_path / "run", roi_size=SHAPE, fold=2)
    assert data.num_classes == 4 and data.label_names == {"0": "background", "1": "GM", "2": "WM", "3": "CSF"}
    case, volume = data.datalist()["test"][0], data.test_dataset()[0]
    assert Path(case["label"]).parent.name == "5"  # fold 2 holds out the third subject in id order
    assert volume["image"].shape == (3, *SHAPE)
    x, y, z = np.meshgrid(*(np.arange(s) for s in SHAPE), indexing="ij")
    for c, ramp in enumerate((x, y, z)):  # T1, FLAIR, IR, each min-max scaled
        np.testing.assert_allclose(volume["image"][c].numpy(), ramp / ramp.max(), atol=1e-6)
    raw = np.asarray(nib.load(case["label"]).dataobj)
    np.testing.assert_array_equal(volume["label"][0].numpy(), TISSUE[raw])


@pytest.mark.parametrize("fold", [0, 6])
def test_leave_one_subject_out(tmp_path, fold):
    data = MRBrainS(_mrbrains(tmp_path / "MRBrainS18"), tmp_path / "run", roi_size=SHAPE, fold=fold, seed=1)
    datalist = data.datalist()
    subjects = {k: [Path(c["label"]).parent.name for c in v] for k, v in datalist.items()}
    assert subjects["test"] == [SUBJECTS[fold]]
    assert len(subjects["training"]) == 5 and len(subjects["validation"]) == 1
    assert sorted(sum(subjects.values(), [])) == sorted(SUBJECTS)
    with pytest.raises(ValueError, match="was written for fold"):
        MRBrainS(tmp_path / "MRBrainS18", tmp_path / "run", fold=(fold + 1) % 7).datalist()
    with pytest.raises(ValueError, match=r"fold must be in 0..6"):
        MRBrainS(tmp_path / "MRBrainS18", tmp_path / "run", fold=7)


def test_missing_scan_is_named(tmp_path):
    root = _mrbrains(tmp_path / "MRBrainS18")
    (root / "training" / "14" / "pre" / "reg_IR.nii.gz").unlink()
    with pytest.raises(ValueError, match="MRBrainS18 scan .*14/pre/reg_IR.nii.gz is missing"):
        MRBrainS(root, tmp_path / "run")
