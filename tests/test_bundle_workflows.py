"""nacl_flare's other configs on tiny phantoms: evaluate.json, inference.json, the amp switch and data loading with
worker processes. multi_gpu_train.json (2 gloo ranks under torchrun) is tested in test_multi_gpu.py."""

from __future__ import annotations

import csv
import json
import os

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.bundle import ConfigParser, ConfigWorkflow
from monai.data import MetaTensor

from conftest import REPO_ROOT

CONFIGS = REPO_ROOT / "bundles" / "nacl_flare" / "configs"
TINY = {"roi_size": [32, 32, 8], "batch_size": 8, "data#num_phantoms": 6, "data#spacing": [12.0, 12.0, 30.0]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One epoch of nacl_flare on six tiny phantoms: (output folder, phantom cache)."""
    root = tmp_path_factory.mktemp("nacl_flare")
    overrides = {**TINY, "epochs": 1, "output_dir": str(root / "models"), "data#cache_dir": str(root / "phantoms")}
    workflow = ConfigWorkflow(
        config_file=str(CONFIGS / "train.json"), workflow_type="train", logging_file=False, **overrides
    )
    workflow.initialize()
    workflow.run()
    return root, overrides


def test_evaluate_writes_per_volume_metrics(trained):
    root, overrides = trained
    workflow = ConfigWorkflow(
        config_file=[str(CONFIGS / "train.json"), str(CONFIGS / "evaluate.json")],
        workflow_type="train",
        run_id="evaluating",
        logging_file=False,
        **overrides,
        eval_dir=str(root / "eval"),
    )
    workflow.initialize()
    workflow.run()
    datalist = json.loads((root / "models" / "datalist.json").read_text())
    with open(root / "eval" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(datalist["test"])
    tested = {os.path.basename(item["image"]) for item in datalist["test"]}
    assert {row["case"] for row in rows} == tested  # the test split, not the validation one
    for row in rows:
        assert 0.0 <= float(row["dice_liver"]) <= 1.0 and 0.0 <= float(row["ece"]) <= 1.0
    summary = json.loads((root / "eval" / "summary.json").read_text())
    assert summary["metrics"]["mean_dice"]["volumes"] == len(rows)
    assert (root / "eval" / "reliability.png").is_file()


def test_inference_writes_segmentation_and_confidence_in_the_input_geometry(trained, tmp_path):
    root, overrides = trained
    image_path = sorted((root / "phantoms").rglob("imagesTr/*.nii.gz"))[0]
    workflow = ConfigWorkflow(
        config_file=str(CONFIGS / "inference.json"),
        workflow_type="infer",
        run_id="inferring",
        logging_file=False,
        dataset_dir=str(image_path),
        output_dir=str(tmp_path),
        model_path=str(root / "models" / "model.pt"),
        roi_size=overrides["roi_size"],
        **{"data#spacing": overrides["data#spacing"]},
    )
    workflow.initialize()
    workflow.run()
    source = nib.load(image_path)
    outputs = sorted(tmp_path.rglob("*.nii.gz"))
    seg = nib.load(next(p for p in outputs if "seg" in p.name))
    conf = nib.load(next(p for p in outputs if "conf" in p.name))
    for out in (seg, conf):
        assert out.shape[:3] == source.shape[:3]
        np.testing.assert_allclose(out.affine, source.affine, atol=1e-4)
    labels = np.unique(np.asarray(seg.dataobj))
    assert set(labels.tolist()) <= {0, 1, 2, 3, 4}
    confidence = np.asarray(conf.dataobj)
    assert confidence.min() >= 1 / 5 - 1e-4 and confidence.max() <= 1 + 1e-6  # max softmax of 5 classes


def _parser(config: str, **override) -> ConfigParser:
    parser = ConfigParser()
    parser.read_config(str(CONFIGS / config))
    parser.update({"bundle_root": str(CONFIGS.parent), **override})
    return parser


@pytest.mark.parametrize("amp, expected", [(None, False), ("true", True), ("false", False), (True, True)])
def test_amp_switch_reaches_the_trainer_and_the_evaluators(amp, expected, tmp_path):
    """``amp`` is off by default; ``--amp true`` (the string "true" from the command line) turns it on in the
    trainer, the validation evaluator and the inference evaluator alike."""
    override = {} if amp is None else {"amp": amp}
    assert json.loads((CONFIGS / "train.json").read_text())["amp"] is False
    no_data = {"train#dataset": "$[{}]", "validate#dataset": "$[{}]", "output_dir": str(tmp_path)}
    train = _parser("train.json", **no_data, **override)
    assert train.get_parsed_content("train#trainer").amp is expected
    assert train.get_parsed_content("validate#evaluator").amp is expected
    infer = _parser("inference.json", **{"dataset#data": "$[]", "output_dir": str(tmp_path)}, **override)
    assert infer.get_parsed_content("evaluator").amp is expected


def test_one_epoch_with_amp_on_the_cpu(tmp_path):
    """MONAI's engines autocast for CUDA only: on the CPU ``--amp true`` trains (in fp32) without an error."""
    overrides = {
        **TINY,
        "epochs": 1,
        "amp": "true",
        "output_dir": str(tmp_path / "models"),
        "data#cache_dir": str(tmp_path / "phantoms"),
    }
    workflow = ConfigWorkflow(
        config_file=str(CONFIGS / "train.json"), workflow_type="train", logging_file=False, **overrides
    )
    workflow.initialize()
    workflow.run()
    assert workflow.trainer.amp is True and workflow.trainer.state.epoch == 1
    metrics = workflow.parser.get_parsed_content("validate#evaluator").state.metrics
    assert 0.0 <= metrics["val_mean_dice"] <= 1.0 and 0.0 <= metrics["val_ece"] <= 1.0
    assert (tmp_path / "models" / "model.pt").is_file()


def test_data_loading_defaults_and_worker_processes(trained):
    """CPU: no workers and no pinned memory by default. With workers (as on CUDA), the training slices and the
    cached validation volumes (MetaTensors) come through the worker processes exactly as without them."""
    root, overrides = trained
    base = {**overrides, "output_dir": str(root / "models")}  # the split and phantoms of the fixture's run
    default = _parser("train.json", **base)
    assert default.get_parsed_content("num_workers") == 0 and default.get_parsed_content("pin_memory") is False
    loaders = {}
    for workers in (0, 2):
        parser = _parser("train.json", **base, num_workers=workers, **{"train#dataloader#shuffle": False})
        loaders[workers] = [parser.get_parsed_content(k) for k in ("train#dataloader", "validate#dataloader")]
    assert loaders[2][0].num_workers == 2 and loaders[2][0].persistent_workers
    for plain, workers in zip(loaders[0], loaders[2]):
        batches = list(zip(plain, workers, strict=True))
        assert batches
        for a, b in batches:
            for key in ("image", "label"):
                torch.testing.assert_close(torch.as_tensor(a[key]), torch.as_tensor(b[key]))
    volume = next(iter(loaders[2][1]))["image"]
    assert isinstance(volume, MetaTensor) and volume.meta["filename_or_obj"]  # the meta data survive the workers
