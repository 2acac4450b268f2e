"""Network weights of a bundle: one reader for every ``model.pt`` layout the bundles have written."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

__all__ = [
    "WeightsFileError",
    "load_network_weights",
    "loaded_sha256",
    "torchscript_allowed",
    "read_weights_file",
    "unwrap_network",
    "weights_state_dict",
]
_LOADED: dict[str, str] = {}  # real path -> SHA-256 of the bytes this process last loaded from it

#: the fix of a bad ``model.pt``, for messages
RETRAIN = (
    "train the bundle again (python -m monai.bundle run training --config_file <bundle>/configs/train.json), or "
    "copy the model.pt of the run you want to use again"
)


@contextlib.contextmanager
def torchscript_allowed():
    """Ignore torch's warnings on ``torch.jit`` calls inside: ``model.ts`` is the format MONAI bundles ship, and the
    warning (once per scripted submodule) speaks to torch's developers, not to the user exporting or serving."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
        yield


class WeightsFileError(ValueError):
    """A weights or checkpoint file that cannot be used; the message names the file, what is wrong and the fix."""


def _unreadable_reason(path: Path, err: BaseException) -> str:
    """What is wrong with a file ``torch.load`` failed on, in words (never torch's advice to load it unsafely)."""
    size = path.stat().st_size
    if size == 0:
        return "the file is empty (0 bytes)"
    with open(path, "rb") as f:
        head = f.read(4)
    unsafe = isinstance(err, pickle.UnpicklingError) and "weights_only" in str(err).lower()
    objects = (
        "it holds Python objects other than tensors and numbers, so it is not a state_dict or checkpoint "
        "written by calib_monai, and it is not loaded (loading it would run code from the file)"
    )
    if head == b"PK\x03\x04":
        if not zipfile.is_zipfile(path):
            return f"the file is cut off ({size} bytes; an interrupted write, copy or download?)"
        return objects if unsafe else f"the archive is damaged ({type(err).__name__})"
    if head[:1] == b"\x80":  # a bare pickle (torch's legacy format)
        return objects if unsafe else f"the pickle is damaged or cut off ({size} bytes)"
    return f"it is not a PyTorch file ({size} bytes that do not start like one)"


def read_weights_file(
    path: str | os.PathLike, map_location: Any = "cpu", what: str = "network weights", fix: str = RETRAIN
) -> Any:
    """``torch.load(path, weights_only=True)`` of the bytes read once and hashed (:func:`loaded_sha256`); a file that
    does not load is a ``WeightsFileError`` naming it, what is wrong and ``fix`` (never an unsafe load)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} not found: {fix}")
    data = path.read_bytes()
    try:
        loaded = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as err:
        raise WeightsFileError(f"{path} cannot be read as {what}: {_unreadable_reason(path, err)}; {fix}") from err
    _LOADED[os.path.realpath(path)] = hashlib.sha256(data).hexdigest()
    return loaded


def loaded_sha256(path: str | os.PathLike) -> str | None:
    """The SHA-256 of the bytes this process last loaded from ``path`` (None: none)."""
    return _LOADED.get(os.path.realpath(path))


def unwrap_network(network):
    """The plain module inside a ``DistributedDataParallel`` or ``DataParallel`` wrapper, else ``network``."""
    import torch

    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return network.module if isinstance(network, wrappers) else network


def weights_state_dict(source, map_location="cpu") -> dict:
    """The network weights in ``source`` (a path or a loaded object) as a plain state_dict: plain, with the
    ``module.`` prefix of a DDP/DataParallel network, or a checkpoint ``{"model"|"network"|"state_dict": ...}``."""
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    name = "the weights"
    if isinstance(source, (str, os.PathLike)):
        name, source = str(source), read_weights_file(source, map_location)
    if not isinstance(source, dict):
        raise WeightsFileError(
            f"{name} holds a {type(source).__name__}, not a state_dict (a dict of tensors): {RETRAIN}"
        )
    source = next((source[k] for k in ("model", "network", "state_dict") if isinstance(source.get(k), dict)), source)
    state = type(source)(source)  # a copy (an OrderedDict keeps its _metadata): the caller's dict is left as it was
    if hasattr(source, "_metadata"):
        state._metadata = source._metadata  # type: ignore[attr-defined]
    consume_prefix_in_state_dict_if_present(state, "module.")
    return state


def load_network_weights(network, source, map_location="cpu", name: str | None = None):
    """Load ``source`` (as :func:`weights_state_dict` reads it) strictly into ``network`` (unwrapped); returns
    ``network``. Weights of another network are a ``WeightsFileError`` naming the file (``name``), how many tensors
    differ, an example of each kind, and the fix."""
    name = name or (str(source) if isinstance(source, (str, os.PathLike)) else "the state_dict")
    state = weights_state_dict(source, map_location)
    target = unwrap_network(network)
    own = target.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k}: file {tuple(state[k].shape)}, network {tuple(own[k].shape)}"
        for k in own
        if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shapes:
        parts = [
            f"{len(items)} {what} (e.g. {', '.join(items[:2])}{', ...' if len(items) > 2 else ''})"
            for items, what in (
                (missing, "tensors of the network missing"),
                (unexpected, "unexpected tensors"),
                (shapes, "tensors of another shape"),
            )
            if items
        ]
        raise WeightsFileError(
            f"{name} holds the weights of another network than this {type(target).__name__} ({'; '.join(parts)}): "
            "it was trained with other settings (backbone, in_channels, num_classes or the bundle); use the "
            "settings it was trained with, or train the bundle again"
        )
    target.load_state_dict(state)
    return network
