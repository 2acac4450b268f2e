"""nacl_flare's calibrate step on tiny phantoms, and evaluate / inference / export applying what it fitted."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch
from monai.bundle import ConfigWorkflow

from calib_monai.bundle import TrainedBundle
from calib_monai.export import SegmentationWithConfidence, export_bundle
from calib_monai.recalibration import load_calibration
from calib_monai.recalibration.stored import NOT_APPLICABLE
from conftest import REPO_ROOT, run_bundle_workflow

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
BUNDLE = REPO_ROOT / "bundles" / "nacl_flare"
CONFIGS = BUNDLE / "configs"
TINY = {"roi_size": [32, 32, 8], "batch_size": 8, "data#num_phantoms": 6, "data#spacing": [12.0, 12.0, 30.0]}


def _workflow(configs: list[str], run_id: str, **overrides) -> ConfigWorkflow:
    return run_bundle_workflow(CONFIGS, configs, run_id, **overrides)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A bundle folder (configs + models) trained for 2 epochs on six tiny phantoms, then calibrated."""
    root = tmp_path_factory.mktemp("calibrate")
    shutil.copytree(CONFIGS, root / "bundle" / "configs")
    overrides = {**TINY, "output_dir": str(root / "bundle" / "models"), "data#cache_dir": str(root / "phantoms")}
    _workflow(["train.json"], "run", epochs=2, **overrides)
    # one temperature (the bundles' default is local temperature: tests/test_bundle_case_quality.py runs it)
    _workflow(["train.json", "calibrate.json"], "calibrate", **overrides, calibration_method="temperature")
    return root, overrides


def _metrics(workflow: ConfigWorkflow) -> dict:
    return workflow.parser.get_parsed_content("validate#evaluator").state.metrics


def test_calibrate_writes_a_temperature_fitted_on_the_validation_volumes(calibrated):
    root, _ = calibrated
    models = root / "bundle" / "models"
    record = json.loads((models / "calibration.json").read_text())
    datalist = json.loads((models / "datalist.json").read_text())
    assert (
        record["method"] == "temperature" and record["fitted_on"] == "ground-truth foreground of the validation volumes"
    )
    assert record["temperature"] > 0
    # one validation volume: it both fits and measures the range, and the record says so (in-sample numbers only)
    assert len(datalist["validation"]) == record["volumes"] == 1 and record["split"]["in_sample"]
    assert record["split"]["fit_volumes"] == record["split"]["range_volumes"]
    assert "range_volumes_nll_after" not in record
    assert record["in_sample_nll_after"] <= record["in_sample_nll_before"] + 1e-9  # what the temperature minimises
    assert float(load_calibration(models, models / "model.pt").temperature) == pytest.approx(record["temperature"])


def test_evaluate_reports_ece_before_and_after_with_the_same_segmentation(calibrated, tmp_path):
    root, overrides = calibrated
    with_calibration = _metrics(
        _workflow(["train.json", "evaluate.json"], "evaluating", **overrides, eval_dir=str(tmp_path / "a"))
    )
    # the same evaluation asking for the network's own probabilities: its ECE is the "uncalibrated" one above
    without = _metrics(
        _workflow(
            ["train.json", "evaluate.json"],
            "evaluating",
            **overrides,
            eval_dir=str(tmp_path / "b"),
            calibration_path="none",
        )
    )
    # without the recalibration the range (measured on recalibrated probabilities) does not apply, as in inferring
    with open(tmp_path / "b" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["review_flag"] == "" and r["review_reasons"] == NOT_APPLICABLE for r in rows)
    with open(tmp_path / "a" / "metrics.csv") as f:
        assert all(
            r["review_flag"] in ("yes", "no", "") and r["review_reasons"] != NOT_APPLICABLE for r in csv.DictReader(f)
        )
    assert with_calibration["test_mean_dice"] == pytest.approx(without["test_mean_dice"], abs=1e-9)
    assert with_calibration["test_ece_uncalibrated"] == pytest.approx(without["test_ece"], abs=1e-9)
    assert without["test_ece_uncalibrated"] == pytest.approx(without["test_ece"], abs=1e-9)
    assert with_calibration["test_ece"] != pytest.approx(with_calibration["test_ece_uncalibrated"], abs=1e-6)


def test_inference_and_export_apply_the_temperature(calibrated, tmp_path):
    root, overrides = calibrated
    bundle_dir, models = root / "bundle", root / "bundle" / "models"
    temperature = float(load_calibration(models).temperature)
    image = sorted((root / "phantoms").rglob("imagesTr/*.nii.gz"))[0]
    settings = {"roi_size": overrides["roi_size"], "data#spacing": overrides["data#spacing"]}
    calibrated_seg, calibrated_conf, _ = TrainedBundle(bundle_dir, overrides=settings).predict(image)
    raw = TrainedBundle(bundle_dir, overrides={**settings, "calibration_path": "none"})
    raw_seg, raw_conf, _ = raw.predict(image)
    assert torch.equal(calibrated_seg, raw_seg)
    assert not torch.allclose(calibrated_conf, raw_conf, atol=1e-4)
    # the exported module equals the eager network with the temperature, and differs from it without
    paths = export_bundle(bundle_dir, output_dir=tmp_path / "export", example_shape=(1, 1, 32, 32, 2))
    exported = torch.jit.load(paths["segmentation_confidence.ts"])
    network = TrainedBundle(bundle_dir, ("train.json",), device="cpu").network
    x = torch.rand(1, 1, 32, 32, 5, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        seg, conf = exported(x)
        slices = x.movedim(4, 1).reshape(5, 1, 32, 32)
        prob = torch.softmax(network(slices) / temperature, 1).reshape(1, 5, -1, 32, 32).movedim(1, 4)
        raw = SegmentationWithConfidence(network)(x)
    np.testing.assert_allclose(conf.numpy(), prob.max(1, keepdim=True).values.numpy(), atol=1e-5)
    assert torch.equal(seg, raw[0]) and not torch.allclose(conf, raw[1], atol=1e-4)
