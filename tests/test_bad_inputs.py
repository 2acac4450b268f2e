"""Every bad input of issue 30 (parts 4, 5, 7, 8) of a bundle run: how it is built, what becomes of it, the words.

Outcomes: ``error`` (a bundle run or ``calib-monai`` ends with one line naming the file or key, exit 1 / 2),
``refused`` (``calibrate-probabilities`` scores nothing and says why), ``taken over`` / ``allowed`` (the run goes on
and a log line says what it did). Real components throughout: one ``nacl_flare`` bundle trained for one epoch on tiny
phantoms by ``python -m monai.bundle run`` (module fixture) and its ``inferring`` workflow. The bad inputs of
``calib-monai calibrate-probabilities`` (nnU-Net's own files altered): ``tests/test_bad_nnunet_inputs.py``.
"""

from __future__ import annotations

import errno
import json
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


def _output(ctx: dict, tmp: Path, occupy: Callable[[Path], Path]) -> dict:
    args = _image(ctx, tmp, lambda d: d)
    return {**args, "output_dir": occupy(tmp)}


def _file(path: Path) -> Path:
    path.write_text("not a folder")
    return path


def _folder_at_output(tmp: Path) -> Path:
    (tmp / "out" / "case_seg.nii.gz").mkdir(parents=True)  # a folder where inferring writes its file
    return tmp / "out"


def _infer(ctx: dict, dataset_dir: Path, output_dir: Path) -> str:
    from monai.bundle import ConfigWorkflow

    workflow = ConfigWorkflow(
        config_file=str(ctx["configs"] / "inference.json"),
        workflow_type="infer",
        logging_file=False,
        dataset_dir=str(dataset_dir),
        output_dir=str(output_dir),
        bundle_root=str(ctx["root"] / "bundle"),
        **TINY,
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


def _calibrate(ctx: dict, tmp: Path, validation: int = 1, **more) -> subprocess.CompletedProcess:
    """The fixture's bundle's ``calibrate`` on a copy of its run folder, with ``more`` on the command line; the
    run's recorded split (``datalist.json``) moved to ``validation`` validation volumes."""
    shutil.copytree(ctx["models"], tmp / "models")
    datalist = json.loads((tmp / "models" / "datalist.json").read_text())
    while len(datalist["validation"]) < validation:
        datalist["validation"].append(datalist["training"].pop())
    (tmp / "models" / "datalist.json").write_text(json.dumps(datalist))
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
