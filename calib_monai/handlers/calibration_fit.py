"""The bundle ``calibrate`` step: fit a post-hoc calibration on the evaluator's validation logits and store it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from ignite.engine import Engine, Events
from torch.nn import functional as F

from calib_monai.calibration import LocalTemperatureScaling, TemperatureScaling, calibrate_volume, save_calibration
from calib_monai.calibration.temperature import VOXEL_CHOICES, calibration_voxels, check_voxels
from calib_monai.calibration.validated_range import ValidatedRange, voxel_volume_ml
from calib_monai.metrics import case_quality, ece
from calib_monai.metrics.case_quality import image_statistics

__all__ = ["CalibrationFitter"]

logger = logging.getLogger("calib_monai")
METHODS = ("temperature", "local_temperature")


class CalibrationFitter:
    """Attach to a validation evaluator whose outputs keep the raw logits; when it completes, fit ``method`` on them
    and write ``output_path`` (``<models>/calibration.pt`` and its readable ``calibration.json``).

    ``"temperature"`` fits one ``T`` on up to ``max_voxels`` voxels drawn evenly from the volumes (seeded), by
    default their ground-truth foreground voxels (``voxels="foreground"``), the voxels the papers' ECE is measured
    on: over all voxels (``"all"``) the NLL is dominated by easy background voxels, but the probabilities a user
    reads over the whole image (case quality, volumes) are calibrated by a fit on all voxels; which to use is
    measured in ``docs/results`` (the ``calibrated`` and ``quality`` studies);
    ``"local_temperature"`` fits :class:`~calib_monai.calibration.LocalTemperatureScaling` on up to ``max_slices``
    2D slices (logits, image, label) along ``spatial_dim``. The log line and the files give NLL (all voxels) and ECE
    (ground-truth foreground voxels, 15 bins) of the fitted data before and after.

    With ``validated_range_path``, the validation volumes are then scored with the fitted calibration
    (:func:`calib_monai.metrics.case_quality`) and their case scores and volumes stored there
    (:class:`calib_monai.calibration.validated_range.ValidatedRange`, rule ``review_alpha`` /
    ``review_volume_factor``): the range inference flags cases against.

    Args:
        output_path: the calibration file.
        weights: the network's weights file it is fitted for (its SHA-256 is stored; the calibration is never
            applied to other weights).
        method: ``"temperature"`` or ``"local_temperature"``.
        num_classes, in_channels: of the network (local temperature scaling).
        max_voxels, max_slices, lts_steps, seed: fit budget and seed.
        voxels: ``"foreground"`` (ground-truth foreground, default) or ``"all"``: the voxels temperature scaling is
            fitted on.
        validated_range_path: where to store the validated range (None: not stored).
        label_names: ``{"0": "background", ...}`` (the range's class names).
        review_alpha, review_volume_factor, review_input_check: the review rule stored with the range.
        logits_key, label_key, image_key: keys of the evaluator's decollated outputs (logits before any softmax).
        spatial_dim: the slice axis of the 2D network (as ``SliceInferer``).
    """

    def __init__(
        self,
        output_path: str | os.PathLike,
        weights: str | os.PathLike,
        method: str = "temperature",
        num_classes: int | None = None,
        in_channels: int = 1,
        max_voxels: int = 2_000_000,
        max_slices: int = 4_000,
        lts_steps: int = 300,
        seed: int = 0,
        logits_key: str = "pred",
        label_key: str = "label",
        image_key: str = "image",
        spatial_dim: int = 2,
        voxels: str = "foreground",
        validated_range_path: str | os.PathLike | None = None,
        label_names: dict | None = None,
        review_alpha: float = 0.05,
        review_volume_factor: float = 0.0,
        review_input_check: bool = False,
    ) -> None:
        if voxels not in VOXEL_CHOICES:
            raise ValueError(f"calibrate voxels must be one of {VOXEL_CHOICES}, got {voxels!r}")
        self.voxels = voxels
        if method not in METHODS:
            raise ValueError(f"calibrate method must be one of {METHODS}, got {method!r} (set --calibration_method)")
        if method == "local_temperature" and num_classes is None:
            raise ValueError("local temperature scaling needs num_classes")
        self.output_path, self.weights, self.method = Path(output_path), Path(weights), method
        self.num_classes, self.in_channels = num_classes, in_channels
        self.max_voxels, self.max_slices, self.lts_steps, self.seed = max_voxels, max_slices, lts_steps, seed
        self.keys = (logits_key, label_key, image_key)
        self.spatial_dim = spatial_dim
        self.validated_range_path = Path(validated_range_path) if validated_range_path else None
        self.class_names = [str(label_names[k]) for k in sorted(label_names, key=int)] if label_names else None
        self.review = {
            "alpha": float(review_alpha),
            "volume_factor": float(review_volume_factor),
            "input_check": bool(review_input_check),
        }
        ValidatedRange([], **self.review)  # the rule's settings are checked now, not after the fit
        self._volumes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._voxel_ml: list[float] = []

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, lambda _: (self._volumes.clear(), self._voxel_ml.clear()))
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._collect)
        engine.add_event_handler(Events.COMPLETED, self._fit)

    def _collect(self, engine: Engine) -> None:
        logits_key, label_key, image_key = self.keys
        items = engine.state.output if isinstance(engine.state.output, list) else [engine.state.output]
        for item in items:
            logits = torch.as_tensor(item[logits_key]).detach().float().cpu()
            label = torch.as_tensor(item[label_key]).detach().cpu()
            label = (label.argmax(0) if label.shape[0] > 1 else label[0]).long()
            self._voxel_ml.append(voxel_volume_ml(item[image_key]))
            image = torch.as_tensor(item[image_key]).detach().float().cpu()
            self._volumes.append(
                (logits.as_subclass(torch.Tensor), label.as_subclass(torch.Tensor), image.as_subclass(torch.Tensor))
            )

    def _voxels(self) -> tuple[torch.Tensor, torch.Tensor]:
        return calibration_voxels(((z, y) for z, y, _ in self._volumes), self.voxels, self.max_voxels, self.seed)

    def _slices(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        axis = self.spatial_dim + 1
        logits = torch.cat([z.movedim(axis, 0) for z, _, _ in self._volumes])
        images = torch.cat([x.movedim(axis, 0) for _, _, x in self._volumes])
        labels = torch.cat([y.movedim(self.spatial_dim, 0) for _, y, _ in self._volumes])
        if logits.shape[0] > self.max_slices:
            keep = torch.randperm(logits.shape[0], generator=torch.Generator().manual_seed(self.seed))[
                : self.max_slices
            ]
            logits, images, labels = logits[keep], images[keep], labels[keep]
        return logits, images, labels

    def _fit(self, engine: Engine) -> None:
        if not self._volumes:
            raise RuntimeError("the calibrate step saw no validation volume: check the data set's validation split")
        if self.method == "temperature":
            logits, labels = self._voxels()
            check_voxels(logits, labels)
            module = TemperatureScaling().fit(logits, labels)
            calibrated = module(logits)
        else:
            logits, images, labels = self._slices()
            check_voxels(logits.movedim(1, -1).reshape(-1, logits.shape[1]), labels.reshape(-1))
            module = LocalTemperatureScaling(self.num_classes, self.in_channels)
            module.fit(logits, images, labels, steps=self.lts_steps, seed=self.seed)
            with torch.no_grad():
                calibrated = torch.cat(
                    [module(logits[i : i + 64], images[i : i + 64]) for i in range(0, len(logits), 64)]
                )
            logits, calibrated = (t.movedim(1, -1).reshape(-1, t.shape[1]) for t in (logits, calibrated))
            labels = labels.reshape(-1)
        if self.method == "local_temperature":  # its NLL runs over every voxel of the slices: `voxels` is temperature's
            where = "all voxels of the validation slices"
        elif self.voxels == "foreground":
            where = "ground-truth foreground of the validation volumes"
        else:
            where = "all voxels of the validation volumes"
        stats = {"fitted_on": where, "volumes": len(self._volumes), "voxels": int(labels.numel())}
        with torch.no_grad():
            for when, z in (("before", logits), ("after", calibrated)):
                prob = torch.softmax(z.double(), dim=1)
                stats[f"nll_{when}"] = float(F.nll_loss(prob.clamp_min(1e-12).log(), labels))
                stats[f"ece_{when}"] = ece(prob.T[None], labels[None], 15, "gt")
        self.output_path.parent.mkdir(parents=True, exist_ok=True)
        save_calibration(module, self.output_path, self.weights, **stats)
        what = f"temperature {float(module.temperature):.4f}" if self.method == "temperature" else "local temperature"
        logger.info(
            f"calibrate: {what} fitted on {stats['volumes']} validation volumes ({stats['voxels']} voxels): "
            f"NLL {stats['nll_before']:.4f} -> {stats['nll_after']:.4f}, ECE (ground-truth foreground) "
            f"{stats['ece_before']:.4f} -> {stats['ece_after']:.4f}; wrote {self.output_path}"
        )
        if self.validated_range_path is not None:
            self._store_validated_range(module, stats)
        self._volumes.clear()

    def _store_validated_range(self, module: torch.nn.Module, stats: dict) -> None:
        """Score each validation volume with the fitted calibration and store the range next to the weights."""
        qualities = []
        with torch.no_grad():
            for (logits, _, image), voxel_ml in zip(self._volumes, self._voxel_ml):
                prob = torch.softmax(calibrate_volume(module, logits, image, self.spatial_dim), dim=0)
                qualities.append(case_quality(prob, voxel_volume=voxel_ml, class_names=self.class_names))
        calibration = {
            "method": self.method,
            **({"temperature": float(module.temperature)} if self.method == "temperature" else {}),
        }
        inputs = [image_statistics(image) for _, _, image in self._volumes]
        validated = ValidatedRange.from_qualities(
            qualities,
            **self.review,
            inputs=inputs,
            volumes_scored=len(qualities),
            calibration=calibration,
            fitted_on=stats["fitted_on"],
        )
        validated.save(self.validated_range_path, self.weights)
        logger.info(
            f"calibrate: validated range of {len(qualities)} validation volumes (case score "
            f"{min(validated.scores):.3f}-{max(validated.scores):.3f}); inference will {validated.describe()}; "
            f"wrote {self.validated_range_path}"
        )
