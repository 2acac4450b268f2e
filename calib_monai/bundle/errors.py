"""Errors as the user should see them: one clear last line, the traceback on request.

A bundle error used to end in 2-3 chained tracebacks (70-170 lines) whose last line was MONAI's generic "Failed to
instantiate component", with the project's own message somewhere in the middle; a data error could end the process
with "terminate called without an active exception" (exit 134) as threads were torn down at interpreter exit.

:func:`error_line` finds the message that says what is wrong: the innermost exception of the chain raised by
calib_monai's own code (else the innermost one), prefixed with the config id whose component failed to build.
:func:`report_errors` (called first in every generated bundle's ``initialize``, never on import) installs a
``sys.excepthook`` that prints that line last and ends the process with exit code 1 at once (``os._exit`` after
flushing, so no thread teardown can turn it into an abort), in ``python -m monai.bundle run`` processes (a program
that runs a ``ConfigWorkflow`` itself keeps its exceptions). ``CALIB_MONAI_TRACEBACK=1`` prints the full traceback
before the line; ``CALIB_MONAI_TRACEBACK=python`` (or a config without the ``report_errors`` step) leaves Python's
own handling in place.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path
from types import TracebackType

__all__ = ["TRACEBACK_ENV", "error_chain", "error_line", "report_errors"]

TRACEBACK_ENV = "CALIB_MONAI_TRACEBACK"
_PACKAGE = str(Path(__file__).resolve().parents[1])  # calib_monai/
_installed: dict[str, object] = {}


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
    """``"<id> (<target>)"`` of the innermost MONAI config component being built when the error happened, or ``""``
    (expressions of the workflow lists, ``run#1``, name nothing useful)."""
    try:
        from monai.bundle.config_item import ConfigComponent
    except ImportError:  # pragma: no cover - monai is a dependency
        return ""
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


def error_line(err: BaseException) -> str:
    """The one line that says what went wrong: the innermost message raised by calib_monai (else the innermost of
    the chain), with the failing component's config id in front and the exception type unless it is ours."""
    chain = error_chain(err)
    ours = [e for e in chain if _raised_by_us(e)]
    chosen = ours[-1] if ours else chain[-1]
    text = _text(chosen) or type(chosen).__name__
    if not ours:
        text = f"{type(chosen).__name__}: {text}"
    component = _config_component(chain)
    if component and component.split(" ")[0] not in text:
        text = f"{component}: {text}"
    return text


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
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # at once: worker and pool threads cannot abort the teardown (exit 134)


def report_errors(enabled: bool = True, force: bool = False) -> bool:
    """Install the one-line error report in this process (``enabled=False`` removes it); returns True.

    Called by the bundles' ``initialize``. It takes effect in ``python -m monai.bundle run`` processes (also under
    torchrun) only, unless ``force``: a program that builds a ``ConfigWorkflow`` itself gets its exceptions as
    usual. ``CALIB_MONAI_TRACEBACK=python`` keeps Python's own handler."""
    from .settings import _is_bundle_runner

    if enabled and "previous" not in _installed and (force or _is_bundle_runner(sys.argv)):
        _installed["previous"] = sys.excepthook
        sys.excepthook = _hook
    elif not enabled and "previous" in _installed:
        sys.excepthook = _installed.pop("previous")  # type: ignore[assignment]
    return True
