"""Case quality from a case's own probabilities, without its label: what a user decides on.

For one volume's class probabilities ``p (C, *spatial)`` (softmax, 2D or 3D) and its prediction
``pred = argmax_c p``, per foreground class k:

* **estimated DSC**: the expected overlap of the prediction with a label drawn voxel by voxel from ``p``
  (the soft Dice of Milletari et al. 2016 between the prediction and the model's own probabilities)::

      est_dsc_k = 2 * sum_v p_k(v) [pred(v) = k] / (sum_v [pred(v) = k] + sum_v p_k(v))

  the ratio of the expectations of ``2 |pred_k & y_k|`` and ``|pred_k| + |y_k|`` under independent
  ``y(v) ~ Categorical(p(v))``. Their ratio concentrates at its expectation as the structure grows (both sums
  are sums of many independent terms), so for a perfectly calibrated model the estimate is the expected DSC up
  to O(1/size). This is the "expected Dice" used for segmentation quality control (e.g. Jungo & Reyes, MICCAI 2019
  aggregate uncertainty maps to case level; Zenk et al., MedIA 2025, benchmark such single-model aggregates
  against ensembles). Why this estimator rather than the mean confidence of the predicted voxels: it counts the
  probability the model puts *outside* its prediction (expected misses), which mean confidence cannot see; the
  quality study (``docs/results``) compares both. A class the model predicts nowhere gets 0 (the model gives it
  some probability, so its expected DSC with an empty prediction is 0), or NaN when it gives it none at all.
* **volume**: expected volume ``sum_v p_k(v)`` (voxels, times the voxel volume), with the 95% interval of the
  Poisson-binomial count, ``mean +- 1.96 sqrt(sum_v p_k (1 - p_k))`` (normal approximation, clipped at 0);
  and the volume of the prediction ``sum_v [pred(v) = k]``.
* **low-confidence fraction**: the share of the predicted voxels of class k whose confidence ``max_c p_c`` is below
  ``threshold``.

The **case score** is the mean estimated DSC over the foreground classes (NaN classes left out): one number per
case, comparable with the case's mean DSC. ``mean_confidence`` (the mean max probability of the predicted foreground
voxels, a common single-model aggregate) is reported beside it.

Everything runs on ``p``'s device; a few numbers per class come back to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ._inputs import as_plain_tensor

__all__ = [
    "CASE_SCORE",
    "case_quality",
    "estimated_dice",
    "image_statistics",
    "predicted_volumes",
    "low_confidence_fraction",
    "structure_band",
]

#: The name of the case score in reports and outputs.
CASE_SCORE = "est_mean_dice"
Z95 = 1.959963984540054  # two-sided 95% normal quantile


def _probabilities(prob: Any) -> torch.Tensor:
    prob = as_plain_tensor(torch.as_tensor(prob))
    if prob.ndim < 2:
        raise ValueError(f"case quality needs class probabilities (C, *spatial), got shape {tuple(prob.shape)}")
    if prob.shape[0] < 2:
        raise ValueError(f"case quality needs at least 2 classes (background + 1), got {prob.shape[0]}")
    return prob


def _prediction(prob: torch.Tensor, pred: torch.Tensor | None) -> torch.Tensor:
    """The label map ``(*spatial)`` of ``pred`` (label map ``(1, *spatial)`` / ``(*spatial)`` or one-hot), else the
    argmax of ``prob``."""
    if pred is None:
        return prob.argmax(0)
    pred = as_plain_tensor(torch.as_tensor(pred)).to(prob.device)
    if pred.shape == prob.shape and prob.shape[0] > 1:
        return pred.argmax(0)
    if pred.ndim == prob.ndim and pred.shape[0] == 1:
        pred = pred[0]
    if pred.shape != prob.shape[1:]:
        raise ValueError(
            f"pred has shape {tuple(pred.shape)}, expected {tuple(prob.shape[1:])} or one-hot {tuple(prob.shape)}"
        )
    return pred.long()


def _per_class(prob: torch.Tensor, label: torch.Tensor, value) -> torch.Tensor:
    """``value(p_k, mask_k)`` for each foreground class k, stacked; one class at a time (no one-hot copy)."""
    return torch.stack([value(prob[k], label == k) for k in range(1, prob.shape[0])])


def estimated_dice(prob: Any, pred: Any = None) -> torch.Tensor:
    """Estimated DSC of each foreground class, ``(C - 1,)`` float64 on ``prob``'s device (see the module)."""
    prob = _probabilities(prob)
    label = _prediction(prob, pred)
    overlap = _per_class(prob, label, lambda p, m: (p.double() * m).sum())
    size = _per_class(prob, label, lambda p, m: m.sum().double() + p.double().sum())
    return torch.where(size > 0, 2 * overlap / size.clamp_min(torch.finfo(torch.float64).tiny), torch.nan)


def predicted_volumes(prob: Any, pred: Any = None, voxel_volume: float = 1.0) -> dict[str, torch.Tensor]:
    """Per foreground class, float64 ``(C - 1,)``: ``expected`` (sum of p), ``low`` / ``high`` (its 95% interval)
    and ``predicted`` (voxels of the prediction), each times ``voxel_volume``."""
    prob = _probabilities(prob)
    label = _prediction(prob, pred)
    flat = prob.reshape(prob.shape[0], -1)[1:].double()
    expected = flat.sum(1)
    half = Z95 * (flat * (1 - flat)).sum(1).clamp_min(0).sqrt()
    counts = _per_class(prob, label, lambda p, m: m.sum().double())
    scale = float(voxel_volume)
    return {
        "expected": expected * scale,
        "low": (expected - half).clamp_min(0) * scale,
        "high": (expected + half) * scale,
        "predicted": counts * scale,
    }


def low_confidence_fraction(prob: Any, pred: Any = None, threshold: float = 0.8) -> torch.Tensor:
    """Per foreground class ``(C - 1,)``: the share of its predicted voxels with ``max_c p_c < threshold`` (NaN
    where the class is predicted nowhere)."""
    prob = _probabilities(prob)
    label = _prediction(prob, pred)
    low = prob.max(0).values < threshold
    counts = _per_class(prob, label, lambda p, m: m.sum().double())
    lows = _per_class(prob, label, lambda p, m: (m & low).sum().double())
    return torch.where(counts > 0, lows / counts.clamp_min(1), torch.nan)


def structure_band(masks: Sequence[torch.Tensor], radius: int) -> torch.Tensor:
    """Voxels within ``radius`` voxels (a cube, Chebyshev distance) of any voxel that is set in one of ``masks``
    (``(*spatial)`` booleans, 2D or 3D): the region around the predicted and true structures where a user reads
    probabilities (calibration "in a band")."""
    union = masks[0].bool()
    for mask in masks[1:]:
        union = union | mask.bool()
    if radius <= 0:
        return union
    pool = {2: F.max_pool2d, 3: F.max_pool3d}.get(union.ndim)
    if pool is None:
        raise ValueError(f"structure_band takes 2D or 3D masks, got {union.ndim}D")
    grown = pool(union[None, None].float(), kernel_size=2 * radius + 1, stride=1, padding=radius)
    return grown[0, 0] > 0


def image_statistics(image: Any) -> list[float]:
    """The mean and standard deviation of each channel of a (preprocessed) image ``(C, *spatial)``: where its
    intensities sit, which the validated range compares with the validation images'."""
    image = as_plain_tensor(torch.as_tensor(image)).double()
    flat = image.reshape(image.shape[0], -1)
    return torch.stack([flat.mean(1), flat.std(1, correction=0)], dim=1).reshape(-1).cpu().tolist()


def case_quality(
    prob: Any,
    pred: Any = None,
    voxel_volume: float = 1.0,
    threshold: float = 0.8,
    class_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A case's quality estimate as plain numbers (no label needed).

    Returns ``{"case_score", "mean_confidence", "classes": {name: {"est_dice", "volume", "volume_low",
    "volume_high", "volume_predicted", "low_confidence_fraction"}}, "voxel_volume", "threshold"}`` (volumes in units
    of ``voxel_volume``; names default to ``class_<k>``).
    """
    prob = _probabilities(prob)
    label = _prediction(prob, pred)
    names = list(class_names)[1:] if class_names is not None else [f"class_{k}" for k in range(1, prob.shape[0])]
    if len(names) != prob.shape[0] - 1:
        raise ValueError(f"{prob.shape[0]} classes in the probabilities, {len(names) + 1} class names")
    est = estimated_dice(prob, label)
    volumes = predicted_volumes(prob, label, voxel_volume)
    low = low_confidence_fraction(prob, label, threshold)
    confidence, foreground = prob.max(0).values.double(), label > 0
    mean_confidence = torch.where(
        foreground.any(), (confidence * foreground).sum() / foreground.sum().clamp_min(1), torch.nan
    )
    values = torch.stack([est, volumes["expected"], volumes["low"], volumes["high"], volumes["predicted"], low])
    rows = values.cpu().tolist()  # one read-back for every number
    keys = ("est_dice", "volume", "volume_low", "volume_high", "volume_predicted", "low_confidence_fraction")
    classes = {name: {key: rows[i][k] for i, key in enumerate(keys)} for k, name in enumerate(names)}
    finite = [v for v in rows[0] if v == v]
    return {
        "case_score": sum(finite) / len(finite) if finite else float("nan"),
        "mean_confidence": float(mean_confidence),
        "classes": classes,
        "voxel_volume": float(voxel_volume),
        "threshold": float(threshold),
    }
