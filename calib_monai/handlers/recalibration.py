"""The bundle ``calibrate`` step: fit a post-hoc calibration on the evaluator's validation logits and store it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from ignite.engine import Engine, Events

from calib_monai.metrics.image_statistics import image_geometry
from calib_monai.metrics.network_features import BottleneckFeatures
from calib_monai.metrics.report_table import case_name
from calib_monai.recalibration.fitting import ValidationVolume
from calib_monai.recalibration.recalibrate import recalibrate
from calib_monai.recalibration.references import training_references
from calib_monai.recalibration.settings import RecalibrationSettings
from calib_monai.review.validated_range import voxel_volume_ml

__all__ = ["RecalibrationFitter"]

logger = logging.getLogger("calib_monai")
KEYS = ("pred", "label", "image")  # the evaluator's logits (before any softmax), label and image


class RecalibrationFitter:
    """When the validation evaluator completes, :func:`calib_monai.recalibration.recalibrate` the volumes it
    collected (logits under ``"pred"``, before any softmax; ``"label"``; ``"image"``; an optional ``"subject"``):
    fit the recalibration of ``settings`` and write ``output_path`` (``calibration.pt`` and ``calibration.json``)
    and, with ``validated_range_path``, the validated range (case scores, volumes, image statistics and, with
    ``review_feature_check``, the pooled bottleneck features of ``engine.network``, one volume per batch).

    Args:
        output_path: the calibration file.
        weights: the network's weights file it is fitted for (its SHA-256 is stored).
        settings: :class:`~calib_monai.recalibration.RecalibrationSettings` (checked when made; None: the defaults).
        validated_range_path: where to store the validated range (None: not stored).
        label_names: ``{"0": "background", ...}`` (the range's class names).
        preprocessing: the validation chain (``@validate#preprocessing``) the reference images go through.
        reference_images: the training items (``@data.datalist()['training']``): up to ``settings.max_reference`` of
            them, evenly spaced, are the input and feature signals' fixed references (None: the validation volumes
            measure each other).
        spatial_dim: the slice axis of the 2D network (as ``SliceInferer``).
    """

    def __init__(
        self,
        output_path: str | os.PathLike,
        weights: str | os.PathLike,
        settings: RecalibrationSettings | None = None,
        validated_range_path: str | os.PathLike | None = None,
        label_names: dict | None = None,
        preprocessing: Callable | None = None,
        reference_images: Sequence[Mapping] | None = None,
        spatial_dim: int = 2,
    ) -> None:
        self.output_path, self.weights = Path(output_path), Path(weights)
        self.settings = RecalibrationSettings() if settings is None else settings
        if not isinstance(self.settings, RecalibrationSettings):
            raise TypeError(
                f"RecalibrationFitter settings must be a RecalibrationSettings, got {type(settings).__name__}: build "
                "it in calibrate.json with _target_ calib_monai.recalibration.RecalibrationSettings"
            )
        self.validated_range_path = Path(validated_range_path) if validated_range_path else None
        self.class_names = [str(label_names[k]) for k in sorted(label_names, key=int)] if label_names else None
        self.preprocessing, self.spatial_dim = preprocessing, spatial_dim
        self.reference_images = list(reference_images or [])
        self._network: torch.nn.Module | None = None
        self._inferer: Callable | None = None
        self._volumes: list[ValidationVolume] = []
        self._features: list = []
        self._hook, self._hook_problem = None, "the evaluator of the calibrate step has no network"

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self._start)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._collect)
        engine.add_event_handler(Events.COMPLETED, self._fit)

    def _start(self, engine: Engine) -> None:
        # the feature signal's network and inferer: a MONAI evaluator sets them after attaching its handlers
        network = getattr(engine, "network", None)
        if network is not None and network is not self._network:
            self._network, self._hook = network, None
            if self.settings.review_feature_check:
                try:
                    self._hook = BottleneckFeatures(network)
                except ValueError as err:
                    self._hook_problem = str(err)
        self._inferer = getattr(engine, "inferer", None)
        self._volumes.clear()
        self._features.clear()
        if self._hook is not None:
            self._hook.start()

    def _collect(self, engine: Engine) -> None:
        logits_key, label_key, image_key = KEYS
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
                    geometry=image_geometry(item[image_key]),
                    subject=str(item.get("subject", batch_item.get("subject", "")) or ""),
                    site=bool(item.get("site", batch_item.get("site", False))),
                )
            )

    def _fit(self, engine: Engine) -> None:
        if self._hook is not None:
            self._hook.stop()
        if not self._volumes:
            raise RuntimeError("the calibrate step saw no validation volume: check the data set's validation split")
        recalibrate(
            self._volumes,
            self.output_path,
            self.weights,
            self.settings,
            self.spatial_dim,
            self.validated_range_path,
            self.class_names,
            features=self._features if self._hook is not None else None,
            references=self._references,  # measured after the fit, only when a range is stored
            features_left_out=self._hook_problem if self.settings.review_feature_check and self._hook is None else "",
        )
        self._volumes.clear()
        self._features.clear()

    def _references(self) -> tuple[list[list[float]] | None, list | None]:
        """The fixed references of the input and feature signals (None each when not asked for or not given)."""
        items, inferer, input_check = self.reference_images, self._inferer, self.settings.review_input_check
        want_features = self._hook is not None and inferer is not None
        if not items or not self.settings.max_reference or self.preprocessing is None:
            return None, None
        if not (input_check or want_features):
            return None, None
        network = self._network if want_features else None
        most = self.settings.max_reference
        stats, features = training_references(items, self.preprocessing, inferer, network, most, KEYS[2])
        logger.info(
            f"calibrate: the input and feature signals' reference: {len(stats)} of {len(items)} training images"
        )
        return (stats if input_check else None), features
