"""Training runs of the studies: one bundle plus command-line overrides in one folder, resumable and recorded.

A run is ``python -m monai.bundle run training`` on a bundle of ``bundles/`` with ``--output_dir <run>/models`` and
the study's overrides, in a subprocess (its log goes to ``<run>/train.log``). ``<run>/run.json`` records the bundle,
the overrides, the command, the seed, the package versions, the wall time and the status; ``<run>/config.json`` is
the merged bundle config. A finished run is reused as it is; a stopped one is resumed (the bundle's
``checkpoint_latest.pt``) by calling ``train`` again; a run folder holding other overrides is an error, so results
of different settings never mix.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from calib_monai.atomic import write_json_atomically
from calib_monai.bundle import (
    bundle_config_paths,
    locate_bundle,
    read_bundle_config,
    read_weights_file,
    weights_state_dict,
)
from calib_monai.review.validated_range import read_validated_range

__all__ = ["RunSpec", "bundle_config_files", "calibrate", "environment_versions", "read_record", "train"]

logger = logging.getLogger(__name__)
RECORD = "run.json"
CALIBRATED = "calibrated.json"  # the settings of the last calibrate that finished: {"settings": {...}}


def bundle_config_files(bundle: str, extra: tuple[str, ...] = ()) -> list[str]:
    """``configs/train.json`` of ``bundle`` (a folder name under ``bundles/``) plus ``extra`` overlays
    (e.g. ``("demo.json",)``), as absolute paths; a ValueError names the missing file."""
    root = Path(locate_bundle(bundle))
    try:
        return [str(f) for f in bundle_config_paths(root, ("train.json", *extra))]
    except FileNotFoundError as err:
        raise ValueError(f"{err} (bundle {bundle!r}: bundles are folders of {root.parent})") from err


@dataclass(frozen=True)
class RunSpec:
    """One training run: ``bundle`` (e.g. ``"nacl_hpc"``) trained into ``run_dir`` with ``overrides``
    (bundle keys as on the command line: ``{"epochs": 10, "dataset_dir": "...", "loss#alpha": 0.2}``)."""

    bundle: str
    run_dir: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    extra_configs: tuple[str, ...] = ()
    snapshots: tuple[int, ...] = ()  # epochs whose network is kept as models/epoch_<e>.pt (needs overrides["epochs"])

    @property
    def models_dir(self) -> Path:
        return Path(self.run_dir) / "models"

    def stages(self) -> list[int]:
        """The epochs at which training stops and resumes: the snapshots, then the last epoch."""
        if not self.snapshots:
            return []
        if "epochs" not in self.overrides:
            raise ValueError(f"snapshots {self.snapshots} need the run's epochs in overrides['epochs']")
        last = int(self.overrides["epochs"])
        return sorted({int(e) for e in self.snapshots if 0 < int(e) < last}) + [last]

    def snapshot_path(self, epoch: int) -> Path:
        return self.models_dir / f"epoch_{epoch:03d}.pt"

    def command(
        self,
        epochs: int | None = None,
        run_id: str = "training",
        configs: tuple[str, ...] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """The training command (``epochs``: stop at that epoch instead, for a snapshot), or the bundle's ``run_id``
        (e.g. ``"calibrate"``) on the run's settings with the further ``configs`` (``("calibrate.json",)``) and
        settings ``extra`` (that step's own, e.g. ``{"review_score_check": False}``)."""
        files = bundle_config_files(self.bundle, (*self.extra_configs, *configs))
        cmd = [
            sys.executable,
            "-m",
            "monai.bundle",
            "run",
            run_id,
            "--config_file",
            json.dumps(files),
            "--output_dir",
            str(self.models_dir),
        ]
        overrides = dict(self.overrides, **({} if epochs is None else {"epochs": int(epochs)}), **(extra or {}))
        for key, value in overrides.items():  # Python literals: python-fire reads JSON's false as the string 'false'
            cmd += [f"--{key}", value if isinstance(value, str) else repr(value)]
        return cmd

    def identity(self) -> dict[str, Any]:
        """What must match for a recorded run to be reused."""
        out = {"bundle": self.bundle, "extra_configs": list(self.extra_configs), "overrides": self.overrides}
        return {**out, "snapshots": list(self.snapshots)} if self.snapshots else out


def environment_versions() -> dict[str, str]:
    """Versions of Python and the packages a result depends on, and the git commit of the checkout."""
    import ignite
    import monai
    import numpy
    import torch

    import calib_monai

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "monai": monai.__version__,
        "ignite": ignite.__version__,
        "numpy": numpy.__version__,
        "calib_monai": getattr(calib_monai, "__version__", "unknown"),
        "machine": platform.machine(),
        "cpu_count": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
    }
    try:
        repo = Path(calib_monai.__file__).resolve().parents[1]
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            versions["git_commit"] = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return versions


def _write_json(path: Path, data: dict) -> None:
    write_json_atomically(path, data)  # a reader never sees half a record


def read_record(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The ``run.json`` of ``run_dir``, or None when the run was never started."""
    path = Path(run_dir) / RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def _save_merged_config(spec: RunSpec, path: Path) -> None:
    from monai.bundle import ConfigParser

    files = bundle_config_files(spec.bundle, spec.extra_configs)
    # bundle_root left as the config's locate_bundle(...): the record says what the training command resolved
    parser = read_bundle_config(
        Path(files[0]).parents[1], files, {"output_dir": str(spec.models_dir), **spec.overrides}, set_bundle_root=False
    )
    ConfigParser.export_config_file(parser.get(), str(path), indent=2)


def train(spec: RunSpec) -> dict[str, Any]:
    """Train ``spec`` unless its finished record exists; return the record (``status`` "finished").

    Raises a ValueError when ``run_dir`` holds a run of other settings, and a RuntimeError naming the log when the
    training command fails (the run stays resumable: call ``train`` again)."""
    run_dir = Path(spec.run_dir)
    record = read_record(run_dir)
    if record is not None:
        if {k: record.get(k) for k in spec.identity()} != json.loads(json.dumps(spec.identity())):
            raise ValueError(
                f"{run_dir / RECORD} records another run ({record.get('bundle')} with "
                f"{record.get('overrides')}), not {spec.bundle} with {spec.overrides}; pass another "
                "results folder or delete that run folder"
            )
        if record.get("status") == "finished":
            logger.info("reusing finished run %s", run_dir)
            return record
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {
        **spec.identity(),
        "run_dir": str(run_dir),
        "command": spec.command(),
        "seed": spec.overrides.get("seed", 0),
        "versions": environment_versions(),
        "wall_time_s": (record or {}).get("wall_time_s", 0.0),
        "attempts": (record or {}).get("attempts", 0) + 1,
        "status": "running",
    }
    _save_merged_config(spec, run_dir / "config.json")
    _write_json(run_dir / RECORD, record)
    logger.info("training %s -> %s (log: %s)", spec.bundle, run_dir, run_dir / "train.log")
    start = time.perf_counter()
    code = 0
    for epochs in spec.stages() or [None]:
        if epochs is not None and spec.snapshot_path(epochs).is_file():
            continue  # a finished stage of a resumed run
        command = spec.command(epochs)
        with open(run_dir / "train.log", "a") as log:
            log.write(f"\n$ {' '.join(command)}\n")
            log.flush()
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
        if code != 0:
            break
        if epochs is not None:  # keep this epoch's network (a plain state_dict, like model.pt)
            latest = read_weights_file(spec.models_dir / "checkpoint_latest.pt", what="a training checkpoint")
            torch.save(weights_state_dict(latest), spec.snapshot_path(epochs))  # its "network", unprefixed
    record["wall_time_s"] = round(record["wall_time_s"] + time.perf_counter() - start, 1)
    record["status"] = "finished" if code == 0 and (spec.models_dir / "model.pt").is_file() else "failed"
    _write_json(run_dir / RECORD, record)
    if record["status"] != "finished":
        tail = (run_dir / "train.log").read_text().splitlines()[-15:]
        raise RuntimeError(
            f"training {spec.bundle} in {run_dir} failed (exit {code}); the last lines of "
            f"{run_dir / 'train.log'}:\n" + "\n".join(tail) + "\nfix the cause and run the same "
            "command again: it resumes from models/checkpoint_latest.pt"
        )
    return record


def calibrate(spec: RunSpec, settings: Mapping[str, Any] | None = None) -> Path:
    """Run the bundle's own ``calibrate`` on the finished run ``spec`` (its settings, ``configs/calibrate.json``,
    then ``settings``: calibrate's own, e.g. ``{"review_score_check": False}``) unless its recalibration is newer than
    its weights and than the bundle's config files, was made with the same ``settings`` (``<run>/calibrated.json``),
    and its range is one the served chain reads (one an older calibrate wrote is refused, so made again); its log goes
    to ``<run>/calibrate.log``. Returns the ``models`` folder (``calibration.pt``, ``validated_range.json``,
    ``manifest.json``); a RuntimeError names the log when the command fails."""
    settings = dict(settings or {})
    made_with = Path(spec.run_dir) / CALIBRATED
    recorded = json.loads(made_with.read_text()).get("settings", {}) if made_with.is_file() else {}
    models = spec.models_dir
    published = models / "validated_range.json"
    configs = bundle_config_files(spec.bundle, (*spec.extra_configs, "calibrate.json"))
    made_from = max([(models / "model.pt").stat().st_mtime] + [Path(f).stat().st_mtime for f in configs])
    fresh = published.is_file() and published.stat().st_mtime >= made_from
    try:
        applied = read_validated_range(published, models / "model.pt")[0] if fresh else None
    except ValueError:  # not a range the served chain reads (an older calibrate's): made again below
        applied = None
    if applied is not None and recorded == settings:  # served as made, measuring as now
        logger.info("reusing the recalibration of %s", spec.run_dir)
        return models
    command = spec.command(run_id="calibrate", configs=("calibrate.json",), extra=settings)
    log_path = Path(spec.run_dir) / "calibrate.log"
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
    if code != 0 or not published.is_file():
        tail = log_path.read_text().splitlines()[-10:]
        raise RuntimeError(
            f"calibrate {spec.bundle} in {spec.run_dir} failed (exit {code}); {log_path}:\n" + "\n".join(tail)
        )
    _write_json(made_with, {"settings": settings})
    return models
