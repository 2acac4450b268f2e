"""Fine-tune a served bundle on the labels annotators submitted, then calibrate it and publish it to the server.

The bundle's own training (its loss, e.g. NACL or CRaC with its ALM handler; its preprocessing, validation and model
selection) runs as ``python -m monai.bundle run training`` on a datalist of the submitted labels, starting from the
served ``model.pt`` (``--init_weights``), in a work folder ``<bundle>/runs/label_training``; then the bundle's
``calibrate`` step fits the calibration and the validated range on the held-out labels. Only when both succeeded are
the new files copied into ``<bundle>/models`` (each atomically; ``model.pt`` last, so the server, which reloads when
``model.pt`` changes, never pairs the new weights with the old calibration); the previous weights stay as
``model.previous.pt``. A training that fails or is stopped publishes nothing: the previous weights keep serving.

Submitted labels are numbered as the annotation tool numbered them: 3D Slicer's MONAI Label module gives the i-th
segment of the saved ``label_info`` the value i + 1. They are mapped back to the bundle's values by segment name
(``"liver"``, and the review task's ``"liver (uncertain)"`` as liver); a segment the bundle does not know is an
error that names it. Labels saved without ``label_info`` must already hold the bundle's values.

Nothing here imports MONAI Label (``calib_monai.label.train`` is the MONAI Label task around it).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np

from calib_monai.atomic import copy_atomically

__all__ = ["FineTune", "SubmittedLabel", "remap_label"]

logger = logging.getLogger("calib_monai.label")
UNCERTAIN_SUFFIX = " (uncertain)"
PUBLISHED = ("calibration.pt", "calibration.json", "validated_range.json", "model.pt")  # model.pt last


@dataclass(frozen=True)
class SubmittedLabel:
    """One labelled image of the datastore: its id, image and label files and the tool's ``label_info``."""

    id: str
    image: str
    label: str
    label_info: Sequence[Mapping[str, Any]] | None = None


def value_map(
    label_info: Sequence[Mapping[str, Any]] | None, label_names: Mapping[int, str], case: str
) -> dict[int, int]:
    """Submitted value -> bundle value, from the segment names (see the module); identity without ``label_info``."""
    if not label_info:
        return {v: v for v in label_names}
    by_name = {name.lower(): value for value, name in label_names.items()}
    mapping = {0: 0}
    for position, entry in enumerate(label_info):
        name = str(entry.get("name", "")).strip()
        key = name[: -len(UNCERTAIN_SUFFIX)] if name.endswith(UNCERTAIN_SUFFIX) else name
        if key.lower() not in by_name:
            known = [n for v, n in sorted(label_names.items()) if v > 0]
            raise ValueError(
                f"the label of {case} has a segment {name!r}, which this bundle does not segment (it "
                f"knows {known}): rename or delete that segment in Slicer and submit again"
            )
        mapping[position + 1] = by_name[key.lower()]
    return mapping


def remap_label(source: str | os.PathLike, target: str | os.PathLike, mapping: Mapping[int, int], case: str) -> None:
    """Write ``source``'s label map with its values mapped (uint8, same grid); unknown values are an error."""
    image = nib.load(str(source))
    values = np.asarray(image.dataobj)
    if not np.array_equal(values, np.round(values)):
        raise ValueError(f"the label of {case} ({source}) holds non-integer values: submit a label map")
    values = values.astype(np.int64)
    unknown = sorted(set(np.unique(values).tolist()) - set(mapping))
    if unknown:
        raise ValueError(
            f"the label of {case} ({source}) has values {unknown[:5]} that no segment of its label_info "
            f"names (known: {sorted(mapping)}): submit it again from Slicer"
        )
    lookup = np.zeros(max(mapping) + 1, dtype=np.uint8)
    for value, bundle_value in mapping.items():
        lookup[value] = bundle_value
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(lookup[values], image.affine), str(target))


@dataclass
class FineTune:
    """One fine-tuning of ``bundle_dir`` on submitted labels (see the module).

    Args:
        bundle_dir: the served bundle (``configs/``, ``models/model.pt``).
        epochs, lr: the training budget (the learning rate drops 10x at half time, as the bundle's schedule does).
        validation_fraction: share of the labelled images held out for validation, the model selection and the
            calibration (at least one).
        seed: seed of the hold-out draw and of the training.
    """

    bundle_dir: Path
    epochs: int = 5
    lr: float = 1e-4
    validation_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        self.bundle_dir = Path(self.bundle_dir)
        if int(self.epochs) < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if not 0 < float(self.lr) < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if not 0 < float(self.validation_fraction) < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction}")

    @property
    def workdir(self) -> Path:
        return self.bundle_dir / "runs" / "label_training"

    @property
    def models(self) -> Path:
        return self.workdir / "models"

    def prepare(self, cases: Sequence[SubmittedLabel], label_names: Mapping[int, str]) -> Path:
        """Map the submitted labels to the bundle's values and write the datalist (a fresh work folder)."""
        if len(cases) < 2:
            raise ValueError(
                f"training needs at least 2 labelled images (one to train on, one held out to validate "
                f"and calibrate on); the datastore has {len(cases)}: submit more labels"
            )
        shutil.rmtree(self.workdir, ignore_errors=True)
        items = []
        for case in sorted(cases, key=lambda c: c.id):
            target = self.workdir / "labels" / f"{case.id}.nii.gz"
            remap_label(case.label, target, value_map(case.label_info, label_names, case.id), case.id)
            items.append({"image": str(Path(case.image).resolve()), "label": str(target.resolve())})
        random.Random(self.seed).shuffle(items)
        held_out = max(1, round(float(self.validation_fraction) * len(items)))
        datalist = {
            "given": True,
            "source": "submitted labels",
            "training": items[held_out:],
            "validation": items[:held_out],
            "test": [],
        }
        self.models.mkdir(parents=True, exist_ok=True)
        path = self.models / "datalist.json"
        path.write_text(json.dumps(datalist, indent=1))
        return path

    def _run(self, step: str, configs: Sequence[str], **overrides: Any) -> None:
        files = json.dumps([str(self.bundle_dir / "configs" / c) for c in configs])
        command = [
            sys.executable,
            "-m",
            "monai.bundle",
            "run",
            step,
            "--config_file",
            files,
            "--bundle_root",
            str(self.bundle_dir),
            "--output_dir",
            str(self.models),
            "--seed",
            str(self.seed),
        ]
        for key, value in overrides.items():
            command += [f"--{key}", str(value)]
        with open(self.workdir / f"{step}.log", "a") as log:
            log.write("$ " + " ".join(command) + "\n")
            log.flush()
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
        if code != 0:
            tail = (self.workdir / f"{step}.log").read_text().splitlines()[-12:]
            raise RuntimeError(
                f"the {step} step of {self.bundle_dir.name} failed (exit {code}); nothing was published, "
                f"the previous weights keep serving. Last lines of {self.workdir / f'{step}.log'}:\n" + "\n".join(tail)
            )

    def train_and_calibrate(self, calibration_method: str | None = None) -> None:
        """Fine-tune from the served weights, then calibrate (``calibration_method``: None keeps the bundle's own)."""
        init = self.workdir / "init_model.pt"
        shutil.copyfile(self.bundle_dir / "models" / "model.pt", init)  # the served weights, as they are now
        self._started = time.time()
        self._run("training", ["train.json"], epochs=int(self.epochs), lr=float(self.lr), init_weights=str(init))
        method = {} if calibration_method is None else {"calibration_method": calibration_method}
        self._run("calibrate", ["train.json", "calibrate.json"], **method)

    def publish(self) -> dict[str, Any]:
        """Copy the new calibration, validated range and weights into ``<bundle>/models`` (``model.pt`` last)."""
        missing = [n for n in PUBLISHED if not (self.models / n).is_file()]
        if missing:
            raise RuntimeError(f"{self.models} lacks {missing}: nothing was published")
        target = self.bundle_dir / "models"
        if (target / "model.pt").is_file():
            copy_atomically(target / "model.pt", target / "model.previous.pt")
        for name in PUBLISHED:
            copy_atomically(self.models / name, target / name)
        logger.info(f"{self.bundle_dir.name}: published the fine-tuned weights, calibration and validated range")
        return self.stats(finished=True)

    def stats(self, finished: bool = False) -> dict[str, Any]:
        """Progress as MONAI Label's trainers report it (Slicer shows ``epoch / total_epochs`` and ``best_metric``)."""
        path = self.models / "validation_history.json"
        history = json.loads(path.read_text()) if path.is_file() else []  # one entry per validated epoch
        best = max((float(e.get("val_mean_dice", float("nan"))) for e in history), default=float("nan"))
        out = {"epoch": len(history), "total_epochs": int(self.epochs), "best_metric": best if best == best else 0.0}
        if finished:
            out["total_time"] = round(time.time() - getattr(self, "_started", time.time()), 1)
        return out

    def run(
        self,
        cases: Sequence[SubmittedLabel],
        label_names: Mapping[int, str],
        calibration_method: str | None = None,
    ) -> dict[str, Any]:
        """Prepare, train, calibrate and publish; returns the final stats."""
        self.prepare(cases, label_names)
        self.train_and_calibrate(calibration_method)
        return self.publish()
