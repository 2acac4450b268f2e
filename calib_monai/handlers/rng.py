"""The random-number state of a training run, for checkpoints that resume exactly where a run stopped: ``torch``
(CPU and initialised GPUs), ``numpy``, ``python``, the training loader's and sampler's generators and the ``R`` of
every MONAI ``Randomizable`` transform of its dataset (not persistent workers' own), as tensors, ints and floats so
the checkpoint loads with ``weights_only=True``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "randomizable_transforms", "restore_rng_state"]


_DATA = (torch.Tensor, np.ndarray, dict, list, tuple, str, bytes, int, float, bool, type(None))


def randomizable_transforms(root: Any) -> list:
    """The MONAI ``Randomizable`` objects reachable from ``root`` (a dataset) through attributes, lists and tuples,
    depth first; data (tensors, arrays, dicts, lists of data such as a cache) is not searched."""
    from monai.transforms import Randomizable

    found, seen, stack = [], set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (torch.Tensor, np.ndarray, dict, str, bytes, int, float, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, Randomizable) and isinstance(getattr(obj, "R", None), np.random.RandomState):
            found.append(obj)
        if isinstance(obj, (list, tuple)):
            if obj and not isinstance(obj[0], _DATA):
                stack.extend(reversed(obj))
        elif hasattr(obj, "__dict__"):
            stack.extend(reversed([v for k, v in vars(obj).items() if not k.startswith("__")]))
    return found


def _numpy_state(state: tuple) -> dict[str, Any]:
    name, key, pos, has_gauss, cached = state
    return {
        "name": name,
        "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _as_numpy_state(state: dict[str, Any]) -> tuple:
    key = state["key"].numpy().astype(np.uint32)
    return state["name"], key, state["pos"], state["has_gauss"], state["cached_gaussian"]


def _loader_generators(loader: Any) -> list[torch.Generator]:
    """The generators a training loader owns: its own and its sampler's (batch sampler's sampler) when set."""
    samplers = (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    candidates = [getattr(x, "generator", None) for x in (loader, *samplers)]
    found: list[torch.Generator] = []
    for generator in candidates:
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


def capture_rng_state(loader: Any = None) -> dict[str, Any]:
    """Every random-number state a training run draws from (module docstring); ``loader``: the training loader."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": _numpy_state(np.random.get_state()),
        "python": random.getstate(),
        "samplers": [g.get_state() for g in _loader_generators(loader)],
        "transforms": [
            _numpy_state(t.R.get_state()) for t in randomizable_transforms(getattr(loader, "dataset", None))
        ],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any], loader: Any = None) -> None:
    """Put back what :func:`capture_rng_state` read (a checkpoint of the same run: same loader, same transforms)."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(_as_numpy_state(state["numpy"]))
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    generators = _loader_generators(loader)
    transforms = randomizable_transforms(getattr(loader, "dataset", None))
    if len(generators) != len(state["samplers"]) or len(transforms) != len(state["transforms"]):
        raise ValueError(
            f"the checkpoint holds {len(state['samplers'])} sampler and {len(state['transforms'])} "
            f"transform generator(s), the training loader has {len(generators)} and {len(transforms)}: "
            "it was written by a run with another data pipeline"
        )
    for generator, saved in zip(generators, state["samplers"]):
        generator.set_state(saved)
    for transform, saved in zip(transforms, state["transforms"]):
        transform.R.set_state(_as_numpy_state(saved))
