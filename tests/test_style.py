"""One formatter and linter for the whole tree (``pyproject.toml``'s ``[tool.ruff]``): CI fails on a violation."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import REPO_ROOT


def _ruff() -> str:
    found = shutil.which("ruff", path=str(REPO_ROOT / ".venv" / "bin")) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[tests]' installs it)")
    return found


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_the_tree_is_formatted_and_clean(command):
    done = subprocess.run([_ruff(), *command, "."], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"ruff {' '.join(command)} found problems; run `ruff format . && ruff check --fix .` and commit:\n"
        + (done.stdout + done.stderr)[-4000:]
    )


def test_the_ruff_that_runs_is_the_pinned_one():
    """Another ruff version formats differently: the tests' extra pins the one the tree is formatted with."""
    version = subprocess.run([_ruff(), "--version"], capture_output=True, text=True, timeout=60).stdout.split()[-1]
    pinned = re.search(r'"ruff==([0-9.]+)"', (REPO_ROOT / "pyproject.toml").read_text())
    assert pinned is not None and pinned.group(1) == version, f"ruff {version} runs; pyproject.toml pins {pinned}"


def test_no_module_of_the_package_studies_or_scripts_is_over_400_lines():
    """The house's size rule (issue 32.9): a module past 400 lines is split by concept before it lands."""
    too_long = {
        str(path.relative_to(REPO_ROOT)): lines
        for folder in ("calib_monai", "studies", "scripts", "bundle_factory")
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > 400
    }
    assert not too_long, f"over 400 lines: {too_long}; split them by concept"
