"""The case quality end to end on nacl_flare's tiny phantoms: calibrate stores the validated range, inferring and
TrainedBundle write the estimate and review flag, evaluating reports the estimate beside the truth."""

from __future__ import annotations

import csv
import json
import logging
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.bundle import ConfigWorkflow

from calib_monai.bundle import TrainedBundle, output_paths
from calib_monai.bundle.errors import error_line
from calib_monai.bundle.manifest import file_sha256
from calib_monai.data.flare import FLARE22_TO_FLARE
from calib_monai.export import slicer_files_from_inference
from calib_monai.review import load_validated_range
from conftest import REPO_ROOT, run_bundle_workflow

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
CONFIGS = REPO_ROOT / "bundles" / "nacl_flare" / "configs"
# 10 phantoms split 4 / 4 / 2: four validation volumes, cross-fitted (halves of two, each scored by the fit on the
# other) and all four in the range; review_alpha 0.2 so that k = floor(0.2 * 5) = 1 (0.05 needs 19 volumes). The
# phantoms are 48 x 48 x 8 voxels of 8 x 8 x 30 mm, resampled to the network's grid of 32 x 32 x 8 at 12 x 12 x 30 mm,
# so the input grid (the delivered segmentation's) and the network's differ, as on real data
TINY = {
    "roi_size": [32, 32, 8],
    "batch_size": 8,
    "data#num_phantoms": 10,
    "data#split": [4, 4, 2],
    "data#spacing": [12.0, 12.0, 30.0],
    "data#phantom_shape": [48, 48, 8],
}
INPUT_SHAPE, INPUT_VOXEL_ML, NETWORK_VOXEL_ML = (48, 48, 8), 8 * 8 * 30 / 1000, 12 * 12 * 30 / 1000


def _workflow(configs: list[str], run_id: str, **overrides) -> ConfigWorkflow:
    return run_bundle_workflow(CONFIGS, configs, run_id, **overrides)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A bundle folder trained for 2 epochs on six tiny phantoms, then calibrated."""
    root = tmp_path_factory.mktemp("quality")
    shutil.copytree(CONFIGS, root / "bundle" / "configs")
    overrides = {**TINY, "output_dir": str(root / "bundle" / "models"), "data#cache_dir": str(root / "phantoms")}
    _workflow(["train.json"], "run", epochs=2, **overrides)
    # contour_alpha 0.2: j = floor(0.2 * 5) = 1 of the 4 validation volumes (0.1 needs 9)
    _workflow(["train.json", "calibrate.json"], "calibrate", review_alpha=0.2, contour_alpha=0.2, **overrides)
    return root, overrides


def test_calibrate_stores_the_validation_case_scores(calibrated):
    root, _ = calibrated
    models = root / "bundle" / "models"
    record = json.loads((models / "validated_range.json").read_text())
    datalist = json.loads((models / "datalist.json").read_text())
    split = record["info"]["split"]
    # cross-fitting: halves of two, each scored by the fit on the other; all four in the range, the served fit on all
    validation = sorted(Path(item["image"]).name for item in datalist["validation"])
    assert split["crossfit"] and sorted(split["range_volumes"]) == sorted(split["fit_volumes"]) == validation
    (first, second) = split["folds"]
    assert first["fit"] == second["scored"] and first["scored"] == second["fit"] and len(first["fit"]) == 2
    assert sorted(first["fit"] + first["scored"]) == validation and "approximate" in split["exchangeability"]
    assert len(record["scores"]) == len(record["inputs"]) == 4 and record["alpha"] == 0.2
    assert set(record["volumes"]) == {"liver", "kidney", "spleen", "pancreas"}
    # one rule over the three signals, k = 1 of n + 1 = 5: bound 1 / 5 = alpha
    assert record["signals"] == ["case_score", "input", "features"] and record["feature_check"]
    assert len(record["features"]["reference"]) == 4 and record["features"]["components"] is None
    assert record["rank"] == 1 and record["bound"] == pytest.approx(1 / 5) and record["bound_within_alpha"]
    # the input and feature signals measure against the training images (fixed references), the volume interval is
    # widened by a factor fitted on the range volumes, or left at independent voxels with why (too few pairs)
    training = len(datalist["training"])
    assert record["input_reference"]["images"] == record["feature_reference"]["images"] == training
    assert len(record["input_reference"]["mean"]) == len(record["inputs"][0]) == len(record["input_names"])
    # the intensity and the shading statistics each with their own precision (slope and curvature along 3 axes)
    assert len(record["input_reference"]["shading_precision"]) == 6 and "precision" in record["input_reference"]
    assert len(record["feature_reference"]["validation"]) == 4
    assert record["info"]["volume_interval"]["pairs"] == 4 * 4 and record["volume_interval_scale"] is None
    assert "too few for 95%" in record["info"]["volume_interval"]["note"]
    # each scored volume's case score minus the true DSC of its delivered segmentation, summed up
    error = record["info"]["case_score_error"]
    assert error["volumes"] == len(error["values"]) == 4
    assert error["mean"] == pytest.approx(np.mean(error["values"]), abs=1e-6)  # the values are stored to 6 decimals
    # what a case must lie beyond to be flagged (k = 1: the most extreme of the 4 validation volumes)
    bar = record["info"]["flag_bar"]
    assert bar["signal"] in record["signals"] and bar["z"] == max(v for v in bar["largest"].values() if v is not None)
    calibration = json.loads((models / "calibration.json").read_text())
    assert calibration["split"] == split and calibration["volumes"] == 4 and len(calibration["folds"]) == 2
    # local temperature scaling's early stopping and the held-out numbers, named so
    assert {"heldout_slices_nll_before", "heldout_slices_nll_after", "range_volumes_ece_after"} <= set(calibration)
    assert calibration["heldout_slices_nll_after"] <= calibration["heldout_slices_nll_before"]
    # the bundles' default recalibration, and where it was fitted
    assert record["info"]["calibration"]["method"] == "local_temperature" and "weights_sha256" in record
    assert record["info"]["fitted_on"] == "all voxels of the validation slices"
    validated = load_validated_range(models, models / "model.pt")
    assert validated.scores == pytest.approx(record["scores"])
    # another model.pt: the range is not applied, and inference says why
    assert load_validated_range(models, models / "datalist.json") is None


def test_inferring_writes_quality_beside_the_images(calibrated, tmp_path, caplog):
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
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        workflow.run()
    with open(tmp_path / "quality.csv") as f:
        rows = {r["case"]: r for r in csv.DictReader(f)}
    cases = {p.name[: -len(".nii.gz")] for p in images[0].parent.glob("*.nii.gz")}
    # the run's last line: what it wrote, where, and the flags its files hold
    flags = [json.loads((tmp_path / f"{c}_quality.json").read_text())["review"]["flag"] for c in cases]
    assert (
        caplog.records[-1]
        .getMessage()
        .startswith(
            f"wrote {len(cases)} cases to {tmp_path}: the review flagged {flags.count(True)} and could not judge "
            f"{flags.count(None)} (quality.csv)"
        )
    )
    assert set(rows) == cases and {"case_score", "review", "est_dice_liver", "volume_ml_kidney"} <= set(
        rows[next(iter(cases))]
    )
    case = sorted(cases)[0]
    written = json.loads((tmp_path / f"{case}_quality.json").read_text())
    assert written["case"] == case and written["review"]["flag"] in (True, False)
    # the features of the network that ran: the feature signal judged, nothing left out
    assert (
        set(written["review"]["signals"]) == {"case_score", "input", "features"} and not written["review"]["left_out"]
    )
    assert float(rows[case]["case_score"]) == pytest.approx(written["case_score"])
    # TrainedBundle.predict gives the same numbers in memory
    bundle = TrainedBundle(root / "bundle", overrides=settings)
    segmentation, confidence, quality = bundle.predict(images[0].parent / f"{case}.nii.gz")
    assert quality["case_score"] == pytest.approx(written["case_score"], rel=1e-6)
    _assert_same_review(quality["review"], written["review"])
    # delivered on the input grid (48 x 48 x 8 of 1.92 mL), scored on the network's (32 x 32 x 8 of 4.32 mL), whose
    # labels the delivered segmentation carries: each network voxel is the nearest of 1 or 2 input voxels along x and
    # y (8 mm against 12 mm) and of 1 along z, so a class's delivered voxels number 1 to 4 times its network voxels
    assert tuple(segmentation.shape[1:]) == INPUT_SHAPE and quality["voxel_volume"] == pytest.approx(NETWORK_VOXEL_ML)
    assert set(quality["classes"]) == {"liver", "kidney", "spleen", "pancreas"}
    predicted = {name: q["volume_predicted"] for name, q in quality["classes"].items()}
    for c, name in enumerate(["liver", "kidney", "spleen", "pancreas"], start=1):
        voxels, delivered = round(predicted[name] / NETWORK_VOXEL_ML), int((segmentation == c).sum())
        assert predicted[name] == pytest.approx(voxels * NETWORK_VOXEL_ML)  # whole network voxels
        assert voxels <= delivered <= 4 * voxels
    for entry in quality["classes"].values():
        assert entry["volume_low"] <= entry["volume"] <= entry["volume_high"]


def _assert_same_review(served: dict, written: dict) -> None:
    """The same verdict: flag, rank, reasons and signal ranks equal, the signals' values up to float noise (on a GPU
    a second run sums in another order: 12th digit)."""
    assert {k: v for k, v in served.items() if k != "signals"} == {k: v for k, v in written.items() if k != "signals"}
    assert served["signals"].keys() == written["signals"].keys()
    for name, signal in written["signals"].items():
        expected = {k: pytest.approx(v, rel=1e-9) if isinstance(v, float) else v for k, v in signal.items()}
        assert served["signals"][name] == expected, name


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
    assert quality["review"]["reasons"][0].startswith("cannot judge: no validated range at ")


def test_evaluating_reports_the_estimate_beside_the_truth(calibrated, tmp_path):
    root, overrides = calibrated
    _workflow(["train.json", "evaluate.json"], "evaluating", **overrides, eval_dir=str(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"est_dice_liver", "est_mean_dice", "ece_all", "ece_band", "volume_prob_kidney"} <= set(rows[0])
    assert summary["case_quality"]["estimate"]["cases"] <= len(rows)
    assert (tmp_path / "risk_coverage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluating_and_inferring_give_the_same_scores_and_flags(calibrated, tmp_path):
    """One path: the test volumes through ``inferring`` (images only) and through ``evaluating`` (with their labels)
    get the same case score and the same review flag; evaluating writes the flag beside the true DSC."""
    root, overrides = calibrated
    datalist = json.loads((root / "bundle" / "models" / "datalist.json").read_text())
    images = tmp_path / "images"
    images.mkdir()
    for item in datalist["test"]:
        (images / Path(item["image"]).name).symlink_to(item["image"])
    settings = {k: overrides[k] for k in ("roi_size", "batch_size", "data#spacing")}
    workflow = ConfigWorkflow(
        config_file=str(root / "bundle" / "configs" / "inference.json"),
        workflow_type="infer",
        logging_file=False,
        dataset_dir=str(images),
        output_dir=str(tmp_path / "inferred"),
        bundle_root=str(root / "bundle"),
        **settings,
    )
    workflow.initialize()
    workflow.run()
    _workflow(["train.json", "evaluate.json"], "evaluating", **overrides, eval_dir=str(tmp_path / "eval"))
    with open(tmp_path / "inferred" / "quality.csv") as f:
        served = {r["case"]: r for r in csv.DictReader(f)}
    with open(tmp_path / "eval" / "metrics.csv") as f:
        evaluated = {r["case"][: -len(".nii.gz")]: r for r in csv.DictReader(f)}
    assert set(served) == set(evaluated) and len(served) == 2
    mapping = FLARE22_TO_FLARE  # the phantoms' label values, as the data component maps them
    labels = {Path(item["image"]).name[: -len(".nii.gz")]: item["label"] for item in datalist["test"]}
    for case, row in evaluated.items():
        assert float(row["served_case_score"]) == pytest.approx(float(served[case]["case_score"]), abs=1e-5)
        assert row["review_flag"] == served[case]["review"] and row["review_flag"] in ("yes", "no", "")
        assert row["review_reasons"] == served[case]["reasons"]
        # the truth beside the flag: the DSC of the segmentation inferring wrote, against the label file, by hand
        segmentation = np.asarray(nib.load(tmp_path / "inferred" / f"{case}_seg.nii.gz").dataobj)
        label = np.vectorize(mapping.get)(np.asarray(nib.load(labels[case]).dataobj).astype(int))
        assert segmentation.shape == label.shape == INPUT_SHAPE
        dice = [
            2 * np.sum((segmentation == c) & (label == c)) / (np.sum(segmentation == c) + np.sum(label == c))
            for c in range(1, 5)
            if np.any(label == c)
        ]
        assert float(row["delivered_mean_dice"]) == pytest.approx(np.mean(dice), abs=1e-9)
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    review = summary["review"]
    assert sum(review[k]["volumes"] for k in ("flagged", "passed", "not_judged")) == 2
    assert review["bound"] == pytest.approx(1 / 5) and review["validation_volumes"] == 4


def test_the_range_is_scored_as_inferring_scores_a_case(calibrated, tmp_path):
    """One path from validation to serving: with the recalibration fitted in-sample (the range's scorer is then the
    served one), each validation image served by ``TrainedBundle.predict`` gets the case score and expected volumes
    the range stored for it, both measured on the network's grid."""
    root, overrides = calibrated
    bundle = tmp_path / "bundle"
    shutil.copytree(root / "bundle" / "configs", bundle / "configs")
    (bundle / "models").mkdir()
    for name in ("model.pt", "datalist.json"):
        shutil.copy(root / "bundle" / "models" / name, bundle / "models" / name)
    settings = {**overrides, "output_dir": str(bundle / "models")}
    run = {"calibration_crossfit": False, "calibration_split": 0.0, "review_alpha": 0.2}
    _workflow(["train.json", "calibrate.json"], "calibrate", **run, **settings)
    record = json.loads((bundle / "models" / "validated_range.json").read_text())
    assert record["scored_on"] == "network grid" and record["info"]["split"]["in_sample"]
    served = TrainedBundle(bundle, overrides={k: overrides[k] for k in ("roi_size", "data#spacing")})
    datalist = json.loads((bundle / "models" / "datalist.json").read_text())
    images = {Path(item["image"]).name: item["image"] for item in datalist["validation"]}
    order = record["info"]["split"]["range_volumes"]
    assert sorted(order) == sorted(images)
    for i, name in enumerate(order):
        segmentation, _, quality = served.predict(images[name])
        assert tuple(segmentation.shape[1:]) == INPUT_SHAPE
        assert quality["level"]["raw_case_score"] == pytest.approx(record["scores"][i], abs=1e-5)
        # served at the range's level: minus the validation volumes' mean error, which calibrate stored
        level = float(np.mean(record["info"]["case_score_error"]["values"]))
        assert quality["case_score"] == pytest.approx(min(1.0, max(0.0, record["scores"][i] - level)), abs=1e-5)
        for organ, volumes in record["volumes"].items():
            assert quality["classes"][organ]["volume"] == pytest.approx(volumes[i], rel=1e-4)


def test_a_range_scored_on_the_input_grid_is_refused_in_one_line(calibrated, tmp_path):
    """A range an earlier calibrate scored on the input grid: serving scores a case on the network grid, so the range
    is refused in one line that names the file and says to run calibrate again."""
    root, overrides = calibrated
    bundle = tmp_path / "bundle"
    shutil.copytree(root / "bundle", bundle)
    path, manifest = bundle / "models" / "validated_range.json", bundle / "models" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "scored_on": "input grid"}))
    record = json.loads(manifest.read_text())  # published as one set, as that calibrate published it
    record["artifacts"]["validated_range.json"]["sha256"] = file_sha256(path)
    manifest.write_text(json.dumps(record))
    with pytest.raises(RuntimeError) as error:  # MONAI's "Failed to instantiate": the line the user sees is ours
        TrainedBundle(bundle, overrides={k: overrides[k] for k in ("roi_size", "data#spacing")}).predict(
            sorted((root / "phantoms").rglob("imagesTr/*.nii.gz"))[0]
        )
    message = error_line(error.value)
    assert "\n" not in message and str(path) in message and "scored_on is 'input grid'" in message
    assert message.endswith("run the bundle's calibrate step again")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (MONAI Label serves on one)")
def test_the_served_verdict_on_cuda_is_the_cpus(calibrated):
    """The serving path on a GPU: the same weights, recalibration and range give each case the segmentation,
    confidence, case score and review verdict they get on the CPU (up to float differences of the convolutions)."""
    root, overrides = calibrated
    settings = {"roi_size": overrides["roi_size"], "data#spacing": overrides["data#spacing"]}
    cpu = TrainedBundle(root / "bundle", overrides=settings, device="cpu")
    gpu = TrainedBundle(root / "bundle", overrides=settings, device="cuda")
    assert gpu.device.type == "cuda"
    for image in sorted((root / "phantoms").rglob("imagesTr/*.nii.gz"))[:4]:
        on_cpu, on_gpu = cpu.predict(image), gpu.predict(image)
        differ = float((on_cpu.segmentation != on_gpu.segmentation.cpu()).float().mean())
        gap = float((on_cpu.confidence - on_gpu.confidence.cpu()).abs().max())
        print(f"{image.name}: labels differ on {differ:.2e} of voxels, max |confidence gap| {gap:.1e}")
        assert differ < 1e-3 and gap < 1e-2
        a, b = on_cpu.quality, on_gpu.quality
        assert b["case_score"] == pytest.approx(a["case_score"], abs=2e-3)
        assert (b["review"]["flag"], b["review"]["rank"]) == (a["review"]["flag"], a["review"]["rank"])
        assert set(b["review"]["signals"]) == set(a["review"]["signals"]) == {"case_score", "input", "features"}
        for name, signal in a["review"]["signals"].items():
            assert b["review"]["signals"][name]["value"] == pytest.approx(signal["value"], rel=1e-2, abs=1e-3), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (MONAI Label serves on one)")
def test_the_served_features_on_cuda_are_the_cpus(calibrated):
    """Next Sample's pooled features, captured while MONAI Label serves on a GPU: a host NumPy vector, equal to the
    CPU's up to float differences of the convolutions."""
    from calib_monai.label.serving import ServedBundle

    root, overrides = calibrated
    settings = {"roi_size": overrides["roi_size"], "data#spacing": overrides["data#spacing"]}
    cpu, gpu = ServedBundle(root / "bundle", device="cpu"), ServedBundle(root / "bundle", device="cuda")
    for served in (cpu, gpu):
        served.bundle.parser.update(settings)
    for image in sorted((root / "phantoms").rglob("imagesTr/*.nii.gz"))[:2]:
        on_cpu, on_gpu = cpu.predict(str(image)), gpu.predict(str(image))
        assert isinstance(on_gpu.features, np.ndarray) and on_gpu.features.shape == on_cpu.features.shape
        gap = float(np.abs(on_gpu.features - on_cpu.features).max())
        print(f"{image.name}: max |feature gap| {gap:.1e} over {on_cpu.features.size} features")
        np.testing.assert_allclose(on_gpu.features, on_cpu.features, rtol=1e-2, atol=1e-3)  # TF32 convolutions


def test_calibrate_chooses_the_contours_and_inferring_writes_them(calibrated, tmp_path):
    """contours.json beside the weights (issue 49): per structure the conformal lambdas of the 4 cross-fitted
    validation volumes; inferring writes each case's inner and outer contours and their volumes."""
    root, overrides = calibrated
    models = root / "bundle" / "models"
    record = json.loads((models / "contours.json").read_text())
    manifest = json.loads((models / "manifest.json").read_text())
    assert record["weights_sha256"] == manifest["weights"]["sha256"] and "contours.json" in manifest["artifacts"]
    assert (record["alpha"], record["epsilon"], record["risk"]) == (0.2, 0.02, "per_case")
    assert record["info"]["scored_volumes"] == 4 and record["info"]["scored_on"] == "network grid"
    for entry in record["classes"].values():  # j = 1, k = 4 of m = 4: the smallest l_out, the largest l_in
        assert entry["subjects"] == 4 and entry["rank"] == 4
        assert entry["lambda_out"] == min(entry["required_out"]) and entry["lambda_in"] == max(entry["required_in"])
    image = sorted((root / "phantoms").rglob("imagesTr/*.nii.gz"))[0]
    (tmp_path / "in").mkdir()
    shutil.copy(image, tmp_path / "in" / image.name)
    workflow = ConfigWorkflow(
        config_file=str(root / "bundle" / "configs" / "inference.json"),
        workflow_type="infer",
        logging_file=False,
        dataset_dir=str(tmp_path / "in"),
        output_dir=str(tmp_path / "out"),
        bundle_root=str(root / "bundle"),
        roi_size=overrides["roi_size"],
        **{"data#spacing": overrides["data#spacing"]},
    )
    workflow.initialize()
    workflow.run()
    case = image.name[: -len(".nii.gz")]
    out = tmp_path / "out"
    segmentation = np.asarray(nib.load(str(out / f"{case}_seg.nii.gz")).dataobj)
    inner = np.asarray(nib.load(str(out / f"{case}_inner.nii.gz")).dataobj)
    outer = np.asarray(nib.load(str(out / f"{case}_outer.nii.gz")).dataobj)
    assert inner.shape == outer.shape == (*INPUT_SHAPE, 4) and inner.dtype == outer.dtype == np.uint8
    quality = json.loads((out / f"{case}_quality.json").read_text())
    contours = quality["contours"]
    assert (contours["alpha"], contours["epsilon"]) == (0.2, 0.02)
    for c, name in enumerate(["liver", "kidney", "spleen", "pancreas"], start=1):
        predicted = segmentation == c
        assert np.all(inner[..., c - 1] <= predicted) and np.all(predicted <= outer[..., c - 1])  # nested
        entry = contours["classes"][name]
        assert entry["lambda_out"] == record["classes"][name]["lambda_out"]
        # made on the network grid (4.32 mL voxels), each of its voxels delivered as 1 to 4 input voxels (nearest)
        for kind, delivered in (("predicted", predicted), ("inner", inner[..., c - 1]), ("outer", outer[..., c - 1])):
            voxels = round(entry[f"{kind}_ml"] / NETWORK_VOXEL_ML)
            assert entry[f"{kind}_ml"] == pytest.approx(voxels * NETWORK_VOXEL_ML)
            assert voxels <= int(delivered.sum()) <= 4 * voxels
    flag = quality["review"]["flag"]
    assert contours["vouched"] is (None if flag is None else not flag)
    if flag:
        assert contours["reason"].startswith("not vouched for: the case lies outside what validation measured")
    with open(out / "quality.csv") as f:
        row = next(csv.DictReader(f))
    assert float(row["outer_ml_liver"]) == pytest.approx(contours["classes"]["liver"]["outer_ml"])

    # TrainedBundle.predict gives the same contours in memory, on the input's grid, and write writes them as inferring
    bundle = TrainedBundle(root / "bundle", overrides={k: overrides[k] for k in ("roi_size", "data#spacing")})
    prediction = bundle.predict(tmp_path / "in" / image.name)
    assert prediction.contours["inner"].shape == prediction.contours["outer"].shape == (4, *INPUT_SHAPE)
    assert prediction.contours["inner"].dtype == torch.uint8
    np.testing.assert_array_equal(np.moveaxis(prediction.contours["inner"].numpy(), 0, -1), inner)
    np.testing.assert_array_equal(np.moveaxis(prediction.contours["outer"].numpy(), 0, -1), outer)
    assert prediction.quality["contours"]["classes"] == contours["classes"]
    written = bundle.write(*prediction, output_dir=tmp_path / "again", contours=prediction.contours)
    assert written == output_paths(tmp_path / "again", case)
    for path, expected in ((written.inner, inner), (written.outer, outer)):
        again = nib.load(str(path))
        assert again.get_data_dtype() == np.uint8
        np.testing.assert_allclose(again.affine, nib.load(str(out / f"{case}_seg.nii.gz")).affine, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(again.dataobj), expected)

    # the Slicer files of the case: per structure its outer and inner contour as segments
    nrrd = pytest.importorskip("nrrd", reason="pynrrd reads the Slicer file back (pip install pynrrd)")
    files = slicer_files_from_inference(out, case, bundle.label_names, tmp_path / "slicer")
    data, header = nrrd.read(str(files.segmentation), index_order="F")
    names = {value: key for key, value in header.items() if key.startswith("Segment") and key.endswith("_Name")}
    for c, name in enumerate(["liver", "kidney", "spleen", "pancreas"], start=1):
        for kind, mask in (("outer", outer[..., c - 1]), ("inner", inner[..., c - 1])):
            key = names[f"{name} ({kind} 80%)"][: -len("Name")]
            layer, value = int(header[key + "Layer"]), int(header[key + "LabelValue"])
            np.testing.assert_array_equal(data[layer] == value, mask > 0)
            assert header[key + "Extent"] == " ".join(f"0 {n - 1}" for n in INPUT_SHAPE)
    assert header["calib_monai_contours_alpha"] == "0.2" and header["calib_monai_contours_epsilon"] == "0.02"
