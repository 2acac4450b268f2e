"""A fitted calibration stored next to a bundle's weights and applied where its logits become probabilities
(:class:`CalibrateLogitsd` in ``evaluate`` and ``inference``, the exported ``segmentation_confidence`` modules).

``<models>/calibration.pt`` holds the method, the ``state_dict`` (with cross-fitting also ``fold_state_dicts``), what
it was fitted on and the SHA-256 of the ``model.pt`` it was fitted for: it is never applied to other weights.
``calibration.json`` repeats it for people. ``calibrate`` publishes it with the validated range as one set
(``calib_monai.bundle.manifest``), and every reader checks the set: a calibration deleted, replaced or half-published
is an error naming the files, never a silent fallback. ``calibration_path`` ``none`` asks for the network's own
probabilities (and no validated range).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from monai.transforms import MapTransform
from torch import nn

from calib_monai.bundle.manifest import (
    NOT_APPLICABLE,
    ArtifactSet,
    file_sha256,
    is_raw_request,
    publish_artifacts,
    read_artifact_set,
)
from calib_monai.bundle.outputs import SOURCE_KEY
from calib_monai.bundle.weights import loaded_sha256, read_weights_file
from calib_monai.metrics.case_quality import estimated_dice
from calib_monai.review.contours import CONTOURS_FILE
from calib_monai.review.rule import write_measured
from calib_monai.review.signals import CASE_SCORE_OFFSETS

from .local_temperature import LocalTemperatureScaling, temperature_maps
from .temperature import TemperatureScaling

__all__ = [
    "CALIBRATION_FILE",
    "CalibrateLogitsd",
    "NOT_APPLICABLE",
    "Uncalibrated",
    "calibrate_volume",
    "calibrate_volumes",
    "case_score_offsets",
    "calibration_set",
    "load_calibration",
    "load_calibrations",
    "publish_calibration",
]

logger = logging.getLogger(__name__)
CALIBRATION_FILE = "calibration.pt"
METHODS = {"temperature": TemperatureScaling, "local_temperature": LocalTemperatureScaling}


class Uncalibrated(nn.Module):
    """The identity with the calibration modules' signature (so a scripted model always has one)."""

    def forward(self, logits: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
        return logits


def _method(module: nn.Module) -> str:
    for name, cls in METHODS.items():
        if type(module) is cls:
            return name
    raise TypeError(f"can store {list(METHODS)} modules, got {type(module).__name__}")


def _record(module: nn.Module, weights: str | os.PathLike, weights_sha: str, **info: Any) -> dict:
    record = {"method": _method(module), "weights": str(Path(weights).name), "weights_sha256": weights_sha}
    record.update(info)
    if isinstance(module, TemperatureScaling):
        record["temperature"] = float(module.temperature)
    else:
        record.update(num_classes=module.num_classes, in_channels=module.in_channels, hidden=module.hidden)
    return record


def publish_calibration(
    module: nn.Module,
    path: str | os.PathLike,
    weights: str | os.PathLike,
    validated_range: Any = None,
    range_path: str | os.PathLike | None = None,
    settings: Mapping[str, Any] | None = None,
    fold_modules: Sequence[nn.Module] = (),
    contours: Any = None,
    **info: Any,
) -> Path:
    """Publish ``module`` at ``path`` (``<models>/calibration.pt`` and ``calibration.json``) with, when given, the
    ``validated_range`` (at ``range_path``, default ``validated_range.json``) and ``contours`` (``contours.json``)
    as one set of the weights this process loaded (:func:`calib_monai.bundle.manifest.publish_artifacts`:
    ``manifest.json`` last; refused when ``weights`` holds others by now). ``settings``: what made them;
    ``fold_modules``: the cross-fitted recalibrations that scored the range, in its ``score_folds`` order;
    ``info``: the fit statistics (voxels, NLL and ECE before and after...)."""
    path = Path(path)
    weights_sha = loaded_sha256(weights) or file_sha256(weights)
    record = _record(module, weights, weights_sha, **info)
    stored = io.BytesIO()
    folds = [f.state_dict() for f in fold_modules]
    torch.save({**record, "state_dict": module.state_dict(), "fold_state_dicts": folds}, stored)
    calibration_sha = hashlib.sha256(stored.getvalue()).hexdigest()
    writers = {
        path.name: lambda tmp: Path(tmp).write_bytes(stored.getvalue()),
        path.with_suffix(".json").name: lambda tmp: Path(tmp).write_text(json.dumps(record, indent=2) + "\n"),
    }
    if validated_range is not None:
        range_name = Path(range_path).name if range_path is not None else "validated_range.json"
        if range_path is not None and Path(range_path).parent.resolve() != path.parent.resolve():
            raise ValueError(f"the validated range {range_path} must sit beside the calibration {path} (one set)")
        writers[range_name] = lambda tmp: validated_range.save(tmp, weights, weights_sha, calibration_sha)
    if contours is not None:
        record_of = contours.record()
        writers[CONTOURS_FILE] = lambda tmp: write_measured(tmp, record_of, weights, weights_sha, calibration_sha)
    depends = {"validated_range.json": path.name, CONTOURS_FILE: path.name}
    return publish_artifacts(path.parent, weights, writers, settings, depends, weights_sha256=weights_sha)


def calibration_set(path: str | os.PathLike, weights: str | os.PathLike | None = None) -> ArtifactSet:
    """The checked set (``calib_monai.bundle.manifest.read_artifact_set``) of the folder of the calibration
    ``path`` (``calibration.pt`` or its folder; ``none``: the network's own probabilities, asked for)."""
    if is_raw_request(path):
        folder = Path(weights).parent if weights is not None else Path(".")
        return read_artifact_set(folder, weights, raw=True)
    path = Path(path)
    return read_artifact_set(path if path.is_dir() else path.parent, weights)


def load_calibration(path: str | os.PathLike, weights: str | os.PathLike | None = None) -> nn.Module | None:
    """The calibration module stored at ``path`` (a ``calibration.pt`` is checked with its folder's set), or None when
    there is none, ``path`` is ``none``, or (without a manifest) it was fitted for other ``weights``: a warning."""
    return load_calibrations(path, weights)[0]


def load_calibrations(
    path: str | os.PathLike, weights: str | os.PathLike | None = None
) -> tuple[nn.Module | None, list[nn.Module]]:
    """:func:`load_calibration`'s module and its cross-fitted recalibrations (``fold_state_dicts``, in
    ``score_folds`` order; [] for a plain split or none)."""
    record = _read(path, weights)
    if record is None:
        return None, []
    return _built(record, record["state_dict"]), [_built(record, s) for s in record.get("fold_state_dicts", [])]


def _read(path: str | os.PathLike, weights: str | os.PathLike | None) -> dict[str, Any] | None:
    """The checked record of :func:`load_calibration` (None: none applies)."""
    if is_raw_request(path):
        return None
    path = Path(path)
    if path.is_dir():
        path = path / CALIBRATION_FILE
    if path.name == CALIBRATION_FILE:
        artifacts = calibration_set(path, weights)
        if artifacts.manifest is not None and artifacts.calibration is None:
            return None  # the published set has no recalibration
    if not path.is_file():
        return None
    fix = "delete it and run the bundle's calibrate step again"
    record = read_weights_file(path, what="a calibration file of calib_monai", fix=fix)  # names what is wrong
    try:
        if record["method"] not in METHODS:
            raise KeyError(record["method"])
    except Exception as err:
        raise ValueError(
            f"{path} is not a calibration file of calib_monai ({type(err).__name__}: {err}); {fix}"
        ) from err
    if weights is not None and Path(weights).is_file() and record.get("weights_sha256") != file_sha256(weights):
        logger.warning(
            f"{path} was fitted for other weights than {weights} (the model was trained again since): "
            "not applied; run the bundle's calibrate step again"
        )
        return None
    return record


def _built(record: Mapping[str, Any], state_dict: Mapping[str, Any]) -> nn.Module:
    if METHODS[record["method"]] is TemperatureScaling:
        module: nn.Module = TemperatureScaling(record["temperature"])
    else:
        module = LocalTemperatureScaling(record["num_classes"], record["in_channels"], record["hidden"])
    module.load_state_dict(state_dict)
    return module.eval()


def calibrate_volumes(
    calibrations: Sequence[nn.Module], logits: torch.Tensor, image: torch.Tensor | None, spatial_dim: int = 2
) -> list[torch.Tensor]:
    """A volume's logits ``(C, H, W, D)`` (or 2D ``(C, H, W)``) as each 2D calibration module recalibrates them, slice
    by slice along ``spatial_dim``, with the image ``(C_in, H, W, D)``; local temperature modules run as one network
    (:func:`~calib_monai.recalibration.local_temperature.temperature_maps`)."""
    flat = logits.ndim == 3
    axis = 0 if flat else spatial_dim + 1
    slices = logits[None] if flat else logits.movedim(axis, 0)
    images = None if image is None else torch.as_tensor(image).to(logits.device)
    images = None if images is None else (images[None] if flat else images.movedim(axis, 0))
    if calibrations and all(isinstance(c, LocalTemperatureScaling) for c in calibrations):
        maps = temperature_maps(calibrations, slices, images)
        calibrated = [slices / maps[:, k : k + 1] for k in range(len(calibrations))]
    else:
        calibrated = [c(slices, images) for c in calibrations]
    return [z[0] if flat else z.movedim(0, axis) for z in calibrated]


def calibrate_volume(
    calibration: nn.Module, logits: torch.Tensor, image: torch.Tensor | None, spatial_dim: int = 2
) -> torch.Tensor:
    """:func:`calibrate_volumes` of one calibration module."""
    return calibrate_volumes([calibration], logits, image, spatial_dim)[0]


def case_score_offsets(served: torch.Tensor, by_fold: Sequence[torch.Tensor], pred: torch.Tensor) -> list[float]:
    """Per fold ``j``, ``t_full - t_j``: the case score (mean estimated DSC) of the served recalibration's logits
    ``served`` minus that of fold ``j``'s, ``by_fold[j]``, with one segmentation ``pred`` (the raw argmax). The review
    rule compares a range volume scored by fold ``j`` with the served score less ``t_full - t_j`` (cross-conformal)."""

    def score(z: torch.Tensor) -> float:
        return float(estimated_dice(torch.softmax(z.float(), dim=0), pred).nanmean())

    full = score(served)
    return [full - score(z) for z in by_fold]


class CalibrateLogitsd(MapTransform):
    """Calibrate a volume's logits under ``keys`` (before the softmax); optionally keep the uncalibrated softmax.

    Args:
        keys: the logits ``(C, *spatial)`` (``"pred"``).
        calibration: a calibration module, a ``calibration.pt`` path (or its folder), checked with its set
            (:func:`load_calibration`), or ``"none"`` / None: no recalibration (the validated range is then not
            applied either: :data:`NOT_APPLICABLE`).
        weights: the network's weights file, to check that a stored calibration was fitted for them.
        image_key: the image, for local temperature scaling.
        uncalibrated_key: where to put ``softmax`` of the logits as they came (the evaluation's "before" numbers);
            None keeps nothing.
        spatial_dim: the slice axis of the 2D network (as ``SliceInferer``).
        source_key: where each item gets the source of its outputs (``ArtifactSet.source``: SHA-256s); None with a
            module given.

    A stored calibration with cross-fitted folds also gives each item ``data["case_score_offsets"]``
    (:func:`case_score_offsets`) for the review rule.
    """

    def __init__(
        self,
        keys,
        calibration: nn.Module | str | os.PathLike | None = None,
        weights: str | os.PathLike | None = None,
        image_key: str = "image",
        uncalibrated_key: str | None = None,
        spatial_dim: int = 2,
        allow_missing_keys: bool = False,
        source_key: str = SOURCE_KEY,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.source, self.folds = None, []
        if is_raw_request(calibration) or isinstance(calibration, (str, os.PathLike)):
            raw = is_raw_request(calibration)
            artifacts = None if raw and weights is None else calibration_set(calibration, weights)
            calibration, self.folds = (None, []) if raw else load_calibrations(calibration, weights)
            if artifacts is not None:
                if calibration is None:  # none asked for, none stored, or (no manifest) one for other weights
                    artifacts.calibration = artifacts.validated_range = None
                self.source = artifacts.source()
        self.calibration = calibration
        self.image_key, self.uncalibrated_key, self.spatial_dim = image_key, uncalibrated_key, spatial_dim
        self.source_key = source_key
        if calibration is not None:  # one line: a module's repr lists its layers
            detail = calibration.extra_repr() if isinstance(calibration, nn.Module) else ""
            name = type(calibration).__name__ + (f"({detail})" if detail and "\n" not in detail else "")
            logger.info(f"logits calibrated with {name}")

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            logits = d[key]
            if self.uncalibrated_key is not None:
                d[self.uncalibrated_key] = torch.softmax(logits.float(), dim=0)
            if self.calibration is not None:
                with torch.no_grad():  # the served recalibration and its folds in one pass
                    modules = [m.to(logits.device) for m in (self.calibration, *self.folds)]
                    d[key], *by_fold = calibrate_volumes(modules, logits, d.get(self.image_key), self.spatial_dim)
                    if by_fold:
                        pred = logits.max(0).indices  # argmax's first maximum, in a tenth of its time (CPU)
                        d[CASE_SCORE_OFFSETS] = case_score_offsets(d[key], by_fold, pred)
        if self.source is not None and self.source_key:
            d[self.source_key] = dict(self.source)
        return d
