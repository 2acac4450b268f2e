"""The site monitor's storage (:mod:`calib_monai.review.site_monitor` says what it records): the small
``<folder>/site.json`` (the stream's running state, rewritten atomically on each served case) and the append-only
``<folder>/site_cases.jsonl``, one served case a line (``{"hash", "rank", "signal_ranks"}``), which a site admin or a
replay reads and in which a case's image is looked up (one scan of the file's bytes, not a parse); and the OS lock
(:func:`locked`) that each read-modify-write of the two holds.

Why two files: rewriting every case seen on each served case costs in proportion to the stream
(``docs/results/benchmarks/site_monitor.md``). Under the monitor's lock a case is appended to the log (flushed and
synced) before ``site.json`` records the log's new size; a write stopped between the two leaves the log longer than
recorded: that case was never answered, and :func:`recover` cuts it off. A log shorter than recorded is corrupt.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from calib_monai.atomic import ensure_folder, write_error

__all__ = [
    "CASES_FILE",
    "SITE_FILE",
    "append_case",
    "locked",
    "read_cases",
    "recover",
    "remove_log",
    "reset_site",
    "seen",
    "site_folder",
    "write_log",
]

SITE_FILE = "site.json"
CASES_FILE = "site_cases.jsonl"
LOCK_TIMEOUT_S = 60.0  # a read-modify-write takes milliseconds: a longer wait means a hung holder


@contextmanager
def locked(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """An exclusive OS lock (``fcntl.flock``) on ``path`` (a lock file that is never removed, so every holder locks
    the same file; the system drops it when its holder dies). Blocking: a second server waits its turn. The training
    lock (``handlers.checkpoint.OutputFolderLock``) is a floor above and refuses a second holder instead of waiting."""
    import fcntl

    ensure_folder(path.parent, f"cannot write {path.name}: its folder")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise write_error(path, err) from err
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"site monitor: {path} has been locked for {timeout_s:.0f} s by another process: find the "
                        f"process that holds it (fuser {path}) and stop it"
                    ) from None
                time.sleep(0.01)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _log(folder: Path) -> Path:
    return folder / CASES_FILE


def _size(folder: Path) -> int:
    try:
        return _log(folder).stat().st_size
    except FileNotFoundError:
        return 0
    except OSError as err:
        raise write_error(_log(folder), err) from err


def recover(folder: Path, recorded: int, corrupt: Callable[[str], Exception]) -> None:
    """Bring the log back to the ``recorded`` bytes of ``site.json``: longer (a write stopped before ``site.json``
    recorded it) is cut back; shorter raises ``corrupt(what)``. Call under the monitor's lock."""
    size = _size(folder)
    if size < recorded:
        raise corrupt(f"{_log(folder)} holds {size} bytes, site.json records {recorded}")
    if size > recorded:
        try:
            os.truncate(_log(folder), recorded)
        except OSError as err:
            raise write_error(_log(folder), err) from err


def _read(folder: Path, size: int) -> bytes:
    if not size:
        return b""
    try:
        with open(_log(folder), "rb") as f:
            return f.read(size)
    except OSError as err:
        raise write_error(_log(folder), err) from err


def seen(folder: Path, size: int, case_hash: str) -> bool:
    """Whether the first ``size`` bytes of the log hold a case of this image hash: the line's opening, found by a
    byte search (a JSON string's quotes are escaped inside it, so the opening matches only at a line's start)."""
    opening = ('{"hash": ' + json.dumps(case_hash) + ", ").encode()
    data = _read(folder, size)
    return data.startswith(opening) or b"\n" + opening in data


def append_case(folder: Path, size: int, case: Mapping[str, Any]) -> int:
    """Append ``case`` (``{"hash", "rank", "signal_ranks"}``, in this order) as one line to the log of ``size`` bytes
    (:func:`recover` under the same lock), synced to disk; returns the log's new size, for ``site.json`` to record."""
    line = (json.dumps(dict(case)) + "\n").encode()
    try:
        with open(_log(folder), "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        raise write_error(_log(folder), err) from err
    return size + len(line)


def write_log(folder: Path, cases: list[Mapping[str, Any]]) -> int:
    """The log of these ``cases`` (in order), written whole over any there (a prefilled stream: the benchmarks);
    returns its size, for ``site.json`` to record."""
    data = "".join(json.dumps(dict(case)) + "\n" for case in cases).encode()
    try:
        _log(folder).write_bytes(data)
    except OSError as err:
        raise write_error(_log(folder), err) from err
    return len(data)


def read_cases(folder: Path, size: int) -> list[dict[str, Any]]:
    """The served cases in the log's first ``size`` bytes, in their order."""
    return [json.loads(line) for line in _read(folder, size).splitlines()]


def remove_log(folder: Path) -> None:
    """Remove the log (after ``site.json``: a log without it is cut back to nothing at the next case)."""
    try:
        _log(folder).unlink(missing_ok=True)
    except OSError as err:
        raise write_error(_log(folder), err) from err


def site_folder(folder: str | os.PathLike) -> Path:
    """``folder`` as a site monitor's folder, or a one-line error."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"site folder {folder} does not exist or is not a folder: pass the folder of site.json")
    return folder


def reset_site(folder: str | os.PathLike) -> dict[str, Any]:
    """``calib-monai site reset FOLDER``: clear ``FOLDER/site.json`` and its case log (also a corrupt one, another
    model's, or one that keeps an earlier model's alarm)."""
    folder = site_folder(folder)
    path = folder / SITE_FILE
    with locked(folder / (SITE_FILE + ".lock")):
        try:
            cleared: int | str = int(json.loads(path.read_text())["cases"]) if path.exists() else 0
        except (OSError, ValueError, KeyError, TypeError):
            cleared = "unreadable"
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            raise write_error(path, err) from err
        remove_log(folder)
    return {"file": str(path), "cleared_cases": cleared, "cases": 0, "alarm": False}
