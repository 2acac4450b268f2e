"""Helpers that bundle configs call (``calib_monai.bundle.<name>``): where the bundle lives, the distributed set-up of
``multi_gpu_train.json``, data loading switches, and the settings a resumed training must share with its checkpoint."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

__all__ = [
    "as_bool",
    "dataloader_workers",
    "distributed_device",
    "distributed_network",
    "finalize_distributed",
    "init_distributed",
    "locate_bundle",
    "log_run_start",
    "pin_memory",
    "record_run_settings",
    "resume_changes_allowed",
    "run_settings",
    "settings_differences",
    "validation_sampler",
]

# calib_monai/bundle/runtime.py -> the repository root (a source checkout or an editable install)
_REPO_BUNDLES = Path(__file__).resolve().parents[2] / "bundles"


def _is_bundle(path: Path, name: str) -> bool:
    return path.name == name and (path / "configs" / "metadata.json").is_file()


def locate_bundle(name: str) -> str:
    """Absolute path of the bundle folder ``name``: the folder of the config file on the command line, then
    ``sys.path`` (``monai.bundle run`` puts the bundle there), ``$CALIB_MONAI_BUNDLES/name``, ``./bundles/name``,
    ``./name`` and the repository's ``bundles/``. ``--bundle_root`` replaces this lookup."""
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
    datalist = data.datalist()  # on every rank: each reads (or, first, writes) the split
    import ignite.distributed as idist

    if idist.get_rank() > 0:  # one line per run, not one per DDP rank
        return
    sizes = ", ".join(f"{len(datalist.get(k, []))} {k}" for k in ("training", "validation", "test"))
    logger.info(f"data: {data.source} ({sizes} volumes); outputs: {output_dir}; {epochs} epochs on {device}")


def as_bool(value, name: str = "") -> bool:
    """A config switch as a bool: python-fire passes ``--amp false`` as the string ``"false"``, which would count as
    true. ``name``: the setting, named in the error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off"):
        return False
    setting = f"--{name}: " if name else ""
    raise ValueError(f"{setting}expected a boolean switch (true or false), got {value!r}")


def init_distributed(backend: str) -> None:
    """Join the process group that ``torchrun`` set up (``nccl`` on GPUs, ``gloo`` on CPUs); once per process."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend=backend)


def finalize_distributed() -> None:
    """Leave the process group at the end of a torchrun run, through ignite: a process exiting with ignite's cached
    distributed context may abort at interpreter shutdown (exit code -6), which torchrun reports as a failure."""
    import ignite.distributed as idist
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    idist.sync()  # ignite's context follows torch's process group
    idist.finalize()  # destroys the process group and resets ignite's context


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


def validation_sampler(dataset):
    """The validation sampler of a DDP run, leaving no rank without a volume (every rank joins the evaluator's
    collectives): an uneven ``DistributedSampler`` split without padding duplicates; None when not distributed or
    with fewer volumes than ranks (every rank validates all, so the means equal the single-process values)."""
    import torch.distributed as dist
    from monai.data import DistributedSampler

    if not (dist.is_available() and dist.is_initialized()):
        return None
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if len(dataset) >= world_size:
        return DistributedSampler(dataset, even_divisible=False, shuffle=False)
    if rank == 0:
        logging.getLogger("calib_monai").info(
            f"validation: {len(dataset)} volume(s) for {world_size} ranks: every rank validates all of them "
            "(the mean metrics are those of one process)"
        )
    return None


def dataloader_workers(device, max_workers: int = 8) -> int:
    """DataLoader workers for ``device``: 0 on the CPU (they would compete with the training for its cores); on CUDA
    this process's CPUs shared among the node's ranks (``LOCAL_WORLD_SIZE``), minus one, at most ``max_workers``."""
    import torch

    if torch.device(device).type != "cuda":
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_rank = cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    return max(0, min(max_workers, per_rank - 1))


def pin_memory(device) -> bool:
    """Page-locked batches (faster, asynchronous host-to-GPU copies) when ``device`` is a GPU."""
    import torch

    return torch.device(device).type == "cuda"


# ------------------------------------------------------------------------------------------- the settings of a run

#: ``--resume_changes allow``: a resumed training may run with settings other than its checkpoint's
RESUME_CHANGES = ("refuse", "allow")
#: keys whose change does not change what is trained (paths, logging, loading switches, the epochs to run)
_NOT_COMPARED = {"epochs", "device", "init_weights", "keep_epoch_weights", "loss_log_interval", "resume_changes"}
_NOT_COMPARED_ENDINGS = ("_dir", "_path", "_file", "_root", "num_workers", "cache_rate", "pin_memory", "progress")
_RUN: dict = {}


def _compared(key: str) -> bool:
    last = key.split("#")[-1]
    return key not in _NOT_COMPARED and not last.endswith(_NOT_COMPARED_ENDINGS)


def _plain_value(value):
    """``value`` as plain JSON types: what a ``weights_only`` checkpoint holds and compares equal across runs."""
    return json.loads(json.dumps(value, default=str))


def record_run_settings(settings: dict, loss=None, arguments=None, parser=None) -> None:
    """Keep the settings a resumed training must share with its checkpoint (``check_settings`` calls it): the checked
    values, the loss's class and the other command-line overrides (``arguments``), less paths and loading switches;
    ``parser``: the config files as read, whose values stand for the settings a side lacks."""
    values = {k: _plain_value(v) for k, v in settings.items() if _compared(k) and v is not None}
    if loss is not None:
        values["loss"] = f"{type(loss).__module__}.{type(loss).__qualname__}"
    for key, value in arguments.overrides.items() if arguments is not None else ():
        key = key.replace("::", "#")
        if _compared(key) and key not in values:
            values[key] = _plain_value(value)
    changes = (arguments.overrides.get("resume_changes") if arguments is not None else None) or "refuse"
    if changes not in RESUME_CHANGES:
        raise ValueError(
            f"resume_changes = {changes!r} is not valid: pass --resume_changes allow (resume a training with settings "
            "other than its checkpoint's) or leave it out"
        )
    _RUN.clear()
    _RUN.update(settings=values, parser=parser, resume_changes=changes)


def run_settings() -> dict:
    """The settings ``check_settings`` recorded (``{}``: none), which ``TrainingCheckpoint`` stores."""
    return dict(_RUN.get("settings", {}))


def resume_changes_allowed() -> bool:
    """Whether this run was given ``--resume_changes allow``."""
    return _RUN.get("resume_changes") == "allow"


def _default(key: str):
    """The config files' own value of ``key`` (unresolved), or ``"(not set)"``."""
    parser = _RUN.get("parser")
    try:
        return _plain_value(parser[key]) if parser is not None and key in parser else "(not set)"
    except (KeyError, IndexError, TypeError, ValueError):
        return "(not set)"


def settings_differences(recorded: dict, current: dict | None = None) -> list[tuple[str, object, object]]:
    """``(key, recorded value, current value)`` of every setting a checkpoint's ``recorded`` settings and this run's
    (``current``: :func:`run_settings`) do not share; a key one side lacks has the config files' value there."""
    current = run_settings() if current is None else current
    out = []
    for key in sorted(set(recorded) | set(current)):
        if not _compared(key):
            continue
        old = recorded[key] if key in recorded else _default(key)
        new = current[key] if key in current else _default(key)
        if old != new:
            out.append((key, old, new))
    return out
