"""A real MONAI Label server for the tests (``tests/test_monai_label*.py``): ``monailabel start_server`` from
``.venv-label``, the command of ``docs/site.md`` verbatim (``start_command``), on 127.0.0.1 over a served model
folder built in a temporary folder, one per test session, and the HTTP helpers the tests talk to it with.

Served bundles: ``nacl_flare`` trained for one epoch on tiny phantoms (``models/model.pt``), the same weights as
TorchScript only (``nacl_flare_ts``), with a calibration of temperature 100 and a validated range
(``nacl_flare_calibrated``), ``ce_dice_hpc`` without weights, ``loop_flare`` (the same weights, calibrated by the
bundle's own calibrate step) for the annotation loop's tests, which train it, and ``confident_flare`` (the weights'
output layer scaled up, calibrated by the calibrate step) for the full-size CT. The datastore (``--studies``) holds
four unlabelled phantom volumes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from calib_monai.bundle import TrainedBundle
from calib_monai.recalibration import TemperatureScaling
from calib_monai.recalibration.stored import publish_calibration
from calib_monai.review import ValidatedRange
from conftest import REPO_ROOT, free_port, make_confident

LABEL_ENV = REPO_ROOT / ".venv-label"
LABEL_NAMES = {0: "background", 1: "liver", 2: "kidney", 3: "spleen", 4: "pancreas"}
# the review task's labels, by hand: each structure's confident part 2k - 1 and uncertain part 2k
REVIEW_NAMES = {
    "background": 0,
    "liver": 1,
    "liver (uncertain)": 2,
    "kidney": 3,
    "kidney (uncertain)": 4,
    "spleen": 5,
    "spleen (uncertain)": 6,
    "pancreas": 7,
    "pancreas (uncertain)": 8,
}
# input stored with flipped x/y (an LPS-like affine) and 4 x 4 x 10 mm voxels: the outputs must be on this grid
SHAPE = (40, 36, 10)
FULL_SIZE, FULL_SPACING = (512, 512, 200), (0.8, 0.8, 2.5)
AFFINE = np.array([[-4.0, 0, 0, 80], [0, -4.0, 0, 70], [0, 0, 10.0, -50], [0, 0, 0, 1]])
TINY = [
    "--epochs",
    "1",
    "--roi_size",
    "[32,32,8]",
    "--batch_size",
    "8",
    "--data#num_phantoms",
    "6",
    "--data#spacing",
    "[12.0,12.0,30.0]",
]
needs_label_env = pytest.mark.skipif(
    not (LABEL_ENV / "bin" / "monailabel").exists(),
    reason=f"MONAI Label environment {LABEL_ENV} not set up: run `bash scripts/setup_label_env.sh` (DEVELOPERS.md)",
)


def _run(cmd: list[str], cwd: Path, timeout: int = 600) -> None:
    done = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _write_phantom(path: Path, seed: int, shape: tuple[int, int, int]) -> Path:
    from calib_monai.data.phantoms import generate_phantom

    image, label, _ = generate_phantom(seed=seed, index=0, shape=shape, spacing=(4.0, 4.0, 10.0))
    nib.save(nib.Nifti1Image(image, AFFINE), str(path))
    return path


def _small_source_validation(bundle: Path, root: Path) -> None:
    """The bundle's own validation volumes, which Train validates and calibrates on again (``FineTune.
    source_validation``): two labelled phantoms of the datastore's scale (the tiny training phantoms span 384 mm,
    slow at the bundle's own spacing), and a third whose files are not on this machine (left out, with a warning)."""
    from calib_monai.data.phantoms import generate_phantom

    folder = root / "source_validation"
    folder.mkdir()
    items = []
    for index in range(2):
        image, label, _ = generate_phantom(seed=60 + index, index=0, shape=(40, 36, 10), spacing=(4.0, 4.0, 10.0))
        paths = {"image": folder / f"source_{index}.nii.gz", "label": folder / f"source_{index}_label.nii.gz"}
        nib.save(nib.Nifti1Image(image, AFFINE), str(paths["image"]))
        nib.save(nib.Nifti1Image(label, AFFINE), str(paths["label"]))
        items.append({key: str(path) for key, path in paths.items()})
    items.append({"image": str(folder / "elsewhere.nii.gz"), "label": str(folder / "elsewhere_label.nii.gz")})
    path = bundle / "models" / "datalist.json"
    datalist = json.loads(path.read_text())
    path.write_text(json.dumps({**datalist, "validation": items}))


def _write_images(folder: Path) -> dict[str, Path]:
    from calib_monai.data.phantoms import generate_phantom

    image, _, _ = generate_phantom(seed=7, index=0, shape=SHAPE, spacing=(4.0, 4.0, 10.0))
    paths = {name: folder / f"{name}.nii.gz" for name in ("case", "flat", "four", "corrupt", "truncated")}
    nib.save(nib.Nifti1Image(image, AFFINE), str(paths["case"]))
    nib.save(nib.Nifti1Image(image[..., 0], AFFINE), str(paths["flat"]))  # 2D
    nib.save(nib.Nifti1Image(np.stack([image, image], -1), AFFINE), str(paths["four"]))  # 4D, 2 channels
    paths["corrupt"].write_bytes(np.random.default_rng(0).bytes(4096))  # not gzip, not NIfTI
    paths["truncated"].write_bytes(paths["case"].read_bytes()[:3000])  # valid header, data cut off
    # a full-size CT at another spacing than the bundle's
    image, _, affine = generate_phantom(seed=7, index=0, shape=FULL_SIZE, spacing=FULL_SPACING)
    paths["full_size"] = folder / "full_size.nii.gz"
    nib.save(nib.Nifti1Image(image, affine), str(paths["full_size"]))
    return paths


def _copy_weights(bundle: Path, folder: Path) -> Path:
    """A bundle folder with ``bundle``'s configs and weights."""
    shutil.copytree(bundle / "configs", folder / "configs")
    (folder / "models").mkdir()
    shutil.copy(bundle / "models" / "model.pt", folder / "models" / "model.pt")
    return folder


def _calibrate(folder: Path, root: Path, *options: str) -> None:
    """The bundle's own calibrate step on the tiny phantoms, as a user runs it."""
    configs = json.dumps([str(folder / "configs" / "train.json"), str(folder / "configs" / "calibrate.json")])
    command = [sys.executable, "-m", "monai.bundle", "run", "calibrate", "--config_file", configs, *TINY[2:]]
    command += ["--output_dir", str(folder / "models"), "--data#cache_dir", str(root / "phantoms"), *options]
    _run(command, cwd=root)


@pytest.fixture(scope="session")
def served_folder(tmp_path_factory):
    """The app folder (main.py linked), its model/ folder, test images and the reference ``inferring`` outputs."""
    root = tmp_path_factory.mktemp("monai_label")
    app = root / "app"
    (app / "model").mkdir(parents=True)
    (app / "main.py").symlink_to(REPO_ROOT / "calib_monai" / "label" / "main.py")
    bundle = app / "model" / "nacl_flare"
    for name in ("nacl_flare", "nacl_flare_ts", "ce_dice_hpc"):
        source = REPO_ROOT / "bundles" / name.removesuffix("_ts")
        shutil.copytree(source / "configs", app / "model" / name / "configs")
    _run(
        [
            sys.executable,
            "-m",
            "monai.bundle",
            "run",
            "training",
            "--config_file",
            str(bundle / "configs" / "train.json"),
            *TINY,
            "--output_dir",
            str(bundle / "models"),
            "--data#cache_dir",
            str(root / "phantoms"),
        ],
        cwd=root,
    )
    # the same weights as TorchScript only (what ckpt_export puts in model.ts: the scripted 2D network)
    network = TrainedBundle(bundle, device="cpu").network
    (app / "model" / "nacl_flare_ts" / "models").mkdir()
    torch.jit.save(torch.jit.script(network.cpu()), str(app / "model" / "nacl_flare_ts" / "models" / "model.ts"))
    # the same weights, calibrated with T = 100: every confidence near 1 / 5, the segmentation unchanged
    calibrated = app / "model" / "nacl_flare_calibrated"
    shutil.copytree(bundle / "configs", calibrated / "configs")
    (calibrated / "models").mkdir()
    shutil.copy(bundle / "models" / "model.pt", calibrated / "models" / "model.pt")
    # and a validated range whose validation cases all scored 0.99: any case this tiny model segments is below it;
    # published as one set (its manifest), as calibrate publishes
    publish_calibration(
        TemperatureScaling(100.0),
        calibrated / "models" / "calibration.pt",
        calibrated / "models" / "model.pt",
        ValidatedRange([0.99] * 19, {}),
    )
    # loop_flare: the same weights, calibrated by the bundle's own calibrate step (calibration + validated range, and
    # contours at contour_alpha 0.5: its one validation subject vouches for j = floor(0.5 * 2) = 1)
    loop = _copy_weights(bundle, app / "model" / "loop_flare")
    _calibrate(loop, root, "--contour_alpha", "0.5")
    _small_source_validation(loop, root)
    # confident_flare: the same weights with the output layer scaled up (a confident network: exact ones in its
    # softmax), calibrated by the bundle's calibrate step; it serves the full-size CT
    confident = _copy_weights(bundle, app / "model" / "confident_flare")
    make_confident(confident / "models" / "model.pt")
    _calibrate(confident, root, "--calibration_method", "temperature")
    images = _write_images(root)
    (root / "studies").mkdir()
    for index in range(4):  # the datastore: unlabelled phantoms of different shapes
        _write_phantom(root / "studies" / f"study_{index}.nii.gz", seed=20 + index, shape=(40 + 4 * index, 36, 10))
    # the reference: the bundle's own inference run on the same file, in the main environment
    _run(
        [
            sys.executable,
            "-m",
            "monai.bundle",
            "run",
            "inferring",
            "--config_file",
            str(bundle / "configs" / "inference.json"),
            "--dataset_dir",
            str(images["case"]),
            "--output_dir",
            str(root / "reference"),
        ],
        cwd=root,
    )
    return {"root": root, "app": app, "images": images, "reference": root / "reference"}


SITE_DOC = REPO_ROOT / "docs" / "site.md"


def start_command(app: Path, studies: Path, port: int) -> list[str]:
    """The ``monailabel start_server`` line of ``docs/site.md``, verbatim but for three values: its ``--app`` folder
    (``calib_monai/label``) becomes ``app``, ``--studies /path/to/images`` becomes ``studies`` and ``--port 8000``
    becomes ``port``; a line that lacks any of them fails here, naming it."""
    lines = SITE_DOC.read_text().replace("\\\n", " ").splitlines()
    found = [line.strip() for line in lines if line.strip().startswith("monailabel start_server")]
    assert len(found) == 1, f"{SITE_DOC} must have exactly one `monailabel start_server` line, has {len(found)}"
    cmd = shlex.split(found[0])
    values = {"--app": "calib_monai/label", "--studies": "/path/to/images", "--port": "8000"}
    for option, documented in values.items():
        assert option in cmd and cmd[cmd.index(option) + 1] == documented, (
            f"{SITE_DOC}: the start_server line must have `{option} {documented}` (tests/label_server.py "
            f"substitutes it), got {found[0]!r}"
        )
    for option, value in {"--app": app, "--studies": studies, "--port": port}.items():
        cmd[cmd.index(option) + 1] = str(value)
    return cmd


@pytest.fixture(scope="session")
def server(served_folder):
    """``monailabel start_server`` on a free port of 127.0.0.1; stopped (process group) after the module."""
    root, port = served_folder["root"], free_port()
    (root / "tmp").mkdir()
    log_path = root / "server.log"
    env = {
        **os.environ,
        "PATH": f"{LABEL_ENV / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "TMPDIR": str(root / "tmp"),
        "MONAI_LABEL_SESSION_PATH": str(root / "sessions"),
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("VIRTUAL_ENV", None)
    cmd = start_command(served_folder["app"], root / "studies", port)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/info/", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                state = f"exited with {process.returncode}" if process.poll() is not None else "not ready in 180 s"
                pytest.fail(f"monailabel start_server {state}; log:\n{log_path.read_text()[-5000:]}")
            time.sleep(0.5)
        yield {"url": url, "log": log_path, **served_folder}
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def _post(url: str, file: Path | None, params: dict | str | None = None) -> tuple[int, str, bytes]:
    """POST a multipart form (``params``, ``file``) as MONAI Label clients do: (status, content type, body).
    ``file=None`` sends no file; a string ``params`` is sent as it is."""
    boundary = uuid.uuid4().hex
    params = params if isinstance(params, str) else json.dumps(params or {})
    fields = [(b'name="params"', b"application/json", params.encode())]
    if file is not None:
        fields.append((f'name="file"; filename="{file.name}"'.encode(), b"application/octet-stream", file.read_bytes()))
    body = b"".join(
        b"--%s\r\nContent-Disposition: form-data; %s\r\nContent-Type: %s\r\n\r\n%s\r\n"
        % (boundary.encode(), disposition, kind, data)
        for disposition, kind, data in fields
    )
    body += f"--{boundary}--\r\n".encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


def _multipart(content_type: str, body: bytes) -> dict[str, bytes]:
    """The parts of a ``multipart/form-data`` response by field name (``output=all``: ``params`` and ``image``)."""
    boundary = content_type.split("boundary=")[1].strip().encode()
    parts = {}
    for chunk in body.split(b"--" + boundary)[1:-1]:
        head, data = chunk[2:].split(b"\r\n\r\n", 1)
        name = head.split(b'name="')[1].split(b'"')[0].decode()
        parts[name] = data[:-2]  # the CRLF before the next boundary
    return parts


def _nifti(data: bytes, path: Path) -> nib.Nifti1Image:
    path.write_bytes(data)
    image = nib.load(str(path))
    image.get_fdata()  # read now, while the file is there
    return image


def _reference(server) -> tuple[np.ndarray, np.ndarray]:
    ref = server["reference"]
    return (
        np.asarray(nib.load(str(ref / "case_seg.nii.gz")).dataobj),
        np.asarray(nib.load(str(ref / "case_conf.nii.gz")).dataobj),
    )


def _infer(server, model: str, image: Path, output: str = "all"):
    return _post(f"{server['url']}/infer/{model}?output={output}", image)
