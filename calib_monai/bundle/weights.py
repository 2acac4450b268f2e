"""Network weights of a bundle: one reader for every ``model.pt`` layout the bundles have written."""

from __future__ import annotations

import os

__all__ = ["load_network_weights", "unwrap_network", "weights_state_dict"]


def unwrap_network(network):
    """The plain module inside a ``DistributedDataParallel`` or ``DataParallel`` wrapper (else ``network`` itself).

    Its ``state_dict()`` has the keys of the bundle's ``network_def`` (no ``module.`` prefix): what ``model.pt``
    holds whatever the number of GPUs that trained it.
    """
    import torch

    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return network.module if isinstance(network, wrappers) else network


def weights_state_dict(source, map_location="cpu") -> dict:
    """The network weights in ``source`` (a file path or an already loaded object) as a plain state_dict.

    Accepts what a bundle's ``models/model.pt`` has held: a plain state_dict; one with the ``module.`` prefix of a
    ``DistributedDataParallel``/``DataParallel`` network (multi-GPU runs before the checkpoint handler unwrapped
    them); or a training checkpoint ``{"model": ...}`` / ``{"network": ...}`` (MONAI ``CheckpointSaver`` style,
    ``checkpoint_latest.pt``). Files are read with ``weights_only=True``.
    """
    import torch
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    if isinstance(source, (str, os.PathLike)):
        source = torch.load(source, map_location=map_location, weights_only=True)
    if not isinstance(source, dict):
        raise TypeError(f"expected a state_dict (a dict of tensors), got {type(source).__name__}")
    for key in ("model", "network", "state_dict"):
        if isinstance(source.get(key), dict):
            source = source[key]
            break
    state = type(source)(source)  # a copy (an OrderedDict keeps its _metadata): the caller's dict is left as it was
    if hasattr(source, "_metadata"):
        state._metadata = source._metadata  # type: ignore[attr-defined]
    consume_prefix_in_state_dict_if_present(state, "module.")
    return state


def load_network_weights(network, source, map_location="cpu", strict: bool = True):
    """Load ``source`` (see :func:`weights_state_dict`: a path or a loaded state_dict, plain, ``module.``-prefixed
    or nested under ``"model"``) into ``network`` (unwrapped first if it is DDP/DataParallel); returns ``network``.

    Every reader of ``model.pt`` goes through here (bundle ``evaluate.json``/``inference.json`` via
    ``calib_monai.handlers.NetworkWeightsLoader``; ``TrainedBundle``, and through it the export, MONAI Label serving
    and the experiment evaluation), so a file from an older multi-GPU run still loads with ``strict=True``.
    """
    unwrap_network(network).load_state_dict(weights_state_dict(source, map_location), strict=strict)
    return network
