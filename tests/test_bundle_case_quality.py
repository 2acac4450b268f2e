"""The case quality end to end on nacl_flare's tiny phantoms: calibrate stores the validated range, inferring and
TrainedBundle write the estimate and review flag, evaluating reports the estimate beside the truth."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
from monai.bundle import ConfigWorkflow

from calib_monai.bundle import TrainedBundle
from calib_monai.calibration import ValidatedRange, load_validated_range, review_case
from calib_monai.metrics import case_quality
from conftest import REPO_ROOT, run_bundle_workflow

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
CONFIGS = REPO_ROOT / "bundles" / "nacl_flare" / "configs"
TINY = {"roi_size": [32, 32, 8], "batch_size": 8, "data#num_phantoms": 10, "data#spacing": [12.0, 12.0, 30.0]}


def _workflow(configs: list[str], run_id: str, **overrides) -> ConfigWorkflow:
    return run_bundle_workflow(CONFIGS, configs, run_id, **overrides)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A bundle folder trained for 2 epochs on six tiny phantoms, then calibrated."""
    root = tmp_path_factory.mktemp("quality")
    shutil.copytree(CONFIGS, root / "bundle" / "configs")
    overrides = {**TINY, "output_dir": str(root / "bundle" / "models"), "data#cache_dir": str(root / "phantoms")}
    _workflow(["train.json"], "run", epochs=2, **overrides)
    _workflow(["train.json", "calibrate.json"], "calibrate", **overrides)
    return root, overrides


def test_calibrate_stores_the_validation_case_scores(calibrated):
    root, _ = calibrated
    models = root / "bundle" / "models"
    record = json.loads((models / "validated_range.json").read_text())
    datalist = json.loads((models / "datalist.json").read_text())
    assert len(record["scores"]) == len(datalist["validation"]) and record["alpha"] == 0.05
    assert set(record["volumes"]) == {"liver", "kidney", "spleen", "pancreas"}
    # the bundles' default recalibration, and where it was fitted
    assert record["info"]["calibration"]["method"] == "local_temperature" and "weights_sha256" in record
    assert record["info"]["fitted_on"] == "all voxels of the validation slices"
    validated = load_validated_range(models, models / "model.pt")
    assert validated.scores == pytest.approx(record["scores"])
    # another model.pt: the range is not applied, and inference says why
    assert load_validated_range(models, models / "datalist.json") is None


def test_inferring_writes_quality_beside_the_images(calibrated, tmp_path):
    root, overrides = calibrated
    images = sorted((root / "phantoms").rglob("imagesTr/*.nii.gz"))[:2]
    settings = {"roi_size": overrides["roi_size"], "data#spacing": overrides["data#spacing"]}
    workflow = ConfigWorkflow(
        config_file=str(root / "bundle" / "configs" / "inference.json"),
        workflow_type="infer",
        logging_file=False,
        dataset_dir=str(images[0].parent),
        output_dir=str(tmp_path),
        bundle_root=str(root / "bundle"),
        **settings,
    )
    workflow.initialize()
    workflow.run()
    with open(tmp_path / "quality.csv") as f:
        rows = {r["case"]: r for r in csv.DictReader(f)}
    cases = {p.name[: -len(".nii.gz")] for p in images[0].parent.glob("*.nii.gz")}
    assert set(rows) == cases and {"case_score", "review", "est_dice_liver", "volume_ml_kidney"} <= set(
        rows[next(iter(cases))]
    )
    case = sorted(cases)[0]
    written = json.loads((tmp_path / f"{case}_quality.json").read_text())
    assert written["case"] == case and written["review"]["flag"] in (True, False)
    assert float(rows[case]["case_score"]) == pytest.approx(written["case_score"])
    # TrainedBundle.predict gives the same numbers in memory
    bundle = TrainedBundle(root / "bundle", overrides=settings)
    segmentation, confidence, quality = bundle.predict(images[0].parent / f"{case}.nii.gz")
    assert quality["case_score"] == pytest.approx(written["case_score"], rel=1e-6)
    assert quality["review"] == written["review"]
    # the numbers are case_quality's on the calibrated probabilities of the network's grid
    assert set(quality["classes"]) == {"liver", "kidney", "spleen", "pancreas"}
    for entry in quality["classes"].values():
        assert entry["volume_low"] <= entry["volume"] <= entry["volume_high"]


def test_without_a_validated_range_the_flag_says_why(calibrated, tmp_path):
    root, overrides = calibrated
    models = root / "bundle" / "models"
    image = sorted((root / "phantoms").rglob("imagesTr/*.nii.gz"))[0]
    settings = {"roi_size": overrides["roi_size"], "data#spacing": overrides["data#spacing"]}
    (models / "validated_range.json").rename(tmp_path / "range.json")
    try:
        quality = TrainedBundle(root / "bundle", overrides=settings).predict(image).quality
    finally:
        (tmp_path / "range.json").rename(models / "validated_range.json")
    assert quality["review"]["flag"] is None and "calibrate step" in quality["review"]["reasons"][0]


def test_evaluating_reports_the_estimate_beside_the_truth(calibrated, tmp_path):
    root, overrides = calibrated
    _workflow(["train.json", "evaluate.json"], "evaluating", **overrides, eval_dir=str(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"est_dice_liver", "est_mean_dice", "ece_all", "ece_band", "volume_prob_kidney"} <= set(rows[0])
    assert summary["case_quality"]["estimate"]["cases"] <= len(rows)
    assert (tmp_path / "risk_coverage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_review_rule_by_hand():
    # 19 validation scores 0.60..0.96: alpha 0.05 -> k = floor(0.05 * 20) = 1, the lowest (0.60)
    validated = ValidatedRange([0.60 + 0.02 * i for i in range(19)], {"a": [1.0, 2.0]}, alpha=0.05)
    assert validated.rank == 1 and validated.score_threshold == pytest.approx(0.60)
    ok = {"case_score": 0.61, "classes": {"a": {"volume": 9.0}}}
    low = {"case_score": 0.59, "classes": {"a": {"volume": 1.5}}}
    assert validated.check(ok)["flag"] is False
    verdict = validated.check(low)
    assert verdict["flag"] is True and "below the validated range (0.600, the 1st lowest of 19" in verdict["reasons"][0]
    # alpha 0.2 with 19 scores: k = 4, the 4th lowest (0.66)
    assert ValidatedRange(validated.scores, alpha=0.2).score_threshold == pytest.approx(0.66)
    # the volume rule: outside [1 / 2, 2 * 2] mL with factor 2
    by_volume = ValidatedRange(validated.scores, {"a": [1.0, 2.0]}, volume_factor=2.0)
    assert by_volume.check(ok)["flag"] is True and "a volume 9 mL is outside" in by_volume.check(ok)["reasons"][0]
    assert by_volume.check({"case_score": 0.9, "classes": {"a": {"volume": 3.9}}})["flag"] is False
    with pytest.raises(ValueError, match="alpha"):
        ValidatedRange([0.5], alpha=1.5)
    # a quality straight from the probabilities: all background, so no structure is predicted: score 0, flagged
    prob = torch.zeros(2, 4, 4)
    prob[0] = 0.99
    prob[1] = 0.01
    assert review_case(case_quality(prob, class_names=["bg", "a"]), validated)["review"]["flag"] is True
