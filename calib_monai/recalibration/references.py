"""The fixed references of the review rule's input and feature signals: the statistics and pooled bottleneck features
of training images through the served chain, fitted before any validation or served case is seen, so both are
measured by one function and stay exchangeable."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from calib_monai.defaults import FEATURE_DIM, MAX_REFERENCE
from calib_monai.metrics.feature_distance import MahalanobisDistance, ledoit_wolf_precision
from calib_monai.metrics.image_statistics import input_statistics, statistic_floor, statistic_group
from calib_monai.metrics.network_features import BottleneckFeatures

__all__ = ["fixed_references", "training_references"]


def training_references(
    items: Sequence[Mapping],
    transform: Callable,
    inferer: Callable | None = None,
    network: torch.nn.Module | None = None,
    max_images: int = MAX_REFERENCE,
    image_key: str = "image",
) -> tuple[list[list[float]], list[np.ndarray] | None]:
    """The image statistics of up to ``max_images`` of ``items`` (evenly spaced) after ``transform`` (the served
    preprocessing), and their pooled bottleneck features when ``inferer`` runs ``network`` on them (None without)."""
    chosen = np.unique(np.linspace(0, len(items) - 1, min(int(max_images), len(items))).round().astype(int))
    hook = BottleneckFeatures(network) if inferer is not None and network is not None else None
    device = next(network.parameters()).device if hook is not None else None
    stats, features = [], []
    if hook is not None:
        hook.start()
    try:
        for i in chosen:
            image = transform(dict(items[i]))[image_key]
            stats.append(input_statistics(image))
            if hook is not None:
                with torch.no_grad():
                    inferer(torch.as_tensor(image)[None].to(device), network)
                features.append(hook.pop().vector)
    finally:
        if hook is not None:
            hook.stop()
    return stats, (features if hook is not None else None)


def fixed_references(
    inputs: Sequence[Sequence[float]] | None,
    features: Sequence[np.ndarray] | None,
    validation_features: Sequence[np.ndarray] | None,
    max_dim: int = FEATURE_DIM,
    input_names: Sequence[str] = (),
) -> dict[str, Any]:
    """``{"input_reference": {"mean", "std", "images", "precision", "shading_precision"}, "feature_reference":
    {"distance": the Mahalanobis distance of the training features (``max_dim`` components), "validation": the
    validation cases' distances, "images"}}`` (None without training images; ``"why"`` when the features cannot be
    fitted; a precision only when its group's statistics, told apart by ``input_names``, are finite)."""
    out: dict[str, Any] = {"input_reference": None, "feature_reference": None}
    if inputs is not None and len(inputs) >= 2:
        stats = np.asarray(inputs, dtype=np.float64)
        out["input_reference"] = {"mean": stats.mean(0).tolist(), "std": stats.std(0).tolist(), "images": len(stats)}
        for group, key in (("intensity", "precision"), ("shading", "shading_precision")):
            precision = group_precision(stats, input_names, group)
            if precision is not None:
                out["input_reference"][key] = precision.tolist()
    if features is None or validation_features is None or len(features) < 3:
        return out
    try:
        x = np.stack([np.asarray(f, dtype=np.float64).reshape(-1) for f in features])
        distance = MahalanobisDistance(max_dim=max_dim).fit(x)
        measured = [float(distance.distance(np.asarray(v, dtype=np.float64).reshape(-1))) for v in validation_features]
    except ValueError as err:
        return {**out, "why": f"the training images' features cannot be fitted ({err})"}
    out["feature_reference"] = {"distance": distance.to_dict(), "validation": measured, "images": len(x)}
    return out


def group_precision(stats: np.ndarray, names: Sequence[str], group: str = "intensity") -> np.ndarray | None:
    """The precision (pseudo-inverse of the Ledoit-Wolf covariance) of the training images' statistics of one
    :func:`~calib_monai.metrics.image_statistics.statistic_group` (``"intensity"``: all columns when unnamed), each
    standardised by its spread (at least its :func:`statistic_floor`); None when one is not finite or there is none.
    Joint distances catch a gamma or a bias field that moves several statistics each by less than its threshold."""
    if names:
        columns = [i for i, name in enumerate(names) if statistic_group(name) == group]
    else:
        columns = list(range(stats.shape[1])) if group == "intensity" else []
    values = stats[:, columns]
    if not columns or not np.isfinite(values).all():
        return None
    floor = [statistic_floor(names[i]) if names else 0.0 for i in columns]
    scale = np.maximum(np.maximum(values.std(0), floor), np.finfo(np.float64).eps)
    return ledoit_wolf_precision((values - values.mean(0)) / scale)
