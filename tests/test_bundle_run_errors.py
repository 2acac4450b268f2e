"""Real ``python -m monai.bundle run`` processes given the settings and data a new user got wrong: each ends with exit
code 1 and one last line naming the key (or file), the value and the fix, the traceback only on request. The checks
they run are unit-tested in ``test_bundle_settings.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import nibabel as nib
import numpy as np
from test_bundle_settings import FLARE, HPC, REPO, _msd_task


def _bundle_run(*args: str, env: dict | None = None, timeout: int = 300) -> tuple[int, list[str]]:
    command = [sys.executable, "-m", "monai.bundle", "run", *args]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    return result.returncode, (result.stdout + result.stderr).strip().splitlines()


def test_a_key_typo_ends_the_run_with_one_line_and_exit_1(tmp_path):
    code, lines = _bundle_run(
        "training", "--config_file", str(FLARE / "train.json"), "--epoch", "1", "--output_dir", str(tmp_path)
    )
    assert code == 1 and lines[-1].startswith(
        "ERROR: --epoch 1 (the command line) is not a setting of train.json; did you mean --epochs?"
    )
    assert not any("Traceback" in line for line in lines) and len(lines) < 10
    assert lines[-2] == "(the full traceback: run again with CALIB_MONAI_TRACEBACK=1)"
    assert not (tmp_path / "model.pt").exists()
    code, lines = _bundle_run(
        "training",
        "--config_file",
        str(FLARE / "train.json"),
        "--loss#alpha",
        "-1",
        "--output_dir",
        str(tmp_path),
        env={"CALIB_MONAI_TRACEBACK": "1"},
    )
    assert code == 1 and any(line.startswith("Traceback") for line in lines)  # on request
    assert lines[-1] == (
        "ERROR: loss (calib_monai.losses.NACLLoss): alpha must be a finite number >= 0 (the weight "
        "lambda of the neighbour penalty; the papers use 0.1), got -1."
    )
    code, lines = _bundle_run(
        "training", "--config_file", str(FLARE / "train.json"), "--roi_size", "96", "--output_dir", str(tmp_path)
    )
    assert code == 1 and lines[-1] == (
        "ERROR: roi_size = 96 is not valid: the preprocessed volume size must be a list "
        '[H, W, D]; pass three sizes, e.g. --roi_size "[96,96,-1]" (-1 keeps an axis\'s '
        "extent)"
    )  # a bare TypeError before


def test_classes_against_a_3_class_dataset_json_in_a_real_run(tmp_path):
    task = _msd_task(tmp_path / "Task", {"0": "background", "1": "a", "2": "b"}, {"0": "MRI"})
    common = [
        "--config_file",
        str(HPC / "train.json"),
        "--data#_target_",
        "calib_monai.data.MSDDataset",
        "--dataset_dir",
        str(task),
        "--output_dir",
        str(tmp_path / "out"),
    ]
    code, lines = _bundle_run("training", *common, "--num_classes", "2", "--label_names", '{"0": "bg", "1": "a"}')
    assert code == 1
    assert lines[-1].startswith(f"ERROR: num_classes = 2 is not valid: {task / 'dataset.json'} describes 3 classes")
    code, lines = _bundle_run("training", *common, "--num_classes", "5")
    assert code == 1 and lines[-1].startswith("ERROR: num_classes = 5 is not valid: label_names names 3 classes")


def test_a_data_error_exits_1_with_the_files_named(tmp_path):
    """A label 50 mm off its image, found while the data are read: exit 1 (not 134), the files named last."""
    rng = np.random.default_rng(0)
    affine = np.diag([2.0, 2.0, 5.0, 1.0])
    for i in range(3):
        label = np.zeros((12, 10, 6), np.uint8)
        label[2:8, 2:8, 1:5] = 1 + i
        shifted = affine.copy()
        shifted[0, 3] += 50.0  # every label: whichever case is read first stops the run
        for folder, array, grid in (
            ("TrainingImg", rng.integers(-500, 500, (12, 10, 6)).astype(np.int16), affine),
            ("TrainingMask", label, shifted),
        ):
            (tmp_path / "F" / folder).mkdir(parents=True, exist_ok=True)
            name = f"train_{i:03d}_0000.nii.gz" if folder == "TrainingImg" else f"train_{i:03d}.nii.gz"
            nib.save(nib.Nifti1Image(array, grid), str(tmp_path / "F" / folder / name))
    code, lines = _bundle_run(
        "training",
        "--config_file",
        str(FLARE / "train.json"),
        "--dataset_dir",
        str(tmp_path / "F"),
        "--output_dir",
        str(tmp_path / "out"),
        "--roi_size",
        "[12,10,6]",
        "--data#spacing",
        "None",
        "--data#split",
        "[1,1,1]",
        "--epochs",
        "1",
    )
    assert code == 1, lines[-3:]
    case = lines[-1].split("TrainingMask/train_")[1][:3]
    assert lines[-1].startswith(
        f"ERROR: label {tmp_path / 'F' / 'TrainingMask' / f'train_{case}.nii.gz'} does not lie "
        f"on the grid of its image {tmp_path / 'F' / 'TrainingImg' / f'train_{case}_0000.nii.gz'}"
        ": 50 mm apart"
    )
