"""nacl_flare's other configs on tiny phantoms: evaluate.json, inference.json and multi_gpu_train.json (2 gloo ranks)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
from monai.bundle import ConfigWorkflow

from conftest import REPO_ROOT, free_port

CONFIGS = REPO_ROOT / "bundles" / "nacl_flare" / "configs"
TINY = {"roi_size": [32, 32, 8], "batch_size": 8, "data#num_phantoms": 6, "data#spacing": [12.0, 12.0, 30.0]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One epoch of nacl_flare on six tiny phantoms: (output folder, phantom cache)."""
    root = tmp_path_factory.mktemp("nacl_flare")
    overrides = {**TINY, "epochs": 1, "output_dir": str(root / "models"), "data#cache_dir": str(root / "phantoms")}
    workflow = ConfigWorkflow(config_file=str(CONFIGS / "train.json"), workflow_type="train", logging_file=False,
                              **overrides)  # fmt: skip
    workflow.initialize()
    workflow.run()
    return root, overrides


def test_evaluate_writes_per_volume_metrics(trained):
    root, overrides = trained
    workflow = ConfigWorkflow(
        config_file=[str(CONFIGS / "train.json"), str(CONFIGS / "evaluate.json")],
        workflow_type="train", run_id="evaluating", logging_file=False,
        **overrides, eval_dir=str(root / "eval"),
    )  # fmt: skip
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
        config_file=str(CONFIGS / "inference.json"), workflow_type="infer", run_id="inferring", logging_file=False,
        dataset_dir=str(image_path), output_dir=str(tmp_path), model_path=str(root / "models" / "model.pt"),
        roi_size=overrides["roi_size"], **{"data#spacing": overrides["data#spacing"]},
    )  # fmt: skip
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


def test_multi_gpu_config_trains_with_two_gloo_processes(tmp_path):
    configs = f"['{CONFIGS / 'train.json'}','{CONFIGS / 'multi_gpu_train.json'}']"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "monai.bundle", "run", "training", "--config_file", configs,
           "--epochs", "1", "--output_dir", str(tmp_path / "models"), "--data#cache_dir", str(tmp_path / "phantoms")]  # fmt: skip
    # 18 phantoms split 12/2/4: every rank gets a validation volume (DistributedSampler needs one per rank)
    for key, value in {**TINY, "data#num_phantoms": 18}.items():
        cmd += [f"--{key}", json.dumps(value)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert (tmp_path / "models" / "model.pt").is_file() and (tmp_path / "models" / "checkpoint_latest.pt").is_file()
    assert log.count("epoch 1/1") == 1  # one summary line: rank 0 reports, rank 1 trains silently
