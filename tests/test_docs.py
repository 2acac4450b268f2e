"""The guides per role (``docs/trainer.md``, ``docs/site.md``, ``docs/nnunet.md``) stay true and stay there.

Convention: a shell block a test runs is fenced with the info string ``bash runnable`` (```` ```bash runnable ````);
plain ```` ```bash ```` blocks are examples that need real data, a GPU or minutes. Runnable blocks must be cheap (demo
data; a one-epoch override only when the page itself shows it). Each runs with ``bash -euo pipefail`` in a fresh
scratch folder that holds:

- ``bundles`` (a link to the repository's), so ``bundles/<name>/configs/...`` paths work as from the repository root;
- ``predictions/``, ``val_predictions/`` and ``labelsTr/``: nnU-Net's own output for one case and its label
  (``tests/data/nnunet``), for ``docs/nnunet.md``;
- ``case.nii.gz``: the MONAI Label test server's image, for ``docs/site.md``;

with this environment's ``python`` and ``calib-monai`` first on ``PATH``. The one substitution: in ``docs/site.md``
blocks, ``127.0.0.1:8000`` becomes the address of the test session's real MONAI Label server (``tests/label_server.py``,
which also takes its ``monailabel start_server`` command from that page). Nothing else of a block is changed.

Required sections: the headings listed in ``SECTIONS`` must exist (a section that disappears fails CI), and README
must link every guide.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import pytest

from conftest import REPO_ROOT
from label_server import needs_label_env

DOCS = ("docs/trainer.md", "docs/site.md", "docs/nnunet.md")
SECTIONS = {
    "README.md": [
        "## Two commands",
        "## Guides by role",
        "## The library",
        "## Is this case right?",
    ],
    "docs/trainer.md": [
        "# Training the bundles",
        "## Bundles",
        "## Real data",
        "## Settings and model selection",
        "## After training: calibrate, evaluate, segment, export",
        "### Review in 3D Slicer",
        "## One GPU",
        "## Several GPUs (torchrun)",
        "## Resume",
        "## The MONAI model zoo",
    ],
    "docs/site.md": [
        "# Serving with MONAI Label",
        "## Site administrator",
        "### Set up and start the server",
        "### What the server offers per bundle",
        "### Training from submitted labels",
        "## Annotator (3D Slicer)",
        "### The review segments and the flag",
    ],
    "docs/nnunet.md": [
        "# Measure and fix the calibration of probabilities saved elsewhere",
        "## Inputs",
        "## Run it",
        "## Outputs",
        "## Geometry",
    ],
}
RUNNABLE = re.compile(r"^```bash runnable\n(.*?)^```$", re.S | re.M)
NNUNET = REPO_ROOT / "tests" / "data" / "nnunet"


def runnable_blocks(doc: str) -> list[str]:
    """The ``bash runnable`` blocks of ``doc`` (a path relative to the repository), in page order."""
    return RUNNABLE.findall((REPO_ROOT / doc).read_text())


def _blocks() -> list:
    return [pytest.param(doc, i, id=f"{Path(doc).stem}-{i}") for doc in DOCS for i in range(len(runnable_blocks(doc)))]


@pytest.mark.parametrize("doc", sorted(SECTIONS))
def test_required_sections_exist(doc):
    headings = [line for line in (REPO_ROOT / doc).read_text().splitlines() if line.startswith("#")]
    missing = [h for h in SECTIONS[doc] if not any(line.startswith(h) for line in headings)]
    assert not missing, f"{doc} lost the section(s) {missing}: restore them (tests/test_docs.py SECTIONS)"


def test_readme_links_every_guide_and_every_guide_has_a_runnable_block():
    readme = (REPO_ROOT / "README.md").read_text()
    for doc in DOCS:
        assert f"({doc})" in readme, f"README.md does not link {doc}"
        assert runnable_blocks(doc), f"{doc} has no ```bash runnable block"


def _scratch(tmp_path: Path) -> Path:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "bundles").symlink_to(REPO_ROOT / "bundles")
    shutil.copytree(NNUNET / "predictions", scratch / "predictions")
    shutil.copytree(NNUNET / "predictions", scratch / "val_predictions")
    shutil.copytree(NNUNET / "labelsTr", scratch / "labelsTr")
    return scratch


def _run(block: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, (
        f"block failed (exit {done.returncode}):\n{block}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


@pytest.mark.parametrize("doc, index", [p for p in _blocks() if p.values[0] != "docs/site.md"])
def test_runnable_block(tmp_path, doc, index):
    scratch = _scratch(tmp_path)
    _run(runnable_blocks(doc)[index], scratch)
    if doc == "docs/nnunet.md":
        comparison = (scratch / "report" / "comparison.csv").read_text()
        assert comparison.startswith("metric,before,after")
        # the fixture's fit cases are the scored ones: the record says so
        fitted = json.loads((scratch / "report" / "temperature.json").read_text())
        assert fitted["temperature"] > 0 and fitted["fitted_on"] == ["case_001"] and fitted["in_sample"] is True
        # one fit case cannot be cross-fitted: the contours' lambdas are null and say why
        contours = json.loads((scratch / "report" / "contours" / "contours.json").read_text())
        assert all(c["lambda_out"] is None and "needs at least" in c["reason"] for c in contours["classes"].values())
    if doc == "docs/trainer.md" and "runs/check" in runnable_blocks(doc)[index]:
        history = json.loads((scratch / "runs" / "check" / "validation_history.json").read_text())
        assert len(history) == 1 and (scratch / "runs" / "check" / "model.pt").is_file()


@needs_label_env
@pytest.mark.parametrize("doc, index", [p for p in _blocks() if p.values[0] == "docs/site.md"])
def test_runnable_block_against_the_server(tmp_path, server, doc, index):
    scratch = _scratch(tmp_path)
    shutil.copy(server["images"]["case"], scratch / "case.nii.gz")
    address = server["url"].removeprefix("http://")
    _run(runnable_blocks(doc)[index].replace("127.0.0.1:8000", address), scratch)
    answer = json.loads((scratch / "case.json").read_text())
    assert answer["label_names"]["background"] == 0 and "quality" in answer
    assert nib.load(str(scratch / "case_conf.nii.gz")).shape == nib.load(str(scratch / "case.nii.gz")).shape
    assert json.loads((scratch / "info.json").read_text())["name"] == "calib-monai"
