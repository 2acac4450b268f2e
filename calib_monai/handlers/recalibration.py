"""The bundle ``calibrate`` step: fit a post-hoc calibration on the evaluator's validation logits and store it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from ignite.engine import Engine, Events
from monai.data import MetaTensor

from calib_monai.data.inference import InputGrid
from calib_monai.data.preprocessing import INPUT_LABEL
from calib_monai.metrics.image_statistics import image_geometry
from calib_monai.metrics.network_features import BottleneckFeatures
from calib_monai.metrics.report_table import case_name
from calib_monai.recalibration.fitting import RECALIBRATION_DEFAULTS, REVIEW_DEFAULTS, ValidationVolume, split_volumes
from calib_monai.recalibration.recalibrate import recalibrate
from calib_monai.recalibration.references import training_references
from calib_monai.recalibration.stored import calibrate_settings
from calib_monai.recalibration.temperature import VOXEL_CHOICES
from calib_monai.review.validated_range import ValidatedRange, voxel_volume_ml

__all__ = ["RecalibrationFitter"]

logger = logging.getLogger("calib_monai")
METHODS = ("temperature", "local_temperature")


class RecalibrationFitter:
    """Attach to a validation evaluator whose outputs keep the raw logits; when it completes, fit ``method`` on them
    and write ``output_path`` (``<models>/calibration.pt`` and its readable ``calibration.json``).

    ``"temperature"`` fits one ``T`` on up to ``max_voxels`` voxels drawn evenly from the volumes (seeded), by
    default their ground-truth foreground voxels (``voxels="foreground"``), the voxels the papers' ECE is measured
    on: over all voxels (``"all"``) the NLL is dominated by easy background voxels, but the probabilities a user
    reads over the whole image (case quality, volumes) are calibrated by a fit on all voxels; which to use is
    measured in ``docs/results`` (the ``calibrated`` and ``quality`` studies);
    ``"local_temperature"`` fits :class:`~calib_monai.recalibration.LocalTemperatureScaling` on up to ``max_slices``
    2D slices (logits, image, label) along ``spatial_dim``, a fifth of them held out for early stopping.

    Every validation volume in the validated range is scored by a recalibration it did not fit: by default
    cross-fitting (``crossfit``: ``crossfit_folds`` seeded folds of subjects, by default halves A and B, the fit on A
    scoring B and the fit on B scoring A; the served recalibration is fitted on all volumes, so the range is
    approximately, not exactly, exchangeable with a served case: :mod:`calib_monai.recalibration.fitting`), else a
    plain split (``split`` of them fit, the others measure).
    The log line and ``calibration.json`` name every number for what it was measured on (``range_volumes_*``: the
    range's volumes, each by the fit that did not see it; ``heldout_slices_*``: the early-stopping slices;
    ``in_sample_*``: the fitted data): NLL over all voxels, ECE over the ground-truth foreground voxels (15 bins),
    before and after, and which scheme was used (``split``).

    With ``validated_range_path``, the range's volumes are scored (:func:`calib_monai.metrics.case_quality`) and
    their case scores, volumes, image statistics and (``network`` given, ``review_feature_check``) pooled bottleneck
    features, captured by a :class:`~calib_monai.metrics.network_features.BottleneckFeatures` hook while the
    evaluator runs (one volume per batch), stored there (:class:`calib_monai.review.validated_range.
    ValidatedRange`, rule ``review_alpha`` / ``review_volume_factor`` / ``review_input_check`` /
    ``review_feature_check``, with its false-flag bound): the range inference flags against. A volume whose
    evaluator item (or batch item) has a ``"subject"`` (the data component's ``subject_of``: ACDC's patient) is
    counted with the other volumes of that subject, by the cross-fitting halves and the rule's bound.

    Args:
        output_path: the calibration file.
        weights: the network's weights file it is fitted for (its SHA-256 is stored; the calibration is never
            applied to other weights).
        method: ``"temperature"`` or ``"local_temperature"``.
        num_classes, in_channels: of the network (local temperature scaling).
        max_voxels, max_slices, lts_steps, seed: fit budget and seed (also the split's).
        split: without ``crossfit``, the share of validation volumes that fit the recalibration (the others measure
            the range); 0: all volumes do both (in-sample, with a warning).
        crossfit: cross-fitting (default): all validation volumes in the range, each scored by the fit on the
            other folds.
        crossfit_folds: how many folds (of subjects; default 2: halves).
        network: the evaluator's network, whose bottleneck features the range's feature signal uses (None: none).
        voxels: ``"foreground"`` (ground-truth foreground, default) or ``"all"``: the voxels temperature scaling is
            fitted on.
        validated_range_path: where to store the validated range (None: not stored).
        label_names: ``{"0": "background", ...}`` (the range's class names).
        review_alpha, review_volume_factor, review_input_check, review_feature_check, review_score_check: the
            review rule stored with the range.
        preprocessing: the validation chain (``@validate#preprocessing``, the served chain with the label). With
            the label as read (``input_label_key``, kept by ``@keep_input_label``), the range's volumes are scored
            on their input grid through its inverse, as ``inferring`` scores a case (else on the network's grid).
        reference_images, reference_inferer, max_reference: the training items (``@data.datalist()['training']``)
            and the served inferer (``@validate#inferer``): the image statistics and pooled features of up to
            ``max_reference`` of them through ``preprocessing``, evenly spaced, are the input and feature signals'
            fixed references (None: the validation volumes measure each other).
        logits_key, label_key, image_key: keys of the evaluator's decollated outputs (logits before any softmax).
        input_label_key: key of the label as read in the evaluator's items (``KeepInputLabeld``).
        spatial_dim: the slice axis of the 2D network (as ``SliceInferer``).
    """

    def __init__(
        self,
        output_path: str | os.PathLike,
        weights: str | os.PathLike,
        method: str = RECALIBRATION_DEFAULTS["method"],
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
        voxels: str = RECALIBRATION_DEFAULTS["voxels"],
        validated_range_path: str | os.PathLike | None = None,
        label_names: dict | None = None,
        review_alpha: float = REVIEW_DEFAULTS["alpha"],
        review_volume_factor: float = REVIEW_DEFAULTS["volume_factor"],
        review_input_check: bool = REVIEW_DEFAULTS["input_check"],
        split: float = 0.5,
        crossfit: bool = RECALIBRATION_DEFAULTS["crossfit"],
        crossfit_folds: int = RECALIBRATION_DEFAULTS["folds"],
        network: torch.nn.Module | None = None,
        review_feature_check: bool = REVIEW_DEFAULTS["feature_check"],
        reference_images: Sequence[Mapping] | None = None,
        preprocessing: Callable | None = None,
        reference_inferer: Callable | None = None,
        max_reference: int = 200,
        input_label_key: str = INPUT_LABEL,
        review_score_check: bool = REVIEW_DEFAULTS["score_check"],
    ) -> None:
        if voxels not in VOXEL_CHOICES:
            raise ValueError(f"calibrate voxels must be one of {VOXEL_CHOICES}, got {voxels!r}")
        self.voxels = voxels
        if method not in METHODS:
            raise ValueError(f"calibrate method must be one of {METHODS}, got {method!r} (set --calibration_method)")
        if method == "local_temperature" and num_classes is None:
            raise ValueError(
                "calibrate method local_temperature (the default) needs num_classes: pass num_classes=N (the "
                "network's classes), or method='temperature' for one temperature"
            )
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
            "feature_check": bool(review_feature_check),
            "score_check": bool(review_score_check),
        }
        ValidatedRange([], **self.review)  # the rule's settings are checked now, not after the fit
        split_volumes(2, split, folds=crossfit_folds)  # the share and the folds are checked now, too
        self.split, self.crossfit, self.folds = float(split), bool(crossfit), int(crossfit_folds)
        self.reference = (list(reference_images or []), reference_inferer, int(max_reference))
        self.preprocessing, self.input_label_key = preprocessing, input_label_key
        self._network = network
        self._volumes: list[ValidationVolume] = []
        self._features: list = []
        self._hook, self._hook_problem = None, "no network given to the calibrate step's RecalibrationFitter"
        if network is not None and self.review["feature_check"]:
            try:
                self._hook = BottleneckFeatures(network)
            except ValueError as err:
                self._hook_problem = str(err)

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self._start)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._collect)
        engine.add_event_handler(Events.COMPLETED, self._fit)

    def _start(self, engine: Engine) -> None:
        self._volumes.clear()
        self._features.clear()
        if self._hook is not None:
            self._hook.start()

    def _collect(self, engine: Engine) -> None:
        logits_key, label_key, image_key = self.keys
        items = engine.state.output if isinstance(engine.state.output, list) else [engine.state.output]
        batch = engine.state.batch if isinstance(engine.state.batch, list) else [engine.state.batch]
        pooled = None
        if self._hook is not None and self._hook.positions > 0:
            pooled = self._hook.pop().vector if len(items) == 1 else None  # a batch of volumes pools them together
            self._hook.reset()
        for index, item in enumerate(items):
            self._features.append(pooled)
            batch_item = batch[index] if index < len(batch) else {}
            logits = torch.as_tensor(item[logits_key]).detach().float().cpu()
            label = torch.as_tensor(item[label_key]).detach().cpu()
            label = (label.argmax(0) if label.shape[0] > 1 else label[0]).long()
            image = torch.as_tensor(item[image_key]).detach().float().cpu()
            self._volumes.append(
                ValidationVolume(
                    logits.as_subclass(torch.Tensor),
                    label.as_subclass(torch.Tensor),
                    image.as_subclass(torch.Tensor),
                    voxel_volume_ml(item[image_key]),
                    case_name(item, len(self._volumes)),
                    *self._input_grid(item, batch_item),
                    geometry=image_geometry(item[image_key]),
                    subject=str(item.get("subject", batch_item.get("subject", "")) or ""),
                )
            )

    def _input_grid(self, item: Mapping, batch_item: Mapping) -> tuple:
        """``(to_input_grid, input_label)`` of a volume whose evaluator item kept the label as read, else
        ``(None, None)``."""
        kept = item.get(self.input_label_key, batch_item.get(self.input_label_key))
        image = item[self.keys[2]]
        if kept is None:
            return (None, None)
        if self.preprocessing is None or not isinstance(image, MetaTensor):
            raise ValueError(
                f"calibrate: the validation volumes keep their label as read ({self.input_label_key}) but the range "
                "cannot be scored on their input grid: pass preprocessing=@validate#preprocessing to "
                "RecalibrationFitter (and keep the image a MetaTensor), or set keep_input_label false"
            )
        kept = torch.as_tensor(kept).detach().cpu().as_subclass(torch.Tensor)
        return InputGrid(self.preprocessing, image), kept[0]  # its own integer type: a uint8 copy is 8x smaller

    def _fit(self, engine: Engine) -> None:
        if self._hook is not None:
            self._hook.stop()
        if not self._volumes:
            raise RuntimeError("the calibrate step saw no validation volume: check the data set's validation split")
        fit = {"method": self.method, "num_classes": self.num_classes, "in_channels": self.in_channels}
        fit |= {"voxels": self.voxels, "max_voxels": self.max_voxels, "max_slices": self.max_slices}
        fit |= {"steps": self.lts_steps, "seed": self.seed}
        recalibrate(
            self._volumes,
            self.output_path,
            self.weights,
            fit,
            split=self.split,
            crossfit=self.crossfit,
            folds=self.folds,
            spatial_dim=self.spatial_dim,
            validated_range_path=self.validated_range_path,
            review=self.review,
            class_names=self.class_names,
            features=self._features if self._hook is not None else None,
            references=self._references,  # measured after the fit, only when a range is stored
            settings=calibrate_settings(self),
            features_left_out=self._hook_problem if self.review["feature_check"] and self._hook is None else "",
        )
        self._volumes.clear()
        self._features.clear()

    def _references(self) -> tuple[list[list[float]] | None, list | None]:
        """The fixed references of the input and feature signals (None each when not asked for or not given)."""
        items, inferer, most = self.reference
        want_features = self._hook is not None and inferer is not None
        if not items or self.preprocessing is None or not (self.review["input_check"] or want_features):
            return None, None
        network = self._network if want_features else None
        stats, features = training_references(items, self.preprocessing, inferer, network, most, self.keys[2])
        logger.info(
            f"calibrate: the input and feature signals' reference: {len(stats)} of {len(items)} training images"
        )
        return (stats if self.review["input_check"] else None), features
