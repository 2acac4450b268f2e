"""Errors as the user should see them: one clear last line, the traceback on request.

:func:`error_line` picks the message that says what is wrong (the innermost raised by calib_monai, else the
innermost of the chain), prefixed with the config id whose component failed to build. :func:`report_errors` (every
bundle's ``initialize``) installs a ``sys.excepthook`` that prints that line last and exits with code 1 at once.
``CALIB_MONAI_TRACEBACK=1`` prints the traceback first; ``CALIB_MONAI_TRACEBACK=python`` keeps Python's handling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

__all__ = ["TRACEBACK_ENV", "error_chain", "error_line", "on_error_exit", "report_errors"]

TRACEBACK_ENV = "CALIB_MONAI_TRACEBACK"
_PACKAGE = str(Path(__file__).resolve().parents[1])  # calib_monai/
_installed: dict[str, object] = {}
_ON_ERROR_EXIT: dict[str, Callable[[], object]] = {}


def error_chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions behind it (``raise ... from``, or raised while handling), outermost first."""
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        chain.append(err)
        seen.add(id(err))
        err = err.__cause__ if err.__cause__ is not None else (None if err.__suppress_context__ else err.__context__)
    return chain


def _frames(err: BaseException) -> list:
    return [frame for frame, _ in traceback.walk_tb(err.__traceback__)]


def _raised_by_us(err: BaseException) -> bool:
    frames = _frames(err)
    return bool(frames) and os.path.abspath(frames[-1].f_code.co_filename).startswith(_PACKAGE)


def _config_component(chain: list[BaseException]) -> str:
    """``"<id> (<target>)"`` of the innermost MONAI config component being built when the error happened, or ``""``."""
    from monai.bundle.config_item import ConfigComponent

    for err in reversed(chain):
        for frame in reversed(_frames(err)):
            item = frame.f_locals.get("self")
            if isinstance(item, ConfigComponent):
                target = item.get_config().get("_target_", "") if isinstance(item.get_config(), dict) else ""
                return f"{str(item.get_id()).replace('::', '#')} ({target})"
    return ""


def _text(err: BaseException) -> str:
    message = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
    return " ".join(str(message).split())  # one line


_NO_WRITER = re.compile(r"cannot find a suitable writer for (?P<file>.+?)\.\s*\n")
_RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception)): (?P<text>.*)$")
_ERRNO = re.compile(r"\[Errno (?P<code>\d+)\]")


def _writer_failure(err: BaseException) -> str | None:
    """MONAI's ``SaveImage`` turns any writer failure (read-only folder, full disk) into "cannot find a suitable
    writer", the real error only as text inside: the line naming the file and why (``atomic.write_error``)."""
    found = _NO_WRITER.search(str(err))
    if not isinstance(err, RuntimeError) or found is None:
        return None
    raised = [m for m in (_RAISED.match(line.strip()) for line in str(err).splitlines()) if m]
    if not raised:
        return None
    last = raised[-1]
    if last["type"].endswith("WriteError"):  # calib_monai's writers have said it already
        return last["text"]
    code = _ERRNO.search(last["text"])
    inner = OSError(int(code["code"]), last["text"]) if code else RuntimeError(last["text"])
    from calib_monai.atomic import write_error

    return str(write_error(found["file"], inner, shown=f"{last['type'].rsplit('.', 1)[-1]}: {last['text']}"))


def error_line(err: BaseException) -> str:
    """The one line that says what went wrong (see the module), with the exception type unless it is ours."""
    chain = error_chain(err)
    written = next((line for line in map(_writer_failure, reversed(chain)) if line), None)
    if written is not None:
        return written
    ours = [e for e in chain if _raised_by_us(e)]
    index = chain.index(ours[-1]) if ours else len(chain) - 1
    while index > 0 and chain[index - 1] in ours and chain[index - 1].__cause__ is chain[index]:
        index -= 1  # our own ``raise ... from`` wrote the outer line to explain the inner: it says where and the fix
    chosen = chain[index]
    text = _text(chosen) or type(chosen).__name__
    if not ours:
        text = f"{type(chosen).__name__}: {text}"
    component = _config_component(chain)
    if component and component.split(" ")[0] not in text:
        text = f"{component}: {text}"
    return text


def on_error_exit(key: str, cleanup: Callable[[], object] | None) -> None:
    """Run ``cleanup`` when the error report ends the process (``os._exit`` runs no ``atexit``); None removes it."""
    if cleanup is None:
        _ON_ERROR_EXIT.pop(key, None)
    else:
        _ON_ERROR_EXIT[key] = cleanup


def _hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    mode = os.environ.get(TRACEBACK_ENV, "").strip().lower()
    if issubclass(exc_type, KeyboardInterrupt) or mode == "python":
        sys.__excepthook__(exc_type, exc, tb)
        return
    if mode in ("1", "true", "yes", "on"):
        traceback.print_exception(exc_type, exc, tb)
    else:
        print(f"(the full traceback: run again with {TRACEBACK_ENV}=1)", file=sys.stderr)
    print(f"ERROR: {error_line(exc)}", file=sys.stderr)
    for cleanup in list(_ON_ERROR_EXIT.values()):  # e.g. the output folder's training lock
        with contextlib.suppress(Exception):  # the error line is out; nothing may stop the exit
            cleanup()
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # at once: worker and pool threads cannot abort the teardown (exit 134)


def report_errors(enabled: bool = True, force: bool = False) -> bool:
    """Install the one-line error report (``enabled=False`` removes it) in ``python -m monai.bundle run`` processes
    only, unless ``force``: a program building a ``ConfigWorkflow`` gets its exceptions as usual. Returns True."""
    from .overrides import is_bundle_runner

    if enabled and "previous" not in _installed and (force or is_bundle_runner(sys.argv)):
        _installed["previous"] = sys.excepthook
        sys.excepthook = _hook
    elif not enabled and "previous" in _installed:
        sys.excepthook = _installed.pop("previous")  # type: ignore[assignment]
    return True
