"""Checked copies of MONAI Label routes (imports FastAPI and MONAI Label).

MONAI Label answers ``POST /infer/{model}`` without input with a 500 and leaves a failed request's upload in
``TMPDIR``: ``check_infer_route`` answers a 400 for no input or bad ``params`` and names the uploaded fields so the app
removes them when it fails; ``check_label_route`` checks a ``PUT /datastore/label`` before MONAI Label stores it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from fastapi import HTTPException

__all__ = ["check_infer_route", "check_label_route", "remove_uploads", "uploaded_fields"]

# the fields of the request being served that MONAI Label filled with an uploaded file ("image", "label")
uploaded_fields: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("uploaded_fields", default=frozenset())

NO_INPUT = (
    "no image to segment: send the image file as the multipart form field 'file' (or name a datastore image "
    "with ?image=<id>, or a session with ?session_id=<id>)"
)


def remove_uploads(request: Mapping, fields: Iterable[str]) -> None:
    """Remove the uploaded files of ``request`` (its ``fields`` holding a path): only files directly in the temporary
    folder, where MONAI Label writes uploads, never a datastore or session image."""
    tmp = os.path.realpath(tempfile.gettempdir())
    for name in fields:
        path = request.get(name)
        if isinstance(path, str) and os.path.dirname(os.path.realpath(path)) == tmp:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def _put_first(path: str, method: str, endpoint: Callable) -> bool:
    """Add ``endpoint`` before MONAI Label's own route (routes match in order), unless a reloaded app did."""
    from monailabel.config import settings

    router = sys.modules["monailabel.app"].app.router
    if any(getattr(getattr(route, "endpoint", None), "_calib_monai_route", None) == path for route in router.routes):
        return True
    endpoint._calib_monai_route = path  # type: ignore[attr-defined]
    router.add_api_route(f"{settings.MONAI_LABEL_API_STR}{path}", endpoint, methods=[method], include_in_schema=False)
    router.routes.insert(0, router.routes.pop())
    return True


def _params(kwargs: Mapping) -> dict:
    try:
        return json.loads(kwargs.get("params") or "{}")
    except json.JSONDecodeError as err:
        raise HTTPException(status_code=400, detail=f"the form field 'params' is not JSON ({err})") from err


def check_infer_route() -> bool:
    """Put the checked ``POST /infer/{model}`` first in the running server; False when no server runs here."""
    if sys.modules.get("monailabel.app") is None:
        return False
    from monailabel.endpoints.infer import api_run_inference

    @functools.wraps(api_run_inference)  # the same signature: FastAPI parses the same form, query and dependencies
    async def checked_infer(**kwargs):
        if not (kwargs.get("file") or kwargs.get("image") or kwargs.get("session_id")):
            raise HTTPException(status_code=400, detail=NO_INPUT)
        _params(kwargs)  # checked before MONAI Label copies the upload, which a bad params would leave behind
        token = uploaded_fields.set(frozenset(k for k, f in (("image", "file"), ("label", "label")) if kwargs.get(f)))
        try:
            return await api_run_inference(**kwargs)
        finally:
            uploaded_fields.reset(token)

    return _put_first("/infer/{model}", "POST", checked_infer)


def check_label_route(check: Callable[[str, str, dict], None]) -> bool:
    """Put a checked ``PUT /datastore/label`` first in the running server: a ``final`` label is written to a
    temporary file and passed to ``check(image_id, label_path, params)``, which raises an ``HTTPException`` for a
    label the app refuses; then MONAI Label's route stores it. False without a server."""
    if sys.modules.get("monailabel.app") is None:
        return False
    from monailabel.endpoints.datastore import api_save_label

    @functools.wraps(api_save_label)
    async def checked_save_label(**kwargs):
        if (kwargs.get("tag") or "final") == "final":
            params = _params(kwargs)
            upload = kwargs["label"]
            suffix = "".join(Path(upload.filename or "label.nii.gz").suffixes) or ".nii.gz"
            handle, path = tempfile.mkstemp(suffix=suffix)
            try:
                with os.fdopen(handle, "wb") as out:
                    shutil.copyfileobj(upload.file, out)
                upload.file.seek(0)  # MONAI Label's route reads it again
                check(kwargs["image"], path, params if isinstance(params, dict) else {})
            finally:
                os.remove(path)
        return await api_save_label(**kwargs)

    return _put_first("/datastore/label", "PUT", checked_save_label)
