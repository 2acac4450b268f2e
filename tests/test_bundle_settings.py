"""The check of a bundle run's settings (``calib_monai.bundle.settings``) and the one-line error report of bundle runs
(``calib_monai.bundle.errors``): unit tests on the plain functions (the real ``python -m monai.bundle run`` processes:
``test_bundle_run_errors.py``).

Each case is one a new user made: a typo in a key (``--epoch 1`` trained the default 40 epochs), ``--num_classes``
against a ``dataset.json`` of 3 classes, ``--roi_size 96``, ``--selection_metric val_dic``, a negative loss weight, a
label 50 mm off its image; each must end the run with exit code 1 and one last line naming the key (or file), the
value and the fix, with the traceback only on request."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from monai.bundle import ConfigParser

from bundle_factory import bundle_names
from calib_monai.bundle import check_data_settings, check_settings, error_line
from calib_monai.bundle.overrides import nearest
from calib_monai.data import MSDDataset

REPO = Path(__file__).resolve().parents[1]
FLARE = REPO / "bundles" / "nacl_flare" / "configs"
HPC = REPO / "bundles" / "nacl_hpc" / "configs"
RUNNER = "/venv/lib/python3/site-packages/monai/bundle/__main__.py"  # sys.argv[0] of `python -m monai.bundle`


def _argv(*extra: str, config: Path = FLARE / "train.json") -> list[str]:
    return [RUNNER, "run", "training", "--config_file", str(config), *extra]


# ------------------------------------------------------------------------------------------------ override keys


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--epoch", "1"], "--epoch 1 (the command line) is not a setting of train.json; did you mean --epochs?"),
        (
            ["--loss#alpah", "0.2"],
            "--loss#alpah 0.2 (the command line): calib_monai.losses.NACLLoss has no argument "
            "'alpah'; did you mean --loss#alpha?",
        ),
        (["--valdate#evaluator#amp", "true"], "did you mean --validate#evaluator#amp?"),
        (
            ["--train#training_transforms#99#spatial_size", "[8,8,8]"],
            "train#training_transforms has 2 items",
        ),
        (
            ["--data#_target_", "calib_monai.data.MSDDataset", "--data#intensty", "percentile"],
            "calib_monai.data.MSDDataset has no argument 'intensty'; did you mean --data#intensity?",
        ),
    ],
)
def test_unknown_override_keys_name_the_nearest_known_key(extra, message):
    with pytest.raises(ValueError) as err:
        check_settings(argv=_argv(*extra))
    assert message in str(err.value)


def test_a_key_cut_short_is_matched_to_the_key_it_starts():
    # calibration_fold: the key it starts, not calibration_voxels, which shares the longer-looking tail
    assert nearest("calibration_fold", ["calibration_voxels", "calibration_folds", "calibration_split"]) == (
        "; did you mean --calibration_folds?"
    )
    assert nearest("val_dic", ["val_ece", "val_mean_dice"]) == "; did you mean --val_mean_dice?"


def test_false_for_a_components_switch_is_refused_with_the_fix():
    # python-fire hands "--data#use_split_lists false" over as the string "false", which ACDC would take as true
    acdc = REPO / "bundles" / "ce_dice_acdc" / "configs" / "train.json"
    with pytest.raises(ValueError) as err:
        check_settings(argv=_argv("--data#use_split_lists", "false", config=acdc))
    assert str(err.value) == (
        "--data#use_split_lists false (the command line): calib_monai.data.ACDC's use_split_lists is a boolean, and "
        "python -m monai.bundle run hands false over as the string 'false', which counts as true; write "
        "--data#use_split_lists False"
    )
    check_settings(argv=_argv("--data#use_split_lists", "False", config=acdc))  # fire reads False as the bool
    check_settings(argv=_argv("--data#resize", "[96, 96]", config=acdc))  # not a switch: untouched


def test_the_readmes_overrides_are_accepted(tmp_path):
    readme = [
        "--epochs",
        "50",
        "--device",
        "cpu",
        "--batch_size",
        "8",
        "--lr",
        "0.0005",
        "--output_dir",
        str(tmp_path),
        "--loss#alpha",
        "0.2",
        "--loss#kernel_ops",
        "svls",
        "--roi_size",
        "[160,160,24]",
        "--backbone",
        "dynunet",
        "--train#training_transforms#1#spatial_size",
        "[160,160,24]",
        "--data#spacing",
        "[1.6,1.6,6.0]",
        "--selection_bounds",
        '{"val_ece": 0.05}',
        "--amp",
        "true",
        "--data#cache_dir",
        str(tmp_path),
    ]
    assert check_settings(argv=_argv(*readme))
    own_data = [
        "--data#_target_",
        "calib_monai.data.MSDDataset",
        "--dataset_dir",
        str(tmp_path),
        "--num_classes",
        "3",
        "--in_channels",
        "1",
        "--roi_size",
        "[64,64,-1]",
        "--output_dir",
        str(tmp_path),
    ]
    assert check_settings(argv=_argv(*own_data, config=HPC / "train.json"))
    # a run id the command line defines, and a key another override references
    assert check_settings(argv=[RUNNER, "run", "probe", "--config_file", str(FLARE / "train.json"), "--probe", "$1"])
    assert check_settings(argv=_argv("--my_lr", "0.01", "--lr", "@my_lr"))
    # overlays: evaluate.json's own keys
    files = json.dumps([str(FLARE / "train.json"), str(FLARE / "evaluate.json")])
    assert check_settings(argv=[RUNNER, "run", "evaluating", "--config_file", files, "--eval_dir", str(tmp_path)])
    assert check_settings(argv=["pytest", "--epoch", "1"])  # not a bundle run: nothing to read from the command line


def test_keys_of_an_args_file_are_checked_too(tmp_path):
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"config_file": str(FLARE / "train.json"), "epoch": 3}))
    with pytest.raises(ValueError, match=rf"--epoch 3 \(args_file {args}\) is not a setting of train.json"):
        check_settings(argv=[RUNNER, "run", "training", "--args_file", str(args)])


# ------------------------------------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"roi_size": 96},
            "roi_size = 96 is not valid: the preprocessed volume size must be a list [H, W, D]; pass three "
            'sizes, e.g. --roi_size "[96,96,-1]"',
        ),
        ({"roi_size": [96, 96, 0]}, "each size must be a positive whole number or -1"),
        ({"epochs": 0}, "epochs = 0 is not valid: epochs must be a whole number >= 1"),
        ({"lr": -0.1}, "lr = -0.1 is not valid: the learning rate must be a finite number > 0"),
        (
            {"num_classes": 5, "label_names": {"0": "background", "1": "a", "2": "b"}},
            "num_classes = 5 is not valid: label_names names 3 classes",
        ),
        ({"selection_mode": "maximum"}, "selection_mode = 'maximum' is not valid"),
        (
            {"selection_metric": "val_dic"},
            "selection_metric = 'val_dic' is not valid: the validation computes "
            "['val_mean_dice', 'val_ece', 'val_nll']; pass --selection_metric <one of them>; "
            "did you mean val_mean_dice?",
        ),
        ({"selection_bounds": {"val_eec": 0.05}}, "'val_eec' is not a metric of the validation"),
    ],
)
def test_bad_values_name_the_key_the_value_and_the_fix(settings, message):
    metrics = [{"val_mean_dice": object()}, {"val_ece": object(), "val_nll": object()}]
    with pytest.raises(ValueError) as err:
        check_settings(metrics=metrics, argv=[], **settings)
    assert message in str(err.value)


def _msd_task(root: Path, labels: dict[str, str], modality: dict[str, str]) -> Path:
    for folder in ("imagesTr", "labelsTr"):
        (root / folder).mkdir(parents=True)
        nib.save(nib.Nifti1Image(np.zeros((4, 4, 4), np.uint8), np.eye(4)), str(root / folder / "case_1.nii.gz"))
    (root / "dataset.json").write_text(
        json.dumps(
            {
                "labels": labels,
                "modality": modality,
                "training": [{"image": "./imagesTr/case_1.nii.gz", "label": "./labelsTr/case_1.nii.gz"}],
            }
        )
    )
    return root


def test_classes_channels_and_names_are_checked_against_the_data_sets_description(tmp_path):
    labels = {"0": "background", "1": "Anterior", "2": "Posterior"}
    task = _msd_task(tmp_path / "Task", labels, {"0": "MRI"})
    data = MSDDataset(task, tmp_path / "out")
    assert check_data_settings(data, 3, 1, {"0": "background", "1": "anterior", "2": "posterior"})  # case is free
    with pytest.raises(
        ValueError,
        match=rf"^num_classes = 5 is not valid: {task / 'dataset.json'} describes 3 classes "
        r".*; pass --num_classes 3",
    ):
        check_data_settings(data, 5, 1, None)
    with pytest.raises(
        ValueError,
        match=r"^in_channels = 2 is not valid: .* describes 1 input channel\(s\) \(MRI\); "
        r"pass --in_channels 1",
    ):
        check_data_settings(data, 3, 2, None)
    with pytest.raises(
        ValueError,
        match=r"^label_names = .* names its classes .*; pass --label_names "
        r"'\{\"0\": \"background\", \"1\": \"Anterior\", \"2\": \"Posterior\"\}'",
    ):
        check_data_settings(data, 3, 1, {"0": "background", "1": "liver", "2": "spleen"})


# ------------------------------------------------------------------------------------------------- error lines


def test_error_line_is_the_innermost_message_with_the_failing_config_id():
    parser = ConfigParser(
        {
            "imports": ["$import calib_monai"],
            "num_classes": 3,
            "loss": {"_target_": "calib_monai.losses.NACLLoss", "classes": "@num_classes", "dim": 2, "alpha": -1.0},
        }
    )
    with pytest.raises(RuntimeError) as err:  # MONAI: "Failed to instantiate component ..."
        parser.get_parsed_content("loss")
    assert error_line(err.value) == (
        "loss (calib_monai.losses.NACLLoss): alpha must be a finite number >= 0 (the "
        "weight lambda of the neighbour penalty; the papers use 0.1), got -1.0."
    )
    assert error_line(KeyError("plain")) == "KeyError: plain"  # not ours: the type stays in front


def test_every_generated_config_checks_its_settings_and_reports_errors_in_one_line():
    """The check runs in every bundle's workflows: initialize reports errors and checks the settings; every step
    that reads data first checks the classes and channels against the data set."""
    data_steps = {
        "train.json": ("run",),
        "evaluate.json": ("run", "evaluating"),
        "calibrate.json": ("run", "calibrate"),
        "multi_gpu_train.json": ("run",),
        "inference.json": ("run", "inferring"),
    }
    for name in bundle_names():
        for config, steps in data_steps.items():
            content = json.loads((REPO / "bundles" / name / "configs" / config).read_text())
            initialize = content["initialize"]
            assert initialize[0] == "$calib_monai.bundle.report_errors()", (name, config)
            assert any(s.startswith("$calib_monai.bundle.check_settings(") for s in initialize), (name, config)
            for step in steps:
                runs = content[step] if content[step] != "@run" else content["run"]  # a run id that reuses run
                assert runs[0].startswith("$calib_monai.bundle.check_data_settings(@data,"), (name, step)


def test_the_error_report_is_installed_in_bundle_runs_only():
    """A program that runs a ConfigWorkflow itself (as these tests do) keeps its exceptions; monai.bundle runs (above)
    and ``force`` get the one-line report."""
    from calib_monai.bundle import report_errors

    before = sys.excepthook
    assert report_errors() and sys.excepthook is before  # pytest is not `python -m monai.bundle run`
    try:
        assert report_errors(force=True) and sys.excepthook is not before
    finally:
        report_errors(enabled=False)
    assert sys.excepthook is before


def test_the_settings_a_resumed_training_must_share_are_recorded_and_compared():
    """What ``TrainingCheckpoint`` stores and compares (``tests/test_bad_inputs.py`` resumes real runs)."""
    from calib_monai.bundle.runtime import resume_changes_allowed, run_settings, settings_differences

    check_settings(argv=_argv("--lr", "0.003", "--loss#alpha", "0.2", "--output_dir", "/tmp/x"), lr=0.003, epochs=2)
    recorded = run_settings()
    assert recorded == {"lr": 0.003, "loss#alpha": 0.2} and not resume_changes_allowed()  # no paths, no epochs
    check_settings(argv=_argv("--lr", "0.0003", "--resume_changes", "allow"), lr=0.0003, epochs=5)
    assert resume_changes_allowed()
    # the key this command leaves out has the config file's value
    assert settings_differences(recorded) == [("loss#alpha", 0.2, 0.1), ("lr", 0.003, 0.0003)]
    with pytest.raises(ValueError, match="resume_changes = 'yes' is not valid: pass --resume_changes allow"):
        check_settings(argv=_argv("--resume_changes", "yes"))
