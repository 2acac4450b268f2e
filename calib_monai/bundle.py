"""Helpers that bundle configs call: where the bundle lives, whatever the working directory."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

__all__ = ["distributed_device", "distributed_network", "init_distributed", "locate_bundle", "log_run_start"]

_REPO_BUNDLES = Path(__file__).resolve().parents[1] / "bundles"


def _is_bundle(path: Path, name: str) -> bool:
    return path.name == name and (path / "configs" / "metadata.json").is_file()


def locate_bundle(name: str) -> str:
    """Absolute path of the bundle folder ``name``, so that its configs resolve paths relative to the bundle.

    ``monai.bundle run`` puts the bundle folder (the parent of ``configs/``) on ``sys.path`` before it runs the
    workflow, so a bundle copied anywhere (a MONAI Label model folder, a model-zoo checkout) is found there
    first. Then ``$CALIB_MONAI_BUNDLES/name``, ``./bundles/name``, ``./name`` and the repository's ``bundles/``.
    A ``--bundle_root`` override on the command line replaces this lookup altogether.
    """
    # the config file named on the command line (initialize runs before monai puts the bundle on sys.path)
    named = [m for arg in sys.argv for m in re.findall(r"[^'\",\[\]\s]*configs/[^'\",\[\]\s]+\.json", arg)]
    candidates = [Path(m).resolve().parents[1] for m in named]
    candidates += [Path(p) for p in sys.path if p]
    if os.environ.get("CALIB_MONAI_BUNDLES"):
        candidates.append(Path(os.environ["CALIB_MONAI_BUNDLES"]) / name)
    candidates += [Path.cwd() / "bundles" / name, Path.cwd() / name, Path.cwd(), _REPO_BUNDLES / name]
    for candidate in candidates:
        if _is_bundle(candidate, name):
            return str(candidate.resolve())
    raise FileNotFoundError(
        f"cannot find the bundle folder {name!r} (a folder {name}/ holding configs/metadata.json); looked in "
        f"sys.path, $CALIB_MONAI_BUNDLES, {Path.cwd() / 'bundles'} and {_REPO_BUNDLES}. "
        "Pass --bundle_root /path/to/" + name + " to say where it is."
    )


def log_run_start(data, epochs: int, device, output_dir: str) -> None:
    """Tell the user, before the first epoch, what data trains the model, where outputs go and how long it runs."""
    logger = logging.getLogger("calib_monai")
    datalist = data.datalist()
    sizes = ", ".join(f"{len(datalist.get(k, []))} {k}" for k in ("training", "validation", "test"))
    logger.info(f"data: {data.source} ({sizes} volumes); outputs: {output_dir}; {epochs} epochs on {device}")


def init_distributed(backend: str) -> None:
    """Join the process group that ``torchrun`` set up (``nccl`` on GPUs, ``gloo`` on CPUs); once per process."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend=backend)


def distributed_device():
    """This rank's device: ``cuda:$LOCAL_RANK`` when GPUs are there (and made current), else the CPU."""
    import torch

    if torch.cuda.is_available():
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def distributed_network(network, device):
    """``network`` on ``device`` wrapped in ``DistributedDataParallel`` (device_ids only for a GPU)."""
    import torch

    network = network.to(device)
    device_ids = [device] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(network, device_ids=device_ids)
