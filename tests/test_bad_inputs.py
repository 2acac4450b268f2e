"""Every bad input of a bundle run (issues 30 and 50): how it is built, what becomes of it, the words.

Outcomes: ``error`` (a bundle run or ``calib-monai`` ends with one line naming the file or key, exit 1 / 2),
``refused`` (``calibrate-probabilities`` scores nothing and says why), ``taken over`` / ``allowed`` (the run goes on
and a log line says what it did). Real components throughout: one ``nacl_flare`` bundle trained for one epoch on tiny
phantoms by ``python -m monai.bundle run`` (module fixture) and its ``inferring`` workflow. The bad inputs of
``calib-monai calibrate-probabilities`` (nnU-Net's own files altered): ``tests/test_bad_nnunet_inputs.py``.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from calib_monai.atomic import WriteError, save_atomically, write_text_atomically
from calib_monai.bundle.errors import error_line
from calib_monai.handlers.checkpoint import OutputFolderLock
from conftest import bundle_command

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "bundles" / "nacl_flare" / "configs"
NNUNET = REPO / "tests" / "data" / "nnunet"
TINY = {"roi_size": [32, 32, 8], "data#spacing": [12.0, 12.0, 30.0]}
TRAIN = {**TINY, "batch_size": 8, "data#num_phantoms": 6, "lr": 0.003}


@dataclass(frozen=True)
class Row:
    name: str
    build: Callable  # (ctx, tmp) -> what the row's runner takes
    outcome: str  # "error", "refused", "taken over", "allowed"
    words: tuple[str, ...]  # each must be in the line


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _train(ctx: dict, output: Path, limit: int | None = None, **more) -> subprocess.CompletedProcess:
    """``python -m monai.bundle run training`` of the fixture's bundle into ``output`` (``limit``: ulimit -f)."""
    overrides = {**TRAIN, "data#cache_dir": str(ctx["phantoms"]), "output_dir": str(output), "epochs": 1, **more}
    command = bundle_command("training", [str(ctx["configs"] / "train.json")], overrides)

    def limited() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, env=_env(), timeout=600, preexec_fn=limited
    )


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bad_inputs")
    shutil.copytree(CONFIGS, root / "bundle" / "configs")
    ctx = {"root": root, "configs": root / "bundle" / "configs", "phantoms": root / "phantoms"}
    ctx["models"] = root / "bundle" / "models"
    trained = _train(ctx, ctx["models"])
    assert trained.returncode == 0, trained.stderr[-2000:]
    ctx["image"] = sorted(ctx["phantoms"].rglob("imagesTr/*.nii.gz"))[0]
    return ctx


# ------------------------------------------------------------------------------------------- inferring: the images


def _image(ctx: dict, tmp: Path, change: Callable[[np.ndarray], np.ndarray]) -> dict:
    source = nib.load(str(ctx["image"]))
    data = change(np.asarray(source.dataobj, dtype=np.float32).copy())
    (tmp / "images").mkdir()
    nib.save(nib.Nifti1Image(data, source.affine), str(tmp / "images" / "case.nii.gz"))
    return {"dataset_dir": tmp / "images", "output_dir": tmp / "out"}


def _set(data: np.ndarray, value: float) -> np.ndarray:
    data[3, 3, 3] = value
    return data


def _saved(ctx: dict, tmp: Path, make: Callable) -> dict:
    """The image saved as ``make(data, source)`` builds it (another header)."""
    source = nib.load(str(ctx["image"]))
    (tmp / "images").mkdir()
    nib.save(make(np.asarray(source.dataobj, dtype=np.float32), source), str(tmp / "images" / "case.nii.gz"))
    return {"dataset_dir": tmp / "images", "output_dir": tmp / "out"}


def _zero_spacing(ctx: dict, tmp: Path) -> dict:
    """A qform (sform_code 0) whose y spacing is 0 in the file's bytes (nibabel fixes it to 1 on every write and
    read, so the header is patched after writing: pixdim[2], a float32 at byte 84)."""
    source = nib.load(str(ctx["image"]))
    header = source.header.copy()
    header.set_sform(None, code=0)
    header.set_qform(source.affine, code=1)
    nib.save(nib.Nifti1Image(np.asarray(source.dataobj, dtype=np.float32), None, header), str(tmp / "plain.nii"))
    raw = bytearray((tmp / "plain.nii").read_bytes())
    raw[84:88] = np.float32(0).tobytes()
    (tmp / "images").mkdir()
    (tmp / "images" / "case.nii.gz").write_bytes(gzip.compress(bytes(raw)))
    return {"dataset_dir": tmp / "images", "output_dir": tmp / "out"}


def _twice(ctx: dict, tmp: Path) -> dict:
    """``case.nii`` beside ``case.nii.gz``: two files of one case."""
    args = _image(ctx, tmp, lambda d: d)
    nib.save(nib.load(str(tmp / "images" / "case.nii.gz")), str(tmp / "images" / "case.nii"))
    return args


def _output(ctx: dict, tmp: Path, occupy: Callable[[Path], Path]) -> dict:
    args = _image(ctx, tmp, lambda d: d)
    return {**args, "output_dir": occupy(tmp)}


def _file(path: Path) -> Path:
    path.write_text("not a folder")
    return path


def _folder_at_output(tmp: Path) -> Path:
    (tmp / "out" / "case_seg.nii.gz").mkdir(parents=True)  # a folder where inferring writes its file
    return tmp / "out"


def _infer(ctx: dict, dataset_dir: Path, output_dir: Path, bundle: Path | None = None, **more) -> str:
    from monai.bundle import ConfigWorkflow

    workflow = ConfigWorkflow(
        config_file=str(ctx["configs"] / "inference.json"),
        workflow_type="infer",
        logging_file=False,
        dataset_dir=str(dataset_dir),
        output_dir=str(output_dir),
        bundle_root=str(bundle or ctx["root"] / "bundle"),
        **TINY,
        **more,
    )
    try:
        workflow.initialize()
        workflow.run()
    except Exception as err:  # the line report_errors prints in a bundle run
        return error_line(err)
    return ""


INFERRING = [
    Row("NaN voxel", lambda c, t: _image(c, t, lambda d: _set(d, np.nan)), "error", ("case.nii.gz", "NaN/Inf", "1")),
    Row("inf voxel", lambda c, t: _image(c, t, lambda d: _set(d, np.inf)), "error", ("case.nii.gz", "NaN/Inf")),
    Row("constant image", lambda c, t: _image(c, t, lambda d: d * 0 + 7), "error", ("case.nii.gz", "constant", "7")),
    Row("1-voxel image", lambda c, t: _image(c, t, lambda d: d[:1, :1, :1]), "error", ("case.nii.gz", "1x1x1")),
    Row("2D image", lambda c, t: _image(c, t, lambda d: d[:, :, 0]), "error", ("case.nii.gz", "2D", "3D volumes")),
    Row(
        "no affine (qform and sform codes 0)",
        lambda c, t: _saved(c, t, lambda d, s: nib.Nifti1Image(d, None)),
        "error",
        ("image ", "case.nii.gz has no usable affine", "qform_code and sform_code are both 0", "set_sform"),
    ),
    Row(
        "a zero voxel spacing",
        _zero_spacing,
        "error",
        ("case.nii.gz has no usable affine", "zero voxel size", "pixdim (", "convert it again"),
    ),
    Row(
        "case.nii beside case.nii.gz",
        _twice,
        "error",
        ("images/case.nii and ", "images/case.nii.gz under ", "both the case 'case'", "keep one of them"),
    ),
    Row("output_dir is a file", lambda c, t: _output(c, t, lambda t: _file(t / "o")), "error", ("is a file", "o ")),
    Row(
        "output_dir under a file", lambda c, t: _output(c, t, lambda t: _file(t / "f") / "o"), "error", ("lies under",)
    ),
    Row(
        "a folder where an output file goes",
        lambda c, t: _output(c, t, _folder_at_output),
        "error",
        ("cannot write", "case_seg.nii.gz", "a folder stands where the file should go"),
    ),
]


@pytest.mark.parametrize("row", INFERRING, ids=[r.name for r in INFERRING])
def test_inferring(ctx, tmp_path, row):
    line = _infer(ctx, **row.build(ctx, tmp_path))
    assert line and "\n" not in line, line
    assert all(w in line for w in row.words), line
    assert "suitable writer" not in line and "RuntimeError" not in line


def _unwritable_folder(tmp: Path) -> Path:
    """A folder this process may not write in: chmod 555, or as root (whom permission bits do not stop) sysfs,
    which refuses new files to everyone."""
    folder = tmp / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    if not os.access(folder, os.W_OK):
        return folder
    folder.chmod(0o755)
    try:
        handle, probe = tempfile.mkstemp(dir="/sys")
    except OSError as err:
        if err.errno == errno.EACCES:
            return Path("/sys")
    else:  # pragma: no cover - a writable /sys
        os.close(handle)
        os.remove(probe)
    pytest.skip("no folder this process cannot write: permission bits do not apply to it and /sys takes files")


def test_inferring_into_a_read_only_folder(ctx, tmp_path):
    args = _image(ctx, tmp_path, lambda d: d)
    folder = _unwritable_folder(tmp_path)
    try:
        line = _infer(ctx, args["dataset_dir"], folder)
    finally:
        if folder != Path("/sys"):
            folder.chmod(0o755)
    assert line.startswith("cannot write ") and "no permission to write there" in line, line
    assert "suitable writer" not in line and "chmod u+w" in line


# ------------------------------------------------------------------------------------------- training: resume, lock


def _resume(ctx: dict, tmp: Path, **more) -> subprocess.CompletedProcess:
    shutil.copytree(ctx["models"], tmp / "models")
    return _train(ctx, tmp / "models", epochs=2, **more)


def _held(ctx: dict, tmp: Path) -> subprocess.CompletedProcess:
    lock = OutputFolderLock(tmp / "models")
    lock.acquire()  # this test process trains there, as far as the second run can tell
    try:
        return _train(ctx, tmp / "models")
    finally:
        lock.release()


def _stale(ctx: dict, tmp: Path) -> subprocess.CompletedProcess:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs: a training killed with SIGKILL left its file
    (tmp / "models").mkdir()
    holder = {"pid": gone.pid, "host": os.uname().nodename, "started": "2026-01-01 00:00:00 UTC"}
    (tmp / "models" / "training.lock").write_text(json.dumps(holder))
    result = _train(ctx, tmp / "models")
    assert not (tmp / "models" / "training.lock").exists()  # released at the end
    return result


TRAINING = [
    Row(
        "resume at another lr",
        lambda c, t: _resume(c, t, lr=0.0003),
        "error",
        ("checkpoint_latest.pt", "lr: 0.003 -> 0.0003", "--resume_changes allow", "delete"),
    ),
    Row("resume with a new loss argument", lambda c, t: _resume(c, t, **{"loss#alpha": 0.3}), "error", ("loss#alpha",)),
    Row(
        "resume at another lr, allowed",
        lambda c, t: _resume(c, t, lr=0.0003, resume_changes="allow"),
        "allowed",
        ("changed settings", "lr: 0.003 -> 0.0003", "lr 3.0e-05"),
    ),
    Row(
        "a bad --resume_changes", lambda c, t: _train(c, t, resume_changes="yes"), "error", ("resume_changes", "allow")
    ),
    Row("a folder another training holds", _held, "error", ("in use by another training", f"pid {os.getpid()}")),
    Row("a lock left by a killed run", _stale, "taken over", ("taking over", "no longer runs")),
    Row(
        "a read-only output folder",
        lambda c, t: _train(c, _unwritable_folder(t)),
        "error",
        ("cannot write", "no permission to write there", "chmod u+w"),
    ),
    Row(
        "disk full while saving model.pt (ulimit -f)",
        lambda c, t: _train(c, t / "models", limit=3_000_000),
        "error",
        ("cannot write", "model.pt", "larger than this process may write", "ulimit -f"),
    ),
]


@pytest.mark.parametrize("row", TRAINING, ids=[r.name for r in TRAINING])
def test_training(ctx, tmp_path, row):
    result = row.build(ctx, tmp_path)
    output = result.stdout + result.stderr
    if row.outcome == "error":
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 1 and last.startswith("ERROR: "), output[-3000:]
        assert all(w in last for w in row.words), last
        assert "basic_ios" not in last and "Traceback" not in result.stderr
        assert not list(tmp_path.rglob("training.lock"))  # an error line gives the output folder back
    else:
        assert result.returncode == 0, output[-3000:]
        assert all(w in output for w in row.words), output[-3000:]


def test_calibrate_on_a_full_disk_names_the_file(ctx, tmp_path):
    """The calibrate step publishes through the manifest: a write past the file-size limit (as on a full disk) is one
    line naming the file, not torch's bare ``basic_ios`` error, and the published set is left as it was."""
    models = tmp_path / "models"
    shutil.copytree(ctx["models"], models)
    before = sorted(p.name for p in models.iterdir())
    overrides = {**TRAIN, "data#cache_dir": str(ctx["phantoms"]), "output_dir": str(models), "review_alpha": 0.4}
    configs = [str(ctx["configs"] / "train.json"), str(ctx["configs"] / "calibrate.json")]
    command = bundle_command("calibrate", configs, overrides)
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(),
        timeout=600,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (2_000, 2_000)),
    )
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith("ERROR: cannot write "), result.stderr[-3000:]
    assert "larger than this process may write" in last and "basic_ios" not in last, last
    assert sorted(p.name for p in models.iterdir()) == before  # nothing half-published, no temporary file left


# ------------------------------------------------------------------------------------------- calibrate: the lock


def _calibrate_overrides(ctx: dict, models: Path) -> dict:
    overrides = {**TRAIN, "data#cache_dir": str(ctx["phantoms"]), "output_dir": str(models), "review_alpha": 0.4}
    return {**overrides, "calibration_method": "temperature"}


CALIBRATE_CONFIGS = ("train.json", "calibrate.json")


def _calibrate_folder(ctx: dict, models: Path) -> subprocess.CompletedProcess:
    configs = [str(ctx["configs"] / c) for c in CALIBRATE_CONFIGS]
    command = bundle_command("calibrate", configs, _calibrate_overrides(ctx, models))
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=_env(), timeout=600)


def _holding(task: str, run: Callable) -> Callable:
    """The run folder's lock taken by this test process as ``task`` takes it (a training, or the ``calibrate`` of
    ``HoldOutputFolder``), then ``run(ctx, models)`` in another process."""

    def build(ctx: dict, tmp: Path) -> subprocess.CompletedProcess:
        shutil.copytree(ctx["models"], tmp / "models")
        lock = OutputFolderLock(tmp / "models", task=task)
        lock.acquire()
        try:
            return run(ctx, tmp / "models")
        finally:
            lock.release()

    return build


LOCKED = [
    Row(
        "calibrate beside a training",
        _holding("training", _calibrate_folder),
        "error",
        ("in use by a training", f"pid {os.getpid()}", "wait for the training to finish, then run calibrate again"),
    ),
    Row(
        "a second calibrate on the folder",
        _holding("calibrate", _calibrate_folder),
        "error",
        ("in use by another calibrate", f"pid {os.getpid()}", "wait for it to finish"),
    ),
    Row(
        "a training beside a calibrate",
        _holding("calibrate", lambda c, m: _train(c, m)),
        "error",
        ("in use by a calibrate", f"pid {os.getpid()}", "wait for the calibrate to finish"),
    ),
]


@pytest.mark.parametrize("row", LOCKED, ids=[r.name for r in LOCKED])
def test_locked_folder(ctx, tmp_path, row):
    result = row.build(ctx, tmp_path)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith("ERROR: "), result.stderr[-3000:]
    assert all(w in last for w in row.words), last
    assert not (tmp_path / "models" / "manifest.json").exists()  # nothing published
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == sorted(p.name for p in ctx["models"].iterdir())


def test_calibrate_refuses_weights_replaced_while_it_runs(ctx, tmp_path):
    """The weights replaced after ``calibrate`` loaded them (by a writer that ignores the lock: a copy by hand): it
    fits for the bytes it loaded, sees the file changed when it publishes, and publishes nothing."""
    from ignite.engine import Events
    from monai.bundle import ConfigWorkflow

    models = tmp_path / "models"
    shutil.copytree(ctx["models"], models)
    loaded = hashlib.sha256((models / "model.pt").read_bytes()).hexdigest()
    workflow = ConfigWorkflow(
        config_file=[str(ctx["configs"] / c) for c in CALIBRATE_CONFIGS],
        workflow_type="train",
        run_id="calibrate",
        logging_file=False,
        **_calibrate_overrides(ctx, models),
    )
    workflow.initialize()

    def replace_once(engine) -> None:
        state = torch.load(models / "model.pt", weights_only=True)
        first = next(iter(state))
        state[first] = state[first] + 1.0  # another epoch's weights
        torch.save(state, models / "epoch_4.pt")
        os.replace(models / "epoch_4.pt", models / "model.pt")

    evaluator = workflow.parser.get_parsed_content("validate#evaluator")
    evaluator.add_event_handler(Events.ITERATION_COMPLETED(once=1), replace_once)
    with pytest.raises(Exception) as raised:
        workflow.run()
    line = error_line(raised.value)
    replaced = hashlib.sha256((models / "model.pt").read_bytes()).hexdigest()
    assert line.startswith(f"{models / 'model.pt'} changed while calibrate ran"), line
    assert f"loaded the weights sha256 {loaded[:12]}" in line and f"now holds sha256 {replaced[:12]}" in line, line
    assert line.endswith("wait for the training to finish, then run calibrate again"), line
    names = {p.name for p in models.iterdir()}
    assert not names & {"manifest.json", "calibration.pt", "calibration.json", "validated_range.json"}, names
    assert not [n for n in names if n.endswith(".tmp") or ".tmp." in n], names  # no staged file left


# ------------------------------------------------------------------------------------------- a run folder's records


@pytest.fixture(scope="module")
def calibrated(ctx) -> Path:
    """The fixture's bundle calibrated (temperature scaling: the quickest fit): a published set with its manifest."""
    bundle = ctx["root"] / "calibrated"
    shutil.copytree(ctx["root"] / "bundle", bundle)
    result = _calibrate_folder(ctx, bundle / "models")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (bundle / "models" / "manifest.json").is_file()
    return bundle


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def _without_manifest(bundle: Path) -> None:
    (bundle / "models" / "manifest.json").unlink()


def _other_runs_range(bundle: Path) -> None:
    """No manifest, and a validated range of another calibrate of the same weights beside this run's
    recalibration: the range names another recalibration."""
    _without_manifest(bundle)
    other = hashlib.sha256(b"the calibration.pt of another calibrate run").hexdigest()
    _edit_json(bundle / "models" / "validated_range.json", lambda r: r.update(calibration_sha256=other))


def _other_weights_contours(bundle: Path) -> None:
    """No manifest, and a contour set whose record names other weights than the folder's model.pt."""
    _without_manifest(bundle)
    other = hashlib.sha256(b"other weights").hexdigest()
    _edit_json(bundle / "models" / "contours.json", lambda r: r.update(weights_sha256=other))


def _other_weights_calibration(bundle: Path) -> None:
    _without_manifest(bundle)
    record = torch.load(bundle / "models" / "calibration.pt", weights_only=True)
    record["weights_sha256"] = hashlib.sha256(b"other weights").hexdigest()
    torch.save(record, bundle / "models" / "calibration.pt")


RECORDS = [
    Row(
        "no manifest, the files name each other", _without_manifest, "allowed", ("no manifest.json in", "read because")
    ),
    Row(
        "no manifest, a range of another calibrate",
        _other_runs_range,
        "error",
        (
            "no manifest.json in",
            "do not name each other",
            "validated_range.json was measured with the recalibration",
            "run calibrate again",
        ),
    ),
    Row(
        "no manifest, a recalibration of other weights",
        _other_weights_calibration,
        "error",
        ("no manifest.json in", "calibration.pt was fitted for the weights sha256", "run calibrate again"),
    ),
    Row(
        "no manifest, a contour set of other weights",
        _other_weights_contours,
        "error",
        ("contours.json is a contour set from other weights", "run the bundle's calibrate step again"),
    ),
    Row(
        "a manifest of an unknown format",
        lambda b: _edit_json(b / "models" / "manifest.json", lambda m: m.update(format=7)),
        "error",
        ("manifest.json is a manifest of format 7", "reads format 1", "run calibrate again"),
    ),
    Row(
        "a manifest without its weights entry",
        lambda b: _edit_json(b / "models" / "manifest.json", lambda m: m.pop("weights")),
        "error",
        ("manifest.json is not a manifest of calib_monai (no entry 'weights')", "run calibrate again"),
    ),
    Row(
        "a manifest without its weights entry, raw asked for",
        lambda b: _edit_json(b / "models" / "manifest.json", lambda m: m.pop("weights")),
        "error raw",
        ("no entry 'weights'", "run calibrate again"),
    ),
]


@pytest.mark.parametrize("row", RECORDS, ids=[r.name for r in RECORDS])
def test_run_folder_records(ctx, calibrated, tmp_path, row):
    bundle = tmp_path / "bundle"
    shutil.copytree(calibrated, bundle)
    row.build(bundle)
    args = _image(ctx, tmp_path, lambda d: d)
    logged = _LogLines()
    logging.getLogger("calib_monai").addHandler(logged)
    try:
        raw = {"calibration_path": "none"} if row.outcome == "error raw" else {}
        line = _infer(ctx, **args, bundle=bundle, **raw)
    finally:
        logging.getLogger("calib_monai").removeHandler(logged)
    if row.outcome.startswith("error"):
        assert line and "\n" not in line, line
        assert all(w in line for w in row.words), line
        assert not raw or "--calibration_path none" not in line, line  # already passed: not the fix
    else:
        assert line == "", line
        assert all(any(w in m for m in logged.lines) for w in row.words), logged.lines
        assert (tmp_path / "out" / "case_seg.nii.gz").is_file()


def test_too_few_subjects_leave_the_contours_null_with_the_count(calibrated, ctx, tmp_path):
    """The fixture's few validation volumes at the default contour_alpha 0.1 (9 needed): calibrate stores null
    lambdas with the count needed, and inferring writes no contour and says why in the quality."""
    record = json.loads((calibrated / "models" / "contours.json").read_text())
    for entry in record["classes"].values():
        assert entry["lambda_out"] is None and entry["lambda_in"] is None
        assert "cannot vouch at contour_alpha = 0.1" in entry["reason"] and "needs at least 9" in entry["reason"]
    args = _image(ctx, tmp_path, lambda d: d)
    assert _infer(ctx, **args, bundle=calibrated) == ""
    quality = json.loads((tmp_path / "out" / "case_quality.json").read_text())
    assert quality["contours"]["vouched"] is not True and "needs at least 9" in json.dumps(quality["contours"])


class _LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# ------------------------------------------------------------------------------------------- the words of a line


def _wrapped(tmp: Path) -> str:
    """A calibration file without its method: our ``raise ... from`` names the file over the bare KeyError."""
    from calib_monai.recalibration.stored import load_calibration

    torch.save({"weights_sha256": "0" * 64, "state_dict": {}}, tmp / "fit.pt")
    try:
        load_calibration(tmp / "fit.pt")
    except ValueError as err:
        return error_line(err)
    return ""


def _logits_as_probabilities(tmp: Path) -> str:
    """Probabilities that are logits reach the case score: the line names the case."""
    from monai.data import MetaTensor

    from calib_monai.review.validated_range import CaseQualityd

    prob = torch.full((2, 4, 4, 3), 3.0)
    image = MetaTensor(torch.ones(1, 4, 4, 3), meta={"filename_or_obj": "/data/liver_007.nii.gz"})
    try:
        CaseQualityd("pred")({"pred": prob, "image": image})
    except ValueError as err:
        return error_line(err)
    return ""


def _slicer(tmp: Path, *args: str) -> str:
    command = [sys.executable, "-m", "calib_monai.cli", "slicer", str(REPO / "bundles" / "nacl_flare"), *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=_env(), timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    return result.stderr.strip().splitlines()[-1]


MESSAGES = [
    Row(
        "a wrapped error", _wrapped, "error", ("fit.pt is not a calibration file of calib_monai", "KeyError: 'method'")
    ),
    Row("an error that names no case", _logits_as_probabilities, "error", ("case liver_007.nii.gz: ", "logits")),
    Row(
        "--low_confidence abc",
        lambda t: _slicer(t, "case_001", "--low_confidence", "abc"),
        "error",
        ("calib-monai: error: low_confidence must be", "got 'abc'", "e.g. 0.8"),
    ),
]


@pytest.mark.parametrize("row", MESSAGES, ids=[r.name for r in MESSAGES])
def test_the_words_of_a_line(tmp_path, row):
    line = row.build(tmp_path)
    assert line and "\n" not in line, line
    assert all(w in line for w in row.words), line


# ------------------------------------------------------------------------------------------- writers


def test_written_files_follow_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        path = write_text_atomically(tmp_path / "a.json", "{}")
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o640  # 0o666 & ~umask, not mkstemp's 0o600


def test_a_full_disk_is_named(tmp_path):
    """``/dev/full`` fails every write with ENOSPC, as a full disk does."""

    def to_full_disk(obj, tmp):
        with open("/dev/full", "wb") as f:
            torch.save(obj, f)
            f.flush()

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with pytest.raises(WriteError) as err:
        save_atomically({"w": torch.zeros(4)}, tmp_path / "checkpoint_latest.pt", write=to_full_disk)
    assert str(err.value).startswith(f"cannot write {tmp_path / 'checkpoint_latest.pt'}: the disk is full")
    assert list(tmp_path.iterdir()) == []  # no temporary file left


# ------------------------------------------------------------------------------------------- settings: checked, used


def _calibrate(
    ctx: dict, tmp: Path, validation: int = 1, edit: Callable[[dict], str | None] | None = None, **more
) -> subprocess.CompletedProcess:
    """The fixture's bundle's ``calibrate`` on a copy of its run folder, with ``more`` on the command line; the
    run's recorded split (``datalist.json``) moved to ``validation`` validation volumes, then changed by ``edit``
    (which may return the file's text instead)."""
    shutil.copytree(ctx["models"], tmp / "models")
    datalist = json.loads((tmp / "models" / "datalist.json").read_text())
    while len(datalist["validation"]) < validation:
        datalist["validation"].append(datalist["training"].pop())
    text = edit(datalist) if edit is not None else None
    (tmp / "models" / "datalist.json").write_text(json.dumps(datalist) if text is None else text)
    overrides = {**TRAIN, "data#cache_dir": str(ctx["phantoms"]), "output_dir": str(tmp / "models"), **more}
    configs = [str(ctx["configs"] / "train.json"), str(ctx["configs"] / "calibrate.json")]
    command = bundle_command("calibrate", configs, overrides)
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=_env(), timeout=600)


def _cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "calib_monai.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=_env(), timeout=600)


def _other_classes(ctx: dict, tmp: Path) -> subprocess.CompletedProcess:
    """A fit set of 4-class NIfTI maps (one-hot of the labels) for nnU-Net's 3-class predictions."""
    shutil.copytree(NNUNET, tmp / "nnunet")
    label = nib.load(str(tmp / "nnunet" / "labelsTr" / "case_001.nii.gz"))
    (tmp / "fit").mkdir()
    prob = np.stack([np.asarray(label.dataobj) == c for c in range(4)], -1).astype(np.float32)
    nib.save(nib.Nifti1Image(prob, label.affine), str(tmp / "fit" / "case_001.nii.gz"))
    labels = str(tmp / "nnunet" / "labelsTr")
    predictions, report = str(tmp / "nnunet" / "predictions"), str(tmp / "report")
    return _cli("calibrate-probabilities", predictions, labels, report, "--fit_predictions", str(tmp / "fit"),
                "--fit_labels", labels, "--surface_distances", "False")  # fmt: skip


def _relative_image(datalist: dict) -> None:
    image = Path(datalist["validation"][0]["image"])
    datalist["validation"][0]["image"] = str(Path(image.parent.name) / image.name)  # imagesTr/<case>_0000.nii.gz


def _slicer_into_a_file(ctx: dict, tmp: Path) -> subprocess.CompletedProcess:
    args = _image(ctx, tmp, lambda d: d)
    assert _infer(ctx, **args) == ""
    bundle, case = str(ctx["root"] / "bundle"), "case"
    return _cli("slicer", bundle, case, "--inference_dir", str(tmp / "out"), "--output_dir", str(_file(tmp / "f")))


SETTINGS = [
    Row(
        "more cross-fitting folds than validation volumes",
        lambda c, t: _calibrate(c, t, validation=2, calibration_folds=50),
        "error",
        ("calibration_folds 50 is more than the 2 validation volumes", "--calibration_folds 2 or less"),
    ),
    Row(
        "a review alpha above 1",
        lambda c, t: _calibrate(c, t, review_alpha=1.5),
        "error",
        ("review_alpha must be", "> 0 and < 1", "got 1.5", "--review_alpha"),
    ),
    Row(
        "a contour alpha above 1",
        lambda c, t: _calibrate(c, t, contour_alpha=1.5),
        "error",
        ("contour_alpha must be", "> 0 and < 1", "got 1.5", "--contour_alpha"),
    ),
    Row(
        "a contour epsilon of 0",
        lambda c, t: _calibrate(c, t, contour_epsilon=0),
        "error",
        ("contour_epsilon must be", "> 0 and < 1", "got 0", "--contour_epsilon"),
    ),
    Row(
        "a contour risk that is not one",
        lambda c, t: _calibrate(c, t, contour_risk="mean"),
        "error",
        ("contour_risk must be one of", "'per_case', 'expected'", "got 'mean'"),
    ),
    Row(
        "a fit budget of 0 voxels",
        lambda c, t: _calibrate(c, t, **{"calibration_settings#max_voxels": 0}),
        "error",
        ("calibration_settings#max_voxels", "an integer >= 1", "got 0"),
    ),
    Row(
        "calib-monai slicer --low_confidence 1.5",
        lambda c, t: _cli("slicer", str(c["root"] / "bundle"), "case", "--low_confidence", "1.5"),
        "error",
        ("calib-monai: error: low_confidence must be", "> 0 and < 1", "got 1.5"),
    ),
    Row(
        "a NaN voxel spacing",
        lambda c, t: _calibrate(c, t, **{"data#spacing": ["NaN", 12.0, 30.0]}),
        "error",
        ("spacing must be three positive finite voxel sizes", "'NaN'", "--data#spacing"),
    ),
    Row(
        "a NaN CT window",
        lambda c, t: _calibrate(c, t, **{"data#window": ["NaN", 240.0]}),
        "error",
        ("window must be (low, high) finite HU", "'NaN'", "--data#window"),
    ),
    Row(
        "a validation case also listed for training",
        lambda c, t: _calibrate(c, t, edit=lambda d: d["validation"].append(dict(d["training"][0]))),
        "error",
        ("datalist.json lists the case", "in training and in validation", "keep it in one list once"),
    ),
    Row(
        "a datalist case without its label",
        lambda c, t: _calibrate(c, t, edit=lambda d: d["validation"][0].pop("label") and None),
        "error",
        ("datalist.json lists a validation case without its 'label'", "fix the file"),
    ),
    Row(
        "a datalist cut off",
        lambda c, t: _calibrate(c, t, edit=lambda d: json.dumps(d)[:200]),
        "error",
        ("datalist.json is not a datalist (not JSON: ", "delete it to split the data set again"),
    ),
    Row(
        "a relative image path in the datalist",
        lambda c, t: _calibrate(c, t, edit=_relative_image),
        "error",
        ("datalist.json lists imagesTr/", "a relative path, read from the current folder", "no longer exists"),
    ),
    Row(
        "--device gpu",
        lambda c, t: _calibrate(c, t, device="gpu"),
        "error",
        ("device = 'gpu' is not valid: not a device torch knows", "pass --device cpu or --device cuda"),
    ),
    *[
        Row(
            "--device cuda on a machine without CUDA",
            lambda c, t: _calibrate(c, t, device="cuda"),
            "error",
            ("device = 'cuda' is not valid: this machine has no CUDA GPU", "pass --device cpu"),
        )
        for _ in range(0 if torch.cuda.is_available() else 1)
    ],
    Row(
        "calib-monai export --output_dir <a file>",
        lambda c, t: _cli("export", str(c["root"] / "bundle"), "--output_dir", str(_file(t / "f"))),
        "error",
        ("calib-monai: error: output_dir", "is a file, not a folder", "pass a folder"),
    ),
    Row(
        "calib-monai slicer --output_dir <a file>",
        _slicer_into_a_file,
        "error",
        ("calib-monai: error: output_dir", "is a file, not a folder", "pass a folder"),
    ),
    Row(
        "calibrate-probabilities: fit and evaluated sets of other class counts",
        _other_classes,
        "error",
        ("calib-monai: error: the fit set", "fit has 4 classes", "predictions has 3", "case_001"),
    ),
]


@pytest.mark.parametrize("row", SETTINGS, ids=[r.name for r in SETTINGS])
def test_settings(ctx, tmp_path, row):
    result = row.build(ctx, tmp_path)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode in (1, 2) and last.startswith(("ERROR: ", "calib-monai: error: ")), result.stderr[-3000:]
    assert all(w in last for w in row.words), last
    assert "Traceback" not in result.stderr
    if last.startswith("ERROR: "):  # a bundle run: nothing published
        assert not (tmp_path / "models" / "validated_range.json").exists()


# ------------------------------------------------------------------------------------------- a deployment: the site


@pytest.fixture(scope="module")
def served(ctx, calibrated, tmp_path_factory) -> Path:
    """The calibrated bundle's inferring output folder for the fixture's image (``case``): segmentations, answers and
    the site monitor's ``site.json``."""
    root = tmp_path_factory.mktemp("served")
    args = _image(ctx, root, lambda d: d)
    assert _infer(ctx, **args, bundle=calibrated) == ""
    assert (root / "out" / "site.json").is_file()
    return root / "out"


def _site_label(ctx: dict, served: Path, tmp: Path, change: Callable, affine: Callable = lambda a, s: a) -> dict:
    """The fixture image's phantom label in the bundle's values, changed by ``change`` (array) and ``affine``."""
    from calib_monai.data.flare import FLARE22_TO_FLARE

    source = nib.load(str(ctx["image"]).replace("imagesTr", "labelsTr").replace("_0000.nii.gz", ".nii.gz"))
    values = np.vectorize(FLARE22_TO_FLARE.get)(np.asarray(source.dataobj).astype(int))
    (tmp / "labels").mkdir(parents=True)
    label = nib.Nifti1Image(change(values), affine(source.affine, values.shape))
    nib.save(label, str(tmp / "labels" / "case.nii.gz"))
    shutil.copytree(served, tmp / "site")
    return {"folder": tmp / "site", "labels": tmp / "labels"}


def _mirrored(affine: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The same voxels stored with the first axis reversed (another orientation, one world position)."""
    flip = np.eye(4)
    flip[0, 0], flip[0, 3] = -1, shape[0] - 1
    return affine @ flip


def _edit_site(served: Path, tmp: Path, change: Callable[[dict], None]) -> dict:
    shutil.copytree(served, tmp / "site")
    _edit_json(tmp / "site" / "site.json", change)
    return {"folder": tmp / "site"}


SITE = [
    Row(
        "a site label with fractional values (resampled linearly)",
        lambda c, s, t: _site_label(c, s, t, lambda v: np.where(v > 0, v + 0.6, 0).astype(np.float32)),
        "error",
        ("labels/case.nii.gz: the label holds non-integer values (e.g. 1.6)", "nearest-neighbour"),
    ),
    Row(
        "a site label 60 mm off the served grid",
        lambda c, s, t: _site_label(c, s, t, lambda v: v.astype(np.uint8), lambda a, s: a + np.eye(4, k=3) * 60),
        "error",
        ("does not lie on the grid of the served segmentation", "case_seg.nii.gz", "60 mm apart"),
    ),
    Row(
        "a site label with -1 for background",
        lambda c, s, t: _site_label(c, s, t, lambda v: np.where(v > 0, v, -1).astype(np.int16)),
        "error",
        ("the label holds the value -1", "classes are 0-4"),
    ),
    Row(
        "site.json: validation_subjects edited to a string",
        lambda c, s, t: _edit_site(s, t, lambda r: r.update(validation_subjects=str(r["validation_subjects"]))),
        "error",
        ("site.json is corrupt", "validation_subjects '1'", "calib-monai site reset"),
    ),
    Row(
        "site.json: a label's true DSC edited above 1",
        lambda c, s, t: _edit_site(s, t, lambda r: r.update(labels=[{"case": "case", "score": 0.2, "truth": 1.7}])),
        "error",
        ("site.json is corrupt", "label of 'case': truth 1.7 is not in [0, 1]"),
    ),
    Row(
        "site.json: cases edited to an object",
        lambda c, s, t: _edit_site(s, t, lambda r: r.update(cases={})),
        "error",
        ("site.json is corrupt", "cases, cases_bytes, combined_rank_within_k or signal_hits", "calib-monai site reset"),
    ),
]


@pytest.mark.parametrize("row", SITE, ids=[r.name for r in SITE])
def test_site(ctx, served, tmp_path, row):
    """``calib-monai site label`` (rows with labels) or ``site show``: one line, exit 2, the site state unchanged."""
    args = row.build(ctx, served, tmp_path)
    before = (args["folder"] / "site.json").read_text()
    command = ("site", "label", str(args["folder"]), str(args["labels"])) if "labels" in args else None
    result = _cli(*(command or ("site", "show", str(args["folder"]))))
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith("calib-monai: error: "), result.stderr[-3000:]
    assert all(w in last for w in row.words), last
    assert (args["folder"] / "site.json").read_text() == before


def test_a_site_label_in_another_orientation_counts_as_stored_alike(ctx, served, tmp_path):
    """The same label stored mirrored (its affine says so): the same true DSC as the label stored as served."""
    alike = _site_label(ctx, served, tmp_path / "alike", lambda v: v.astype(np.uint8))
    mirrored = _site_label(ctx, served, tmp_path / "mirrored", lambda v: v[::-1].astype(np.uint8), _mirrored)
    truths = []
    for args in (alike, mirrored):
        result = _cli("site", "label", str(args["folder"]), str(args["labels"]))
        assert result.returncode == 0, result.stderr[-3000:]
        truths.append(json.loads((args["folder"] / "site.json").read_text())["labels"][0]["truth"])
    assert truths[1] == pytest.approx(truths[0]) and 0 < truths[0] < 1


def test_outputs_in_the_image_folder_are_left_out(ctx, calibrated, tmp_path):
    """inferring twice with --output_dir the image folder: the second run segments the image again, not the first
    run's outputs, says so, and the site monitor counts one image."""
    args = _image(ctx, tmp_path, lambda d: d)
    folder = args["dataset_dir"]
    assert _infer(ctx, folder, folder, bundle=calibrated) == ""
    written = sorted(p.name for p in folder.iterdir())
    logged = _LogLines()
    logging.getLogger("calib_monai").addHandler(logged)
    try:
        assert _infer(ctx, folder, folder, bundle=calibrated) == ""
    finally:
        logging.getLogger("calib_monai").removeHandler(logged)
    assert sorted(p.name for p in folder.iterdir()) == written  # no case_seg_seg.nii.gz, no case_conf_quality.json
    note = [m for m in logged.lines if m.startswith("left out 4 file(s)")]
    assert note and "case_seg.nii.gz" in note[0] and "another --output_dir" in note[0], logged.lines
    assert json.loads((folder / "site.json").read_text())["cases"] == 1
