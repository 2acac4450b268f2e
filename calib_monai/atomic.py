"""Atomic file writes: the content goes to a temporary file in the target's folder, then is renamed over the target,
so a reader (or a run killed mid-write and resumed) never sees half a file. Every writer of the package uses these."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["copy_atomically", "save_atomically", "write_json_atomically", "write_text_atomically"]


def save_atomically(obj: Any, path: str | os.PathLike, write: Callable[[Any, str], Any] | None = None) -> Path:
    """``write(obj, tmp)`` (``torch.save`` by default) to a temporary file beside ``path``, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the target's suffixes kept: writers that choose the format by extension (nibabel, matplotlib) still can
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + "".join(path.suffixes))
    os.close(fd)
    try:
        if write is None:
            import torch

            torch.save(obj, tmp)
        else:
            write(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """``text`` to ``path``, atomically."""
    return save_atomically(text, path, write=lambda t, tmp: Path(tmp).write_text(t))


def write_json_atomically(path: str | os.PathLike, data: Any, indent: int = 2) -> Path:
    """``data`` as JSON (``default=str`` for paths and the like) to ``path``, atomically."""
    return write_text_atomically(path, json.dumps(data, indent=indent, default=str) + "\n")


def copy_atomically(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """A copy of the file ``source`` at ``target``, atomically."""
    return save_atomically(source, target, write=lambda s, tmp: shutil.copyfile(s, tmp))
