"""Case quality from a case's own probabilities, without its label: what a user decides on.

For one volume's probabilities ``p (C, *spatial)`` and its prediction ``pred = argmax_c p``, per foreground class k:

* **estimated DSC** (the "expected Dice": Jungo & Reyes, MICCAI 2019; Zenk et al., MedIA 2025)::

      est_dsc_k = 2 * sum_v p_k(v) [pred(v) = k] / (sum_v [pred(v) = k] + sum_v p_k(v))

  the expected DSC of the prediction against labels drawn voxel by voxel from ``p``, up to O(1/size). A class
  predicted nowhere whose largest probability is below ``ABSENT_PROBABILITY`` is absent: NaN (``empty_class="nan"``)
  or 1 (``"papers"``), as the true DSC; predicted nowhere but above it, 0.
* **volume**: expected volume ``sum_v p_k(v)`` with the interval ``mean +- 1.96 s sqrt(sum_v p_k (1 - p_k))``
  (Poisson-binomial, independent voxels, clipped at 0); :func:`fit_volume_interval_scale` fits ``s`` (split
  conformal) since neighbouring voxels are not independent; and the prediction's volume.
* **low-confidence fraction**: the share of the voxels predicted as k whose ``max_c p_c`` is below ``threshold``.

The **case score** is the mean estimated DSC over the foreground classes (NaN left out). Everything runs on ``p``'s
device; impossible inputs are a one-line ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from calib_monai.checks import check_number, check_option
from calib_monai.defaults import EMPTY_CLASS, LOW_CONFIDENCE, VOLUME_COVERAGE
from calib_monai.tensors import detached_plain_tensor

from .calibration import probability_problem
from .segmentation import EMPTY_CLASS_CONVENTIONS

__all__ = [
    "ABSENT_PROBABILITY",
    "CASE_SCORE",
    "case_quality",
    "estimated_dice",
    "fit_volume_interval_scale",
    "predicted_volumes",
    "low_confidence_fraction",
    "structure_band",
]

#: The name of the case score in reports and outputs.
CASE_SCORE = "est_mean_dice"
Z95 = 1.959963984540054  # two-sided 95% normal quantile
#: A class predicted nowhere whose largest probability ``max_v p_k(v)`` is below this is absent (module doc): unlike
#: its expected size, that does not grow with the volume; a missed structure's core stays above it, leaks far below.
ABSENT_PROBABILITY = 0.1


def _check_voxel_volume(voxel_volume: Any) -> float:
    return check_number("voxel_volume", voxel_volume, 0, low_open=True, hint="mL or mm^3 of one voxel")


def _check_threshold(threshold: Any) -> float:
    return check_number("threshold", threshold, 0, 1, wanted="a confidence in [0, 1]")


def _check_scale(scale: Any) -> float:
    return check_number("volume_interval_scale", scale, 0, low_open=True, hint="1: independent voxels")


def _probabilities(prob: Any) -> torch.Tensor:
    prob = detached_plain_tensor(torch.as_tensor(prob))
    if prob.ndim < 2:
        raise ValueError(f"case quality needs class probabilities (C, *spatial), got shape {tuple(prob.shape)}")
    if prob.shape[0] < 2:
        raise ValueError(f"case quality needs at least 2 classes (background + 1), got {prob.shape[0]}")
    if prob.device.type == "meta" or not prob.numel():  # nothing to read back
        return prob
    if not prob.is_floating_point():
        raise ValueError(f"prob must be floating-point softmax probabilities in [0, 1], got dtype {prob.dtype}.")
    lo, hi = torch.aminmax(prob)
    sum_lo, sum_hi = torch.aminmax(prob.sum(dim=0, dtype=torch.float32 if prob.element_size() < 4 else prob.dtype))
    values = torch.stack([lo.double(), hi.double(), sum_lo.double(), sum_hi.double()]).tolist()  # one read-back
    tolerance = max(1e-3, prob.shape[0] * torch.finfo(prob.dtype).eps)
    problem = probability_problem("prob", *values, class_dim=0, tolerance=tolerance)
    if problem:
        raise ValueError(problem)
    return prob


def _prediction(prob: torch.Tensor, pred: torch.Tensor | None) -> torch.Tensor:
    """The label map ``(*spatial)`` of ``pred`` (a label map or one-hot), else the argmax of ``prob``."""
    if pred is None:
        return prob.argmax(0)
    pred = detached_plain_tensor(torch.as_tensor(pred)).to(prob.device)
    if pred.shape == prob.shape and prob.shape[0] > 1:
        return pred.argmax(0)
    if pred.ndim == prob.ndim and pred.shape[0] == 1:
        pred = pred[0]
    if pred.shape != prob.shape[1:]:
        raise ValueError(
            f"pred has shape {tuple(pred.shape)}, expected {tuple(prob.shape[1:])} or one-hot {tuple(prob.shape)}"
        )
    return pred.long()


def _class_sums(
    prob: torch.Tensor,
    label: torch.Tensor,
    confidence: torch.Tensor | None = None,
    threshold: float | None = None,
    argmax: bool = False,
    square: bool = True,
) -> dict[str, torch.Tensor]:
    """Per class ``(C,)`` float64 sums, on the input's device: voxels predicted as the class (``count``), sum,
    largest and (``square``) sum of squares of its probability, its sum where predicted (``overlap``) and, given
    ``confidence`` (``max_c p``), its sum (``confidence``) and count below ``threshold`` (``low``) there."""
    classes, f64 = prob.shape[0], torch.float64
    flat, labels = prob.reshape(classes, -1), label.reshape(-1).long()

    def per_class(values: torch.Tensor) -> torch.Tensor:  # sum of values over the voxels of each predicted class
        return torch.zeros(classes, dtype=f64, device=prob.device).index_add_(0, labels, values.to(f64))

    # the predicted class's probability at each voxel: the confidence itself when the label is the argmax
    own = confidence.reshape(-1) if argmax and confidence is not None else flat.gather(0, labels[None])[0]
    sums = {
        "count": per_class(torch.ones((), dtype=f64, device=prob.device).expand(labels.shape)),
        "expected": flat.sum(1, dtype=f64),
        "largest": flat.amax(1).to(f64) if flat.shape[1] else torch.zeros(classes, dtype=f64, device=prob.device),
        "overlap": per_class(own),
    }
    if square:
        sums["square"] = torch.stack([torch.dot(q, q) for q in (p.to(f64) for p in flat)])  # exact: a class at a time
    if confidence is not None:
        confidence = confidence.reshape(-1)
        sums["confidence"] = sums["overlap"] if argmax else per_class(confidence)  # argmax: the same sums
        if threshold is not None:
            sums["low"] = per_class(confidence < threshold)
    return sums


def estimated_dice(prob: Any, pred: Any = None, empty_class: str = EMPTY_CLASS) -> torch.Tensor:
    """Estimated DSC of each foreground class (see the module), ``(C - 1,)`` float64 on ``prob``'s device.

    >>> import torch
    >>> prob = torch.tensor([[0.1, 0.1, 0.8, 1.0], [0.9, 0.9, 0.2, 0.0]])  # (C, *spatial): class 1 at voxels 0, 1
    >>> # 2 sum_{predicted} p_1 / (|predicted| + sum_v p_1) = 2 * 1.8 / (2 + 2)
    >>> [round(v, 4) for v in estimated_dice(prob).tolist()]
    [0.9]
    """
    empty_class = check_option("empty_class", empty_class, EMPTY_CLASS_CONVENTIONS)
    prob = _probabilities(prob)
    return _dice_from(_class_sums(prob, _prediction(prob, pred), square=False), empty_class)


def _dice_from(sums: dict[str, torch.Tensor], empty_class: str) -> torch.Tensor:
    predicted, expected, overlap = sums["count"][1:], sums["expected"][1:], sums["overlap"][1:]
    size = predicted + expected
    est = 2 * overlap / size.clamp_min(torch.finfo(torch.float64).tiny)  # 0 when predicted nowhere
    absent = (predicted == 0) & (sums["largest"][1:] < ABSENT_PROBABILITY)  # whatever the volume's size
    return torch.where(absent, torch.nan if empty_class == "nan" else 1.0, est)


def predicted_volumes(
    prob: Any, pred: Any = None, voxel_volume: float = 1.0, volume_interval_scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """Per foreground class, float64 ``(C - 1,)`` times ``voxel_volume``: ``expected`` (sum of p), ``low`` / ``high``
    (its interval, see the module) and ``predicted`` (voxels of the prediction).

    >>> import torch
    >>> prob = torch.tensor([[0.1, 0.1, 0.8, 1.0], [0.9, 0.9, 0.2, 0.0]])  # (C, *spatial): class 1 at voxels 0, 1
    >>> volumes = predicted_volumes(prob, voxel_volume=0.5)  # 0.5 mL per voxel
    >>> round(volumes["expected"].item(), 4), volumes["predicted"].item()  # 0.5 * (0.9 + 0.9 + 0.2), 0.5 * 2 voxels
    (1.0, 1.0)
    """
    scale, widen = _check_voxel_volume(voxel_volume), _check_scale(volume_interval_scale)
    prob = _probabilities(prob)
    return _volumes_from(_class_sums(prob, _prediction(prob, pred)), scale, widen)


def _volumes_from(sums: dict[str, torch.Tensor], scale: float, widen: float) -> dict[str, torch.Tensor]:
    expected, counts = sums["expected"][1:], sums["count"][1:]
    half = (Z95 * widen) * (expected - sums["square"][1:]).clamp_min(0).sqrt()  # sum p (1 - p)
    return {
        "expected": expected * scale,
        "low": (expected - half).clamp_min(0) * scale,
        "high": (expected + half) * scale,
        "predicted": counts * scale,
    }


def fit_volume_interval_scale(expected: Any, high: Any, true: Any, coverage: float = VOLUME_COVERAGE) -> float:
    """The ``volume_interval_scale`` whose interval holds the true volume with probability ``coverage`` (split
    conformal; Angelopoulos & Bates 2021): the ``ceil((n + 1) coverage)``-th smallest ``|true - expected| /
    (high - expected)`` of the n pairs (intervals of scale 1); non-finite or zero-width pairs left out; inf when n is
    too small.

    >>> # ratios |true - expected| / (high - expected): 1/2, 4/2, 0/3; sorted (0, 0.5, 2), the ceil(4 * 0.5) = 2nd
    >>> fit_volume_interval_scale([10.0, 20.0, 30.0], [12.0, 22.0, 33.0], [11.0, 24.0, 30.0], coverage=0.5)
    0.5
    """
    values = [torch.as_tensor(v, dtype=torch.float64).reshape(-1).cpu() for v in (expected, high, true)]
    if len({v.numel() for v in values}) != 1:
        raise ValueError(
            f"expected, high and true must have one value per pair, got sizes {[v.numel() for v in values]}."
        )
    check_number("coverage", coverage, 0, 1, low_open=True, high_open=True, wanted="a number in (0, 1)")
    expected, high, true = values
    half = high - expected
    keep = torch.isfinite(expected) & torch.isfinite(half) & torch.isfinite(true) & (half > 0)
    ratios = ((true - expected).abs() / half)[keep].sort().values
    rank = math.ceil((ratios.numel() + 1) * float(coverage))
    return float(ratios[rank - 1]) if 0 < rank <= ratios.numel() else float("inf")


def low_confidence_fraction(prob: Any, pred: Any = None, threshold: float = LOW_CONFIDENCE) -> torch.Tensor:
    """Per foreground class ``(C - 1,)``: the share of its predicted voxels with ``max_c p_c < threshold`` (NaN: none).

    >>> import torch
    >>> prob = torch.tensor([[0.1, 0.1, 0.8, 1.0], [0.9, 0.9, 0.2, 0.0]])  # (C, *spatial): class 1 at voxels 0, 1
    >>> low_confidence_fraction(prob, threshold=0.8).tolist(), low_confidence_fraction(prob, threshold=0.95).tolist()
    ([0.0], [1.0])
    """
    threshold = _check_threshold(threshold)
    prob = _probabilities(prob)
    return _low_from(_class_sums(prob, _prediction(prob, pred), prob.max(0).values, threshold, square=False))


def _low_from(sums: dict[str, torch.Tensor]) -> torch.Tensor:
    counts, lows = sums["count"][1:], sums["low"][1:]
    return torch.where(counts > 0, lows / counts.clamp_min(1), torch.nan)


def structure_band(masks: Sequence[torch.Tensor], radius: int) -> torch.Tensor:
    """Voxels within ``radius`` voxels (Chebyshev distance) of any voxel set in one of ``masks`` (``(*spatial)``
    booleans, 2D or 3D): where a user reads probabilities around the predicted and true structures."""
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


def case_quality(
    prob: Any,
    pred: Any = None,
    voxel_volume: float = 1.0,
    threshold: float = LOW_CONFIDENCE,
    class_names: Sequence[str] | None = None,
    empty_class: str = EMPTY_CLASS,
    volume_interval_scale: float = 1.0,
    confidence: Any = None,
) -> dict[str, Any]:
    """A case's quality estimate as plain numbers (no label needed; see the module).

    ``confidence``: ``max_c p`` already taken, with ``pred`` its argmax (``ConfidenceAndSegmentationd``), saves a
    pass. ``volume_interval_scale``: the volume interval's factor (:func:`fit_volume_interval_scale`).

    Returns ``{"case_score", "mean_confidence", "classes": {name: {"est_dice", "volume", "volume_low",
    "volume_high", "volume_predicted", "low_confidence_fraction"}}, "voxel_volume", "threshold",
    "volume_interval_scale"}`` (volumes in units of ``voxel_volume``; names default to ``class_<k>``).

    >>> import torch
    >>> prob = torch.tensor([[0.1, 0.1, 0.8, 1.0], [0.9, 0.9, 0.2, 0.0]])  # (C, *spatial): class 1 at voxels 0, 1
    >>> quality = case_quality(prob, class_names=["background", "organ"])
    >>> round(quality["case_score"], 4), quality["classes"]["organ"]["volume_predicted"]
    (0.9, 2.0)
    """
    voxel_volume, threshold = _check_voxel_volume(voxel_volume), _check_threshold(threshold)
    empty_class = check_option("empty_class", empty_class, EMPTY_CLASS_CONVENTIONS)
    widen = _check_scale(volume_interval_scale)
    prob = _probabilities(prob)
    names = list(class_names)[1:] if class_names is not None else [f"class_{k}" for k in range(1, prob.shape[0])]
    if len(names) != prob.shape[0] - 1:
        raise ValueError(f"{prob.shape[0]} classes in the probabilities, {len(names) + 1} class names")
    given = confidence is not None and pred is not None
    if given:  # the serving path's argmax and confidence
        label, confidence = _prediction(prob, pred), detached_plain_tensor(torch.as_tensor(confidence)).to(prob.device)
        confidence = confidence.reshape(label.shape)
    else:
        confidence, label = prob.max(0)  # one pass: the confidence and the argmax
        label = label if pred is None else _prediction(prob, pred)
    sums = _class_sums(prob, label, confidence, threshold, argmax=given or pred is None)
    est, volumes, low = _dice_from(sums, empty_class), _volumes_from(sums, voxel_volume, widen), _low_from(sums)
    foreground = sums["count"][1:].sum()
    mean_confidence = torch.where(foreground > 0, sums["confidence"][1:].sum() / foreground.clamp_min(1), torch.nan)
    values = torch.stack([est, volumes["expected"], volumes["low"], volumes["high"], volumes["predicted"], low])
    rows = values.cpu().tolist()  # one read-back for every number
    keys = ("est_dice", "volume", "volume_low", "volume_high", "volume_predicted", "low_confidence_fraction")
    classes = {name: {key: rows[i][k] for i, key in enumerate(keys)} for k, name in enumerate(names)}
    finite = [v for v in rows[0] if v == v]
    return {
        "case_score": sum(finite) / len(finite) if finite else float("nan"),
        "mean_confidence": float(mean_confidence),
        "classes": classes,
        "voxel_volume": voxel_volume,
        "threshold": threshold,
        "volume_interval_scale": widen,
    }
