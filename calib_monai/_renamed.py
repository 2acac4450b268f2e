"""Old module names kept for one release (0.1 -> removed in 0.3), in the way of MONAI's ``deprecated``: importing one
warns once (FutureWarning) and gives the renamed module."""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

REMOVED_IN = "0.3.0"


def alias_module(old: str, new: str, namespace: dict | None = None) -> ModuleType:
    """Warn that ``old`` is renamed ``new`` and return ``new``; with ``namespace`` (the old module's ``globals()``),
    its public names are copied there."""
    warnings.warn(
        f"{old} is renamed {new} (measuring calibration error and recalibrating got distinct names); the old name is "
        f"removed in {REMOVED_IN}",
        FutureWarning,
        stacklevel=3,
    )
    module = importlib.import_module(new)
    if namespace is not None:
        namespace.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    return module


def alias_package(old: str, new: str, submodules: list[str], namespace: dict) -> ModuleType:
    """``alias_module`` for a package whose ``submodules`` are importable under the old name too (and attributes of
    ``namespace``)."""
    module = alias_module(old, new, namespace)
    for name in submodules:
        namespace[name] = sys.modules[f"{old}.{name}"] = importlib.import_module(f"{new}.{name}")
    return module
