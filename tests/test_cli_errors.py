"""``calib-monai`` subcommands end an error with one line and an exit code, not a ~24-line traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, env: dict | None = None) -> tuple[int, list[str]]:
    result = subprocess.run(
        [sys.executable, "-m", "calib_monai.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    return result.returncode, result.stderr.strip().splitlines()


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    code, lines = _cli("calibrate-probabilities", str(tmp_path / "missing"), str(tmp_path), str(tmp_path / "out"))
    assert code == 2 and lines == [
        f"calib-monai: error: {tmp_path / 'missing'} is not a folder (it does not exist, or it is a file)"
    ]
    bundle = tmp_path / "nacl_hpc"
    shutil.copytree(REPO / "bundles" / "nacl_hpc" / "configs", bundle / "configs")
    code, lines = _cli("slicer", str(bundle), "case_001")
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(
        f"calib-monai: error: {bundle / 'inference'} has no case_001_seg.nii.gz or "
        "case_001_conf.nii.gz: run the bundle's inferring step on the image first"
    )
    code, lines = _cli("export", str(bundle))
    assert code == 2 and lines[-1].startswith(
        f"calib-monai: error: checkpoint {bundle / 'models' / 'model.pt'} not found: train it first"
    )
    assert "--checkpoint" in lines[-1] and not any("Traceback" in line for line in lines)


def test_the_traceback_on_request(tmp_path):
    code, lines = _cli(
        "calibrate-probabilities",
        str(tmp_path / "missing"),
        str(tmp_path),
        str(tmp_path / "out"),
        env={"CALIB_MONAI_TRACEBACK": "1"},
    )
    assert code == 2 and lines[0].startswith("Traceback") and lines[-1].startswith("calib-monai: error: ")
