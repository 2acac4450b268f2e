"""Shared fixtures: where the real data of ../shared/data lives, and skips when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def _shared_dataset(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real data set {name} not found at {path} (expected ../shared/data beside the repository)")
    return path


@pytest.fixture(scope="session")
def hippocampus_dir() -> Path:
    return _shared_dataset("Task04_Hippocampus")


@pytest.fixture(scope="session")
def acdc_dir() -> Path:
    return _shared_dataset("ACDC")
