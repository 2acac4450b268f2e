"""Atomic file writes: a temporary file in the target's folder, renamed over the target, so no reader sees half a
file. A failed write is a one-line :class:`WriteError` naming the file, the cause and the fix (not ``torch.save``'s
``basic_ios::clear: iostream error``); written files get the user's umask, not mkstemp's ``0o600``."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "NotAFolderError",
    "WriteError",
    "check_folder",
    "copy_atomically",
    "ensure_folder",
    "fsync",
    "naming_write_failures",
    "save_atomically",
    "temporary_beside",
    "write_concurrently",
    "write_durably",
    "write_error",
    "write_json_atomically",
    "write_text_atomically",
    "write_text_durably",
]

_CAUSES = {
    errno.ENOSPC: ("the disk is full", "free space on that disk or write elsewhere"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space within your quota or write elsewhere"),
    errno.EFBIG: (
        "the file is larger than this process may write",
        "free space or raise the file size limit (ulimit -f)",
    ),
    errno.EROFS: ("the file system is read-only", "write to a writable folder"),
    errno.EACCES: ("no permission to write there", "make the folder writable (chmod u+w) or write elsewhere"),
    errno.EPERM: ("no permission to write there", "make the folder writable (chmod u+w) or write elsewhere"),
    errno.ENOTDIR: ("a file stands where a folder is needed", "remove or rename that file, or write elsewhere"),
    errno.EEXIST: ("a file stands where a folder is needed", "remove or rename that file, or write elsewhere"),
    errno.EISDIR: ("a folder stands where the file should go", "remove or rename that folder"),
}

_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class WriteError(OSError):
    """A file that could not be written; ``str()`` is one line: the file, the cause and the fix."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NotAFolderError(WriteError, NotADirectoryError):
    """A file stands where a folder is needed: bad input (``calib-monai`` exit code 2)."""


_UMASK_LOCK = threading.Lock()


def temporary_beside(path: str | os.PathLike) -> Path:
    """An empty file beside ``path`` (its suffixes kept: writers choose the format by extension), with the
    permissions a plain ``open`` gives (mkstemp's 0o600 would make every output private)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + "".join(path.suffixes))
    os.close(fd)
    with _UMASK_LOCK:  # reading the umask sets it: a case's files are written in threads
        mask = os.umask(0o022)
        os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    return Path(tmp)


def fsync(path: str | os.PathLike, folder: bool = False) -> None:
    """Flush the file ``path`` to disk; ``folder``: a folder, skipped where the file system cannot fsync one."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if not folder:
            raise


def _probe(tmp: str) -> OSError | None:
    """The ``OSError`` a plain write beside the failed one gets now (torch's C++ stream hides the errno of a full
    disk behind ``basic_ios::clear: iostream error``); None when it succeeds."""
    try:
        with open(tmp, "ab") as f:
            f.write(b"\0" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        return err
    return None


#: torch.save's words for a failed write (its C++ stream hides the errno)
_TORCH_WRITE_FAILURES = ("iostream error", "PytorchStreamWriter", "inline_container", "unexpected pos", "write failed")


def _io_failure(err: RuntimeError, tmp: str | None) -> bool:
    """Whether a ``RuntimeError`` of a writer is a failed write: torch's stream words, or a plain write beside it
    failing now."""
    if any(words in str(err) for words in _TORCH_WRITE_FAILURES):
        return True
    return tmp is not None and os.path.exists(tmp) and _probe(tmp) is not None


def _free_space(folder: Path) -> str:
    try:
        stat = os.statvfs(folder)
    except OSError:
        return ""
    return f"; {stat.f_bavail * stat.f_frsize / 2**20:.0f} MiB free there"


def write_error(
    path: str | os.PathLike, err: BaseException, tmp: str | None = None, shown: str | None = None
) -> WriteError:
    """One line for a failed write of ``path``: what, why (from the errno, or from a probe write when the writer hid
    it), and the fix; ``shown``: the failure's own words in the line (default ``Type: message`` of ``err``)."""
    path = Path(path)
    cause = err if isinstance(err, OSError) and err.errno in _CAUSES else None
    if cause is None and tmp is not None and os.path.exists(tmp):
        cause = _probe(tmp)
    if cause is None:  # not an errno we know: the writer's own words
        code = errno.ENOTDIR if isinstance(err, (NotADirectoryError, FileExistsError)) else None
        what = _CAUSES[code] if code else None
    else:
        what = _CAUSES.get(cause.errno)
    found = " (" + " ".join((shown or f"{type(err).__name__}: {err}").split()) + ")"
    if what is None:
        return WriteError(
            f"cannot write {path}{found}{_free_space(path.parent)}: check that its folder is writable and that the "
            "disk has space"
        )
    space = _free_space(path.parent) if cause is not None and cause.errno in _SPACE else ""
    return WriteError(f"cannot write {path}: {what[0]}{found}{space}; {what[1]}")


def check_folder(folder: str | os.PathLike, what: str = "output folder") -> Path:
    """``folder``, or a one-line ``WriteError`` when a file stands there or above it (nothing is created). ``what``
    starts the message (``"output folder"``, ``"cannot write x.pt: its folder"``)."""
    folder = Path(folder)
    for part in (folder, *folder.parents):
        if part.exists() or part.is_symlink():
            if not part.is_dir():
                where = "is a file" if part == folder else f"lies under {part}, which is a file"
                raise NotAFolderError(
                    f"{what} {folder} {where}, not a folder: pass a folder (it is created when missing), or "
                    "remove or rename that file"
                )
            break
    return folder


def ensure_folder(folder: str | os.PathLike, what: str = "output folder") -> Path:
    """``folder`` created when missing; a one-line ``WriteError`` when a file stands there (or above it) or it
    cannot be created (read-only, no permission)."""
    folder = check_folder(folder, what)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise write_error(folder, err) from err
    return folder


def _raise_named(path: Path, err: BaseException, tmp: str | None) -> None:
    """Raise the one-line ``WriteError`` of a failed write; return when ``err`` is ours already or no write failure
    (an object that does not pickle)."""
    if isinstance(err, WriteError) or (isinstance(err, RuntimeError) and not _io_failure(err, tmp)):
        return
    if isinstance(err, (OSError, RuntimeError)):
        raise write_error(path, err, tmp) from err


@contextmanager
def naming_write_failures(path: str | os.PathLike, tmp: str | os.PathLike | None = None) -> Iterator[None]:
    """Writes of ``path`` (to ``tmp`` beside it) inside the block fail as :func:`save_atomically`'s do: one line
    naming ``path``, the cause and the fix (for writers that stage several files themselves)."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        _raise_named(Path(path), err, None if tmp is None else str(tmp))
        raise


def save_atomically(obj: Any, path: str | os.PathLike, write: Callable[[Any, str], Any] | None = None) -> Path:
    """``write(obj, tmp)`` (``torch.save`` by default) to a temporary file beside ``path``, then renamed over it; a
    failure (``OSError``, or ``torch.save``'s ``RuntimeError``) is a one-line :class:`WriteError` naming ``path``."""
    path = Path(path)
    ensure_folder(path.parent, f"cannot write {path.name}: its folder")
    tmp = None
    try:
        tmp = str(temporary_beside(path))
        if write is None:
            import torch

            torch.save(obj, tmp)
        else:
            write(obj, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        _raise_named(path, err, tmp)
        raise
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
    return path


def write_durably(path: str | os.PathLike, write: Callable[[str], Any]) -> Path:
    """``write(tmp)`` to a temporary name beside ``path``, fsync, then rename: complete or absent after a power cut."""

    def written(obj, tmp):
        write(tmp)
        fsync(tmp)

    return save_atomically(None, path, write=written)


def write_concurrently(writes: Sequence[Callable[[], Any]]) -> list:
    """Run ``writes`` (a file each) in threads; their results in order, and the first error once all have ended.
    Why: a case's files are written side by side (zlib, most of the time, releases the GIL)."""
    if len(writes) < 2:
        return [write() for write in writes]
    with ThreadPoolExecutor(max_workers=len(writes), thread_name_prefix="calib_monai_write") as pool:
        futures = [pool.submit(write) for write in writes]
    return [future.result() for future in futures]


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """``text`` to ``path``, atomically."""
    return save_atomically(text, path, write=lambda t, tmp: Path(tmp).write_text(t))


def write_text_durably(path: str | os.PathLike, text: str) -> Path:
    """``text`` to ``path`` as :func:`write_durably` writes: complete or absent after a power cut."""
    return write_durably(path, lambda tmp: Path(tmp).write_text(text))


def write_json_atomically(path: str | os.PathLike, data: Any, indent: int = 2) -> Path:
    """``data`` as JSON (``default=str`` for paths and the like) to ``path``, atomically."""
    return write_text_atomically(path, json.dumps(data, indent=indent, default=str) + "\n")


def copy_atomically(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """A copy of the file ``source`` at ``target``, atomically."""
    return save_atomically(source, target, write=lambda s, tmp: shutil.copyfile(s, tmp))
