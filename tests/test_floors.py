"""The floors of the house, enforced: the table in DEVELOPERS.md ("## The house") against the package's imports.

Each line of that table names the rooms of one floor (folders as ``name/``, modules as ``name.py``), the top floor
first. A module may import from its own room and from rooms on its own floor or below, never from a floor above, and
never another room's private module (``calib_monai.<room>._name``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "calib_monai"
ROOM_TOKEN = re.compile(r"^[A-Za-z_][\w]*(/|\.py)$")


def floor_table() -> dict[str, int]:
    """Room -> floor (0 = the ground floor) from the first fenced block after "## The house" in DEVELOPERS.md."""
    text = (ROOT / "DEVELOPERS.md").read_text()
    section = text.split("## The house", 1)[1]
    block = section.split("```", 2)[1]
    floors: list[list[str]] = []
    for line in block.splitlines():
        rooms = []
        for token in re.split(r"\s{2,}", line.strip())[0].replace("calib_monai/", "").split():
            if not ROOM_TOKEN.match(token):
                break
            rooms.append(token.rstrip("/"))
        if rooms:
            floors.append(rooms)
    return {room: len(floors) - 1 - i for i, rooms in enumerate(floors) for room in rooms}


def room_of(module: str) -> str | None:
    """``calib_monai.metrics.case_quality`` -> ``metrics``; ``calib_monai.atomic`` -> ``atomic.py``."""
    parts = module.split(".")
    if parts[0] != "calib_monai" or len(parts) < 2:
        return None
    return parts[1] if (PACKAGE / parts[1]).is_dir() else f"{parts[1]}.py"


def imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of ``path`` (relative imports resolved); ``source``: its text."""
    package = ["calib_monai", *path.relative_to(PACKAGE).parts[:-1]]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found.append((node.lineno, module))
            # `from calib_monai.metrics import _inputs` imports a private module too
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names if a.name.startswith("_")]
    return found


def test_the_table_names_every_room():
    table = floor_table()
    rooms = {p.name if p.is_dir() else p.name for p in PACKAGE.iterdir() if not p.name.startswith(("_", "."))}
    rooms = {r for r in rooms if r.endswith(".py") or (PACKAGE / r / "__init__.py").exists()}
    assert rooms - set(table) == set(), "rooms missing from DEVELOPERS.md's floor table"
    assert table["atomic.py"] == 0 and table["cli.py"] > table["metrics"]  # the table reads top floor first


def test_no_import_runs_up_a_floor_or_into_another_rooms_private_module():
    table = floor_table()
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = room_of(".".join(["calib_monai", *path.relative_to(PACKAGE).with_suffix("").parts]))
        for line, module in imports(path):
            room = room_of(module)
            if room is None or room == own:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports {module}"
            if table.get(room, -1) > table.get(own, -1):
                wrong.append(f"{where}: {room} is on floor {table.get(room)}, above {own} (floor {table.get(own)})")
            if any(part.startswith("_") and part != "__init__" for part in module.split(".")[2:]):
                wrong.append(f"{where}: another room's private module")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from calib_monai.metrics import _private\n", "calib_monai.metrics._private"),
        ("from . import x\n", "calib_monai.metrics"),
    ],
)
def test_imports_sees_private_modules_and_relative_imports(source, expected):
    """The checker itself: a private module named in ``from ... import`` and a relative import are both seen."""
    found = [module for _, module in imports(PACKAGE / "metrics" / "probe.py", source)]
    assert f"calib_monai.metrics.{expected}" in found or expected in found
