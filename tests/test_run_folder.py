"""A trained bundle's models/ folder is one versioned unit (calib_monai.bundle.manifest), and every output names its
source: nacl_flare trained for one epoch on tiny phantoms and calibrated, then its set broken by hand (a deleted
calibration, a range of another run, a publication killed half-way, two models into one output folder)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from monai.bundle import ConfigWorkflow

from calib_monai.bundle import TrainedBundle
from calib_monai.bundle.manifest import (
    NOT_APPLICABLE,
    ArtifactSetError,
    copy_artifact_set,
    file_sha256,
    read_artifact_set,
)
from conftest import REPO_ROOT, run_bundle_workflow

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
CONFIGS = REPO_ROOT / "bundles" / "nacl_flare" / "configs"
TINY = {"roi_size": [32, 32, 8], "batch_size": 8, "data#num_phantoms": 6, "data#spacing": [12.0, 12.0, 30.0]}
INFER = {"roi_size": TINY["roi_size"], "data#spacing": TINY["data#spacing"]}
SET = ("model.pt", "calibration.pt", "calibration.json", "validated_range.json", "contours.json")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A bundle folder trained for one epoch, then calibrated (temperature scaling: the quickest fit)."""
    root = tmp_path_factory.mktemp("run_folder")
    shutil.copytree(CONFIGS, root / "bundle" / "configs")
    overrides = {**TINY, "output_dir": str(root / "bundle" / "models"), "data#cache_dir": str(root / "phantoms")}
    run_bundle_workflow(CONFIGS, ["train.json"], "run", epochs=1, **overrides)
    run_bundle_workflow(
        CONFIGS, ["train.json", "calibrate.json"], "calibrate", calibration_method="temperature", **overrides
    )
    images = sorted((root / "phantoms").rglob("imagesTr/*.nii.gz"))[:2]
    return root, images


@pytest.fixture
def bundle(calibrated, tmp_path):
    """A fresh copy of the calibrated bundle, to break by hand."""
    root, images = calibrated
    shutil.copytree(root / "bundle", tmp_path / "bundle")
    return tmp_path / "bundle", images


def _infer(bundle_dir, image, output_dir, **overrides):
    workflow = ConfigWorkflow(
        config_file=str(bundle_dir / "configs" / "inference.json"),
        workflow_type="infer",
        run_id="inferring",
        bundle_root=str(bundle_dir),
        logging_file=False,
        dataset_dir=str(image),
        output_dir=str(output_dir),
        **INFER,
        **overrides,
    )
    workflow.initialize()
    workflow.run()


def _error(call) -> str:
    """The message of the calib_monai error behind ``call``'s failure (MONAI wraps it in 'Failed to instantiate')."""
    with pytest.raises(Exception) as info:
        call()
    err = info.value
    while err.__cause__ is not None and not isinstance(err, ArtifactSetError):
        err = err.__cause__
    return str(err)


def test_calibrate_publishes_one_set_with_a_manifest(calibrated):
    root, _ = calibrated
    models = root / "bundle" / "models"
    manifest = json.loads((models / "manifest.json").read_text())
    weights = file_sha256(models / "model.pt")
    assert manifest["weights"] == {"file": "model.pt", "sha256": weights}
    assert set(manifest["artifacts"]) == set(SET)
    for name in SET:
        entry = manifest["artifacts"][name]
        assert entry["sha256"] == file_sha256(models / name) and entry["weights_sha256"] == weights
        assert set(entry["versions"]) == {"calib_monai", "monai", "torch"}
    settings = manifest["artifacts"]["calibration.pt"]["settings"]
    assert settings["method"] == "temperature"
    assert (settings["crossfit"], settings["folds"]) == (True, 2)  # how the range was scored: cross-fitting, halves
    assert manifest["artifacts"]["validated_range.json"]["measured_with_sha256"] == {
        "calibration.pt": file_sha256(models / "calibration.pt")
    }
    assert not [p.name for p in models.iterdir() if p.name.startswith(".")]  # no temporary file left
    assert read_artifact_set(models).calibration == models / "calibration.pt"


def test_a_deleted_calibration_is_an_error_unless_raw_is_asked_for(bundle, tmp_path):
    bundle_dir, images = bundle
    (bundle_dir / "models" / "calibration.pt").unlink()
    for call in (
        lambda: _infer(bundle_dir, images[0], tmp_path / "out"),
        lambda: TrainedBundle(bundle_dir, overrides=INFER).predict(images[0]),
    ):
        message = _error(call)
        assert "calibration.pt is missing" in message and "manifest.json lists it" in message
        assert "run calibrate again" in message and "--calibration_path none" in message
    # asked for: the network's own probabilities, and no verdict against a range measured on recalibrated ones
    _infer(bundle_dir, images[0], tmp_path / "raw", calibration_path="none")
    quality = json.loads(next((tmp_path / "raw").glob("*_quality.json")).read_text())
    assert quality["review"] == {"flag": None, "reasons": [NOT_APPLICABLE]}
    assert quality["source"]["calibration_sha256"] is None and quality["source"]["recalibration"] == "none (asked for)"
    assert quality["source"]["weights_sha256"] == file_sha256(bundle_dir / "models" / "model.pt")


def test_a_range_of_another_run_is_refused(bundle, tmp_path):
    bundle_dir, images = bundle
    path = bundle_dir / "models" / "validated_range.json"
    record = json.loads(path.read_text())
    record["scores"] = [s * 0.9 for s in record["scores"]]  # another calibrate run's range, same weights
    path.write_text(json.dumps(record))
    message = _error(lambda: _infer(bundle_dir, images[0], tmp_path / "out"))
    assert "validated_range.json" in message and "do not belong to the set" in message
    assert "run calibrate again" in message
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    # and through TrainedBundle, whoever builds on it (export, MONAI Label, the studies)
    assert "do not belong to the set" in _error(lambda: TrainedBundle(bundle_dir).network)
    from calib_monai.export import export_bundle

    assert "validated_range.json" in _error(lambda: export_bundle(bundle_dir, output_dir=tmp_path / "export"))
    assert not (tmp_path / "export").exists() or not list((tmp_path / "export").glob("*.ts"))


def test_a_publication_killed_half_way_leaves_the_old_set(bundle):
    bundle_dir, _ = bundle
    models = bundle_dir / "models"
    before = {name: file_sha256(models / name) for name in SET}
    # a new calibration is published; the process is killed (SIGKILL) while the range is being written
    script = f"""
import os, signal, torch
from calib_monai.recalibration import TemperatureScaling
from calib_monai.recalibration.stored import publish_calibration
class Killed:
    def save(self, path, *weights):
        open(path, "w").write('{{"scores": [0.')
        os.kill(os.getpid(), signal.SIGKILL)
publish_calibration(TemperatureScaling(2.5), {str(models / "calibration.pt")!r}, {str(models / "model.pt")!r},
                    Killed(), settings={{"method": "temperature"}})
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT)
    assert done.returncode == -signal.SIGKILL
    assert {name: file_sha256(models / name) for name in SET} == before  # the old set, whole
    assert read_artifact_set(models).calibration == models / "calibration.pt"
    # a kill after the renames, before the manifest: the new calibration beside the old range, refused
    shutil.copyfile(models / "calibration.pt", models / "old.pt")
    record = json.loads((models / "calibration.json").read_text())
    (models / "calibration.json").write_text(json.dumps({**record, "temperature": 2.5}))
    message = str(pytest.raises(ArtifactSetError, read_artifact_set, models).value)
    assert "calibration.json" in message and "killed while publishing" in message


def test_every_output_names_its_source_and_a_folder_takes_one_model(bundle, tmp_path):
    bundle_dir, images = bundle
    models = bundle_dir / "models"
    out = tmp_path / "out"
    _infer(bundle_dir, images[0], out)
    quality = json.loads(next(out.glob("*_quality.json")).read_text())
    source = quality["source"]
    assert source["weights_sha256"] == file_sha256(models / "model.pt")
    assert source["calibration_sha256"] == file_sha256(models / "calibration.pt")
    assert source["validated_range_sha256"] == file_sha256(models / "validated_range.json")
    with open(out / "quality.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert (row["weights"], row["calibration"], row["range"]) == tuple(
        source[k][:12] for k in ("weights_sha256", "calibration_sha256", "validated_range_sha256")
    )
    for path in (*out.glob("*_seg.nii.gz"), *out.glob("*_conf.nii.gz")):
        descrip = nib.load(str(path)).header["descrip"].item().decode()
        assert descrip == f"calib_monai w={row['weights']} c={row['calibration']} r={row['range']}"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # nothing left under a temporary name
    # a second model (here: the same weights without recalibration) into the same folder is refused, before writing
    files = sorted(p.name for p in out.iterdir())
    message = _error(lambda: _infer(bundle_dir, images[1], out, calibration_path="none"))
    assert f"{out} holds results of another model" in message and "new --output_dir" in message
    assert sorted(p.name for p in out.iterdir()) == files
    # the same model again completes the folder
    _infer(bundle_dir, images[1], out)
    with open(out / "quality.csv") as f:
        assert len(list(csv.DictReader(f))) == 2


def test_slicer_names_a_truncated_file_and_records_the_source(bundle, tmp_path):
    bundle_dir, images = bundle
    out = tmp_path / "out"
    _infer(bundle_dir, images[0], out)
    case = next(out.glob("*_quality.json")).name[: -len("_quality.json")]
    command = [sys.executable, "-m", "calib_monai.cli", "slicer", str(bundle_dir), case, "--inference_dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    import nrrd

    header = nrrd.read_header(str(out / f"{case}.seg.nrrd"))
    quality = json.loads((out / f"{case}_quality.json").read_text())
    assert header["calib_monai_weights_sha256"] == quality["source"]["weights_sha256"]
    assert (
        nrrd.read_header(str(out / f"{case}_confidence.nrrd"))["calib_monai_calibration_sha256"]
        == (quality["source"]["calibration_sha256"])
    )
    # the confidence cut off as a killed writer (without the temporary name) would have left it
    conf = out / f"{case}_conf.nii.gz"
    conf.write_bytes(conf.read_bytes()[: conf.stat().st_size // 2])
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("calib-monai: error: ") and str(conf) in line and "cut off or damaged" in line
    assert "run the bundle's inferring step" in line


def test_copied_set_and_other_weights_of_the_folder(bundle, tmp_path):
    bundle_dir, images = bundle
    models = bundle_dir / "models"
    # MONAI Label's fine-tune publishes its work folder's set over a served one that has a manifest of its own
    served = tmp_path / "served" / "models"
    served.mkdir(parents=True)
    shutil.copyfile(models / "model.pt", served / "model.pt")
    (served / "validated_range.json").write_text("{}")  # a stale file of an older set
    copy_artifact_set(models, served)
    assert {n: file_sha256(served / n) for n in SET} == {n: file_sha256(models / n) for n in SET}
    assert read_artifact_set(served).validated_range == served / "validated_range.json"
    # weights trained again since calibrate: the set is refused, with the fix
    (models / "model.pt").write_bytes((models / "model.pt").read_bytes() + b"\0")
    message = str(pytest.raises(ArtifactSetError, read_artifact_set, models).value)
    assert "is not the weights" in message and "run calibrate again" in message
    np.testing.assert_equal(read_artifact_set(models, raw=True).calibration, None)


def test_a_failed_write_leaves_no_file_under_its_final_name(tmp_path):
    from calib_monai.atomic import write_durably

    def half_then_fail(tmp):
        with open(tmp, "wb") as f:
            f.write(b"\x1f\x8b half a gzip stream")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_durably(tmp_path / "case_conf.nii.gz", half_then_fail)
    assert list(tmp_path.iterdir()) == []


def test_a_cases_files_are_written_side_by_side_and_one_failure_lets_the_others_finish(tmp_path):
    from functools import partial

    from calib_monai.atomic import write_concurrently, write_durably

    def text(i, tmp):
        with open(tmp, "w") as f:
            f.write(str(i))

    names = [tmp_path / f"case_{i}.txt" for i in range(3)]
    assert write_concurrently([partial(write_durably, name, partial(text, i)) for i, name in enumerate(names)]) == names
    assert [name.read_text() for name in names] == ["0", "1", "2"]

    def disk_full():
        raise OSError("disk full")

    later = [tmp_path / f"later_{i}.txt" for i in range(2)]
    with pytest.raises(OSError, match="disk full"):
        write_concurrently([disk_full, *(partial(write_durably, name, partial(text, 7)) for name in later)])
    assert [name.read_text() for name in later] == ["7", "7"]  # the others were not cut short


def test_monai_label_serving_checks_the_set_and_keeps_the_one_it_serves(bundle):
    from calib_monai.label.serving import ServedBundle

    bundle_dir, images = bundle
    models = bundle_dir / "models"
    served = ServedBundle(bundle_dir, device="cpu")
    served.bundle.parser.update(INFER)
    first = served.predict(str(images[0]))
    assert first.source["weights_sha256"] == file_sha256(models / "model.pt")
    # MONAI Label's client downloads an answer to <tempdir>/<its name>: the server's file must lie elsewhere, or on
    # one machine the server's clean-up deletes the client's copy
    answer = Path(served.save(first, "segmentation"))
    assert answer.is_file() and answer.parent.resolve() != Path(tempfile.gettempdir()).resolve()
    answer.unlink()
    assert first.source["calibration_sha256"] == file_sha256(models / "calibration.pt")
    # the calibration replaced under the running server: the set it loaded goes on serving, not a mix
    record = json.loads((models / "calibration.json").read_text())
    (models / "calibration.json").write_text(json.dumps({**record, "temperature": 9.0}))
    again = served.predict(str(images[1]))
    assert again.source == first.source
    # a server started on the mixed folder refuses it, naming the file
    fresh = ServedBundle(bundle_dir, device="cpu")
    message = str(pytest.raises(ArtifactSetError, fresh.predict, str(images[0])).value)
    assert "calibration.json" in message and "run calibrate again" in message


def test_monai_label_serving_returns_the_pooled_features_next_sample_compares(bundle):
    from calib_monai.label.serving import ServedBundle
    from calib_monai.metrics.network_features import BottleneckFeatures

    bundle_dir, images = bundle
    served = ServedBundle(bundle_dir, device="cpu")
    served.bundle.parser.update(INFER)
    first = served.predict(str(images[0]))
    # the same case through the plain bundle, pooled by a hook of its own: the same vector
    plain = TrainedBundle(bundle_dir, ("inference.json",), INFER, device="cpu")
    with BottleneckFeatures(plain.network) as hook:
        plain.predict(str(images[0]))
    expected = hook.pop().vector
    assert first.features.shape == expected.shape and expected.ndim == 1
    np.testing.assert_allclose(first.features, expected, rtol=1e-12)
    # another image: other features
    assert not np.allclose(served.predict(str(images[1])).features, first.features)


def test_a_folder_without_manifest_still_refuses_a_range_without_its_calibration(bundle):
    """A folder copied without its manifest: the range records the recalibration it was measured with."""
    bundle_dir, _ = bundle
    models = bundle_dir / "models"
    (models / "manifest.json").unlink()
    assert read_artifact_set(models).calibration == models / "calibration.pt"  # its records name each other
    measured_with = json.loads((models / "validated_range.json").read_text())["calibration_sha256"]
    assert measured_with == file_sha256(models / "calibration.pt")
    (models / "calibration.pt").unlink()
    message = str(pytest.raises(ArtifactSetError, read_artifact_set, models).value)
    assert message.startswith(f"no manifest.json in {models}") and "do not name each other" in message
    assert f"validated_range.json was measured with the recalibration sha256 {measured_with[:12]}" in message
    assert read_artifact_set(models, raw=True).source()["validated_range"] == NOT_APPLICABLE


def test_a_file_is_hashed_again_only_when_it_changed(tmp_path, monkeypatch):
    """file_sha256 reads a file once per version: unchanged, the second call reads nothing; replaced whole (as every
    writer of the package does), or rewritten in place to another size, it is read again."""
    import hashlib

    path = tmp_path / "model.pt"
    path.write_bytes(b"first")
    assert file_sha256(path) == hashlib.sha256(b"first").hexdigest()
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k))
    assert file_sha256(path) == hashlib.sha256(b"first").hexdigest() and opened == []
    (tmp_path / "new").write_bytes(b"second")
    os.replace(tmp_path / "new", path)
    assert file_sha256(path) == hashlib.sha256(b"second").hexdigest() and opened == [str(path)]
    path.write_bytes(b"third, longer")
    assert file_sha256(path) == hashlib.sha256(b"third, longer").hexdigest()
