"""Fine-tune a served bundle on the submitted labels, calibrate it and publish it to the server (no MONAI Label import).

The bundle's own ``training`` runs from the served ``model.pt`` on a datalist of the submitted labels in
``<bundle>/runs/label_training``, then its ``calibrate`` on the held-out ones; only when both succeed is the set
published into ``<bundle>/models`` (the previous weights stay as ``model.previous.pt``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calib_monai.atomic import copy_atomically
from calib_monai.bundle.manifest import copy_artifact_set
from calib_monai.bundle.weights import read_weights_file
from calib_monai.label.labels import remap_label, stored_values, value_map

__all__ = ["FineTune", "SubmittedLabel", "served_calibration"]

logger = logging.getLogger("calib_monai.label")
RESTORE = "restore them (copy models/model.previous.pt to models/model.pt) or train the bundle again, then Train"
PUBLISHED = ("calibration.pt", "calibration.json", "validated_range.json", "model.pt")  # model.pt last


@dataclass(frozen=True)
class SubmittedLabel:
    """One labelled image of the datastore: its id, image and label files and the tool's ``label_info``."""

    id: str
    image: str
    label: str
    label_info: Sequence[Mapping[str, Any]] | None = None


@dataclass
class FineTune:
    """One fine-tuning of ``bundle_dir`` on submitted labels (see the module).

    Args:
        bundle_dir: the served bundle (``configs/``, ``models/model.pt``).
        epochs, lr: the training budget (the learning rate drops 10x at half time, as the bundle's schedule does).
        validation_fraction: share of the labelled images held out to validate and calibrate on (at least one).
        seed: seed of the hold-out draw and of the training.
        overrides: more ``--key value`` settings of both runs (e.g. ``{"roi_size": [64, 64, 8]}``).
    """

    bundle_dir: Path
    epochs: int = 5
    lr: float = 1e-4
    validation_fraction: float = 0.2
    seed: int = 0
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.bundle_dir = Path(self.bundle_dir)
        self.workdir = self.bundle_dir / "runs" / "label_training"
        self.models = self.workdir / "models"
        if int(self.epochs) < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if not 0 < float(self.lr) < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if not 0 < float(self.validation_fraction) < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction}")

    def prepare(self, cases: Sequence[SubmittedLabel], label_names: Mapping[int, str]) -> Path:
        """Map the submitted labels to the bundle's values and write the datalist (a fresh work folder)."""
        if len(cases) < 2:
            raise ValueError(
                f"training needs at least 2 labelled images (one to train on, one held out to validate "
                f"and calibrate on); the datastore has {len(cases)}: submit more labels"
            )
        shutil.rmtree(self.workdir, ignore_errors=True)
        stored = stored_values(self.bundle_dir)
        items = []
        for case in sorted(cases, key=lambda c: c.id):
            suffix = ".png" if str(case.image).lower().endswith(".png") else ".nii.gz"
            target = self.workdir / "labels" / f"{case.id}{suffix}"
            mapping = value_map(case.label_info, label_names, case.id)
            remap_label(case.label, target, mapping, case.id, image=case.image, stored=stored)
            items.append({"image": str(Path(case.image).resolve()), "label": str(target.resolve())})
        random.Random(self.seed).shuffle(items)
        held_out = max(1, round(float(self.validation_fraction) * len(items)))
        site = [{**item, "site": True} for item in items[:held_out]]  # re-anchor the case score (review.anchor)
        source = self.source_validation()
        self.counts = {"trained_on": len(items) - held_out, "validated_on": held_out, "source_validation": len(source)}
        datalist = {
            "given": True,
            "source": "submitted labels",
            "training": items[held_out:],
            "validation": site + source,
            "test": [],
        }
        self.models.mkdir(parents=True, exist_ok=True)
        path = self.models / "datalist.json"
        path.write_text(json.dumps(datalist, indent=1))
        return path

    def source_validation(self) -> list[dict[str, Any]]:
        """The served bundle's own validation volumes (``models/datalist.json``) whose files are here: validated and
        calibrated on again, so the review flag keeps the source subjects' evidence."""
        path = self.bundle_dir / "models" / "datalist.json"
        try:
            items = json.loads(path.read_text()).get("validation", []) if path.is_file() else []
        except (OSError, ValueError) as err:
            logger.warning(f"{path} cannot be read ({err}): the fine-tune validates on the submitted labels alone")
            return []
        present = [i for i in items if all(Path(str(i.get(k, ""))).is_file() for k in ("image", "label"))]
        if len(present) < len(items):
            logger.warning(
                f"{self.bundle_dir.name}: {len(items) - len(present)} of the {len(items)} source validation volumes "
                f"of {path} are not on this machine: the review flag keeps the evidence of the {len(present)} here"
            )
        return present

    def _run(self, step: str, configs: Sequence[str], **overrides: Any) -> None:
        files = json.dumps([str(self.bundle_dir / "configs" / c) for c in configs])
        command = [sys.executable, "-m", "monai.bundle", "run", step, "--config_file", files]
        command += ["--bundle_root", str(self.bundle_dir), "--output_dir", str(self.models), "--seed", str(self.seed)]
        for key, value in {**dict(self.overrides), **overrides}.items():
            command += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
        with open(self.workdir / f"{step}.log", "a") as log:
            log.write("$ " + " ".join(command) + "\n")
            log.flush()
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
        if code != 0:
            log = self.workdir / f"{step}.log"
            reason = _failure_line(log.read_text())
            raise RuntimeError(
                f"the {step} step of {self.bundle_dir.name} failed (exit {code}): {reason.removeprefix('ERROR: ')}; "
                f"nothing was published, the previous weights keep serving (log: {log})"
            )

    def train_and_calibrate(self) -> None:
        """Fine-tune from the served weights, then calibrate with :func:`served_calibration`'s method."""
        self.calibration_method, self.calibration_source = served_calibration(self.bundle_dir)
        served = self.bundle_dir / "models" / "model.pt"
        read_weights_file(served, what=f"the served weights of {self.bundle_dir.name}", fix=RESTORE)
        init = self.workdir / "init_model.pt"
        shutil.copyfile(served, init)  # the served weights, as they are now
        self._started = time.time()
        self._run("training", ["train.json"], epochs=int(self.epochs), lr=float(self.lr), init_weights=str(init))
        self._run("calibrate", ["train.json", "calibrate.json"], calibration_method=self.calibration_method)

    def publish(self) -> dict[str, Any]:
        """Copy the new calibration, validated range and weights into ``<bundle>/models`` (``model.pt`` last)."""
        missing = [n for n in PUBLISHED if not (self.models / n).is_file()]
        if missing:
            raise RuntimeError(f"{self.models} lacks {missing}: nothing was published")
        target = self.bundle_dir / "models"
        if (target / "model.pt").is_file():
            copy_atomically(target / "model.pt", target / "model.previous.pt")
        copy_artifact_set(self.models, target)  # one set: staged, renamed, models/manifest.json last
        out = self.stats(finished=True)
        logger.info(
            f"{self.bundle_dir.name}: fine-tuned on {out.get('trained_on')} submitted label(s), validated, calibrated "
            f"({out.get('calibration_method')}: {out.get('calibration_source')}) and re-measured the validated range "
            f"on {out.get('validated_on')} held out; published the weights, calibration and validated range"
        )
        return out

    def stats(self, finished: bool = False) -> dict[str, Any]:
        """Progress as MONAI Label's trainers report it (Slicer shows ``epoch / total_epochs`` and ``best_metric``)."""
        path = self.models / "validation_history.json"
        history = json.loads(path.read_text()) if path.is_file() else []  # one entry per validated epoch
        best = max((float(e.get("val_mean_dice", float("nan"))) for e in history), default=float("nan"))
        out = {"epoch": len(history), "total_epochs": int(self.epochs), "best_metric": best if best == best else 0.0}
        if finished:
            out["total_time"] = round(time.time() - getattr(self, "_started", time.time()), 1)
            out.update(getattr(self, "counts", {}))
            out["calibration_method"] = getattr(self, "calibration_method", None)
            out["calibration_source"] = getattr(self, "calibration_source", None)
        return out

    def run(self, cases: Sequence[SubmittedLabel], label_names: Mapping[int, str]) -> dict[str, Any]:
        """Prepare, train, calibrate and publish; returns the final stats (counts, calibration method and source)."""
        self.prepare(cases, label_names)
        logger.info(
            f"{self.bundle_dir.name}: fine-tuning on {self.counts['trained_on']} submitted label(s), holding "
            f"{self.counts['validated_on']} out to validate, calibrate and re-measure the validated range on, with "
            f"{self.counts['source_validation']} source validation volume(s)"
        )
        self.train_and_calibrate()
        return self.publish()


def _failure_line(log: str) -> str:
    """Why a bundle run failed: its last ``ERROR:`` line, else the last exception line of a traceback (with the next
    line when it ends in ``:``), else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("ERROR:"):
            return line
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*:", lines[i]):
            return lines[i] + (f" {lines[i + 1]}" if lines[i].endswith(":") and i + 1 < len(lines) else "")
    return lines[-1] if lines else "no output"


def served_calibration(bundle_dir: str | os.PathLike) -> tuple[str, str]:
    """(method, where it comes from) of the next calibration: the one the served ``models/calibration.json`` records,
    else the bundle's default ``calibration_method`` of ``configs/calibrate.json``."""
    record = Path(bundle_dir) / "models" / "calibration.json"
    try:
        method = json.loads(record.read_text()).get("method")
    except FileNotFoundError:
        reason = f"{record} is missing"
    except (OSError, ValueError, AttributeError) as err:
        reason = f"{record} cannot be read ({type(err).__name__})"
    else:
        if isinstance(method, str) and method:
            return method, f"the method the served {record.name} records"
        reason = f"{record} names no method"
    path = Path(bundle_dir) / "configs" / "calibrate.json"
    try:
        method = json.loads(path.read_text()).get("calibration_method")
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} cannot be read ({err}): restore the bundle's configs") from err
    if not isinstance(method, str) or not method:
        raise ValueError(f"{path} has no calibration_method: restore the bundle's configs")
    return method, f"{reason}: the bundle's default calibration_method of configs/calibrate.json"
