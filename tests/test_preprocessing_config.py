"""The preprocessing is in the bundle configs as MONAI transforms: one list per data set, three phases derived from it,
command-line overrides of a transform argument, and no crop chosen by the label for a volume that is scored."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from monai.bundle import ConfigParser

from bundle_factory import DATASETS, render_bundle
from calib_monai.data import FLARE
from calib_monai.data.preprocessing import EVALUATION, INFERENCE, TRAINING, image_only, only, phase_transforms
from conftest import REPO_ROOT

BUNDLE = REPO_ROOT / "bundles" / "nacl_flare"
# 3 coarse phantoms (12 x 12 x 30 mm voxels: a 32 x 32 x 8 grid), split 1/1/1
TINY = {"roi_size": [32, 32, 8], "data#num_phantoms": 3, "data#spacing": [12.0, 12.0, 30.0]}


def _mentions_label(value) -> bool:
    if isinstance(value, dict):
        return any(_mentions_label(v) for v in value.values())
    if isinstance(value, list):
        return any(_mentions_label(v) for v in value)
    return value == "label"


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_bundle_chains_are_the_phases_of_the_component_list(name):
    steps = DATASETS[name].component_class.preprocessing_steps()
    files = render_bundle(f"nacl_{name}")
    train, evaluate = json.loads(files["configs/train.json"]), json.loads(files["configs/evaluate.json"])
    inference = json.loads(files["configs/inference.json"])
    # the zoo's layout: the shared steps once, the training chain adds its crop, validation copies the shared steps
    shared, added = train["train"]["deterministic_transforms"], train["train"]["training_transforms"]
    assert (
        train["train"]["preprocessing"]["transforms"] == "$@train#deterministic_transforms + @train#training_transforms"
    )
    assert train["validate"]["preprocessing"]["transforms"] == "%train#deterministic_transforms"
    evaluation_only = [t for t in shared if t["_target_"].endswith("KeepInputLabeld")]  # off in training (its flag)
    assert [t for t in shared if t not in evaluation_only] + added == phase_transforms(steps, TRAINING)
    assert (
        all(
            t["_disabled_"] == "$not calib_monai.bundle.as_bool(@keep_input_label, 'keep_input_label')"
            for t in evaluation_only
        )
        and train["keep_input_label"] is False
    )
    # the scored volumes go through the inference chain plus the label: no crop/pad to roi_size that inference lacks
    scored = [t for t in phase_transforms(steps, EVALUATION) if t["_target_"] != "ResizeWithPadOrCropd"]
    assert shared == scored
    assert inference["preprocessing"]["transforms"] == phase_transforms(steps, INFERENCE)
    # each dataset applies its phase's chain; evaluate.json scores the test volumes with the evaluation chain
    assert "@train#preprocessing" in train["train"]["dataset"]
    assert "@validate#preprocessing" in train["validate"]["dataset"]
    assert evaluate["validate#dataset"] == "$@data.test_dataset(@validate#preprocessing)"
    assert inference["dataset"]["transform"] == "@preprocessing"
    # the label never chooses the crop of a scored volume, and inference never sees a label
    assert not any(step.get("source_key") == "label" for step in phase_transforms(steps, EVALUATION))
    assert not _mentions_label(phase_transforms(steps, INFERENCE))
    # the data set's settings the chains read are shown in (and set from) the data section
    for arg in DATASETS[name].component_class.preprocessing_args:
        assert arg in train["data"] and train["data"][arg] == inference["data"][arg]


def test_image_only_keeps_the_image_entries():
    spacing = {"_target_": "Spacingd", "keys": ["image", "label"], "mode": ["bilinear", "nearest"], "pixdim": [1, 1, 1]}
    assert image_only(spacing) == {"_target_": "Spacingd", "keys": "image", "mode": "bilinear", "pixdim": [1, 1, 1]}
    loader = {"_target_": "calib_monai.data.LoadBUSId", "image_key": "image", "label_key": "label"}
    assert image_only(loader)["label_key"] is None
    with pytest.raises(ValueError, match="label only"):
        image_only({"_target_": "MapLabelValued", "keys": "label"})
    with pytest.raises(ValueError, match="reads the label"):
        image_only({"_target_": "CropForegroundd", "keys": ["image"], "source_key": "label"})
    step = only((TRAINING,), {"_target_": "CropForegroundd", "keys": ["image", "label"], "source_key": "label"})
    assert phase_transforms([step], TRAINING) == [{k: v for k, v in step.items() if k != "_phases_"}]
    assert phase_transforms([step], EVALUATION) == phase_transforms([step], INFERENCE) == []
    with pytest.raises(ValueError, match="phases must be"):
        only(("testing",), step)


def test_a_command_line_override_of_a_transform_argument(tmp_path):
    """``monai.bundle run`` with ``--train#training_transforms#<i>#spatial_size``: the training volumes take the
    new size, the validation volumes (whose chain does not crop) do not."""
    config = json.loads((BUNDLE / "configs" / "train.json").read_text())
    index = [t["_target_"] for t in config["train"]["training_transforms"]].index("ResizeWithPadOrCropd")
    probe = (
        "$print('PROBE', tuple(@train#dataset.volumes[0]['image'].shape), tuple(@validate#dataset[0]['image'].shape))"
    )
    overrides = {
        **TINY,
        "output_dir": str(tmp_path / "out"),
        "data#cache_dir": str(tmp_path / "phantoms"),
        f"train#training_transforms#{index}#spatial_size": [20, 20, 6],
        "probe": probe,
    }
    cmd = [
        sys.executable,
        "-m",
        "monai.bundle",
        "run",
        "probe",
        "--config_file",
        str(BUNDLE / "configs" / "train.json"),
    ]
    for key, value in overrides.items():
        cmd += [f"--{key}", json.dumps(value) if isinstance(value, list) else str(value)]
    result = subprocess.run(
        cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("PROBE"))
    assert line == "PROBE (1, 20, 20, 6) (1, 32, 32, 8)"


def test_the_component_builds_the_chains_the_config_shows(tmp_path):
    parser = ConfigParser()
    parser.read_config(str(BUNDLE / "configs" / "train.json"))
    parser.update({**TINY, "output_dir": str(tmp_path / "out"), "data#cache_dir": str(tmp_path / "phantoms")})
    configured = parser.get_parsed_content("validate#dataset")[0]
    data = parser.get_parsed_content("data")
    assert data.preprocessing("validation") is parser.get_parsed_content("validate#preprocessing")  # the one it applies
    # the same component in Python, without a config: its own chain from the same list, the same volume
    alone = FLARE(
        "",
        output_dir=tmp_path / "out",
        cache_dir=tmp_path / "phantoms",
        roi_size=TINY["roi_size"],
        spacing=TINY["data#spacing"],
        num_phantoms=TINY["data#num_phantoms"],
    )
    built = alone.val_dataset()[0]
    for key in ("image", "label"):
        torch.testing.assert_close(built[key].as_tensor(), configured[key].as_tensor(), rtol=0, atol=0)
    torch.testing.assert_close(built["image"].affine, configured["image"].affine)
