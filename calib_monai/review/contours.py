"""Inner and outer contours of each structure with a per-case guarantee, their margins chosen on the validation
subjects by the bundle's ``calibrate`` step and stored next to the weights as ``<models>/contours.json``.

For a foreground class ``c`` with calibrated probabilities ``p_c`` and the prediction ``P = {argmax == c}``:

* the **outer** contour ``O(l) = {p_c >= l_out} | P`` (nested: it grows as ``l_out`` falls);
* the **inner** contour ``I(l) = P & {p_c >= l_in}``.

Guarantee (``risk="per_case"``, the default): for a new case of a subject exchangeable with the ``m`` validation
subjects, ``P(|T \\ O| <= eps |T|) >= 1 - alpha`` (the outer contour holds at least ``1 - eps`` of the true structure
``T``) and ``P(|I \\ T| <= eps |I|) >= 1 - alpha`` (at least ``1 - eps`` of the inner contour lies inside it): a
conformal bound on the per-case loss ``1{missed fraction > eps}``, not a voxel average. Each validation volume
requires the largest ``l_out`` at which its outer contour still holds ``1 - eps`` of its truth (the miss is monotone
in ``l_out``) and the smallest ``l_in`` at which every inner contour from there up lies ``1 - eps`` inside it (the
inner loss is not monotone: it is made so, as Angelopoulos et al. do); a subject requires its worst volume's. With
``j = floor(alpha (m + 1))`` (:func:`~calib_monai.review.conformal.flag_rank`), ``l_out`` is the ``j``-th smallest
of the subjects' required ``l_out`` and ``l_in`` the ``k = ceil((m + 1)(1 - alpha)) = m + 1 - j``-th smallest of
their required ``l_in``: a new subject's requirement falls beyond it with probability at most ``j / (m + 1) <=
alpha``. ``j = 0`` (``m < 1 / alpha - 1``): the lambdas are ``null`` and the record says how many subjects are needed,
as the review flag does.

``risk="expected"``: conformal risk control (Angelopoulos, Bates, Fisch, Lei and Schuster, ICLR 2024) of the
expected missed fraction (outer) and the expected fraction outside the truth (inner, made monotone), each at most
``alpha``: the threshold on a grid of 1001 values where ``(m R(l) + 1) / (m + 1) <= alpha``; ``eps`` is not used.

A structure absent from the label and not predicted leaves the volume out for that structure, as the case score
leaves absent classes out (:mod:`calib_monai.metrics.case_quality`); absent from the label but predicted, its outer
contour holds nothing and its inner contour must be empty. The probabilities are the cross-fitted ones the validated
range is scored with (each volume by a recalibration that did not see it, on the grid the range is scored on), so
the guarantee is as approximate as the range's (cross-conformal) and exact with ``calibration_crossfit false``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calib_monai.bundle.manifest import file_sha256
from calib_monai.bundle.records import short_sha
from calib_monai.checks import check_number, check_option
from calib_monai.defaults import CONTOUR_ALPHA, CONTOUR_EPSILON, CONTOUR_RISK
from calib_monai.review.conformal import flag_rank

__all__ = [
    "CONTOURS_FILE",
    "GRID",
    "RISKS",
    "ContourMargins",
    "contour_losses",
    "contour_masks",
    "contour_segment_name",
    "read_contour_margins",
    "subject_requirements",
    "volume_requirements",
]

CONTOURS_FILE = "contours.json"
RISKS = ("per_case", "expected")
_F32 = np.float32
#: the thresholds the expected-rate variant chooses among: 0, 0.001, ..., 1 and just above 1 (an empty inner contour)
GRID = np.append(np.arange(1001, dtype=_F32) / _F32(1000), np.nextafter(_F32(1), _F32(2)))
_FIX = "run the bundle's calibrate step again"


def _allowed(epsilon: float, count: int) -> int:
    """The most voxels of ``count`` a contour may get wrong: ``floor(eps * count)`` (float-safe)."""
    return math.floor(epsilon * count + 1e-9)


def _outer(p: np.ndarray, truth: np.ndarray, pred: np.ndarray, epsilon: float) -> tuple[float, np.ndarray]:
    """The largest ``l_out`` at which ``{p >= l} | pred`` misses at most ``eps`` of ``truth`` (1.0: any; the miss
    only grows with ``l``) and the missed fraction at each :data:`GRID` threshold."""
    n_true = int(truth.sum())
    if n_true == 0:  # nothing to hold
        return 1.0, np.zeros(len(GRID))
    missed = np.sort(p[truth & ~pred])  # missed at l exactly when p < l
    allowed = _allowed(epsilon, n_true)
    required = 1.0 if len(missed) <= allowed else float(missed[allowed])
    return required, np.searchsorted(missed, GRID, side="left") / n_true


def _inner(p: np.ndarray, truth: np.ndarray, pred: np.ndarray, epsilon: float) -> tuple[float, np.ndarray]:
    """The smallest ``l_in`` from which on every ``pred & {p >= l}`` has at most ``eps`` of its voxels outside
    ``truth`` (0.0: the whole prediction does; the loss is not monotone in ``l``, so every larger ``l`` is asked
    too) and that monotone loss, the fraction outside, at each :data:`GRID` threshold."""
    values, inside = p[pred], truth[pred]
    if values.size == 0:
        return 0.0, np.zeros(len(GRID))
    order = np.argsort(-values, kind="stable")
    values, outside = values[order], np.cumsum(~inside[order])
    count = np.arange(1, values.size + 1)
    ends = np.flatnonzero(np.append(values[1:] != values[:-1], True))  # the last voxel of each group of equal p
    bad = ends[outside[ends] > np.floor(epsilon * count[ends] + 1e-9)]
    required = float(np.nextafter(values[bad[0]], _F32(2))) if bad.size else 0.0
    ascending = values[::-1]  # the contour at l: the voxels with p >= l
    below = np.searchsorted(ascending, GRID, side="left")
    kept = values.size - below
    out_kept = np.where(kept > 0, outside[np.maximum(kept - 1, 0)], 0)
    fraction = np.where(kept > 0, out_kept / np.maximum(kept, 1), 0.0)
    return required, np.maximum.accumulate(fraction[::-1])[::-1]  # sup over l' >= l: monotone


def volume_requirements(
    prob: torch.Tensor, label: torch.Tensor, epsilon: float = CONTOUR_EPSILON, class_names: Sequence[str] | None = None
) -> dict[str, dict[str, Any] | None]:
    """Per foreground class of one volume (``prob`` ``(C, *spatial)``, ``label`` ``(*spatial)`` or
    ``(1, *spatial)``): ``{"outer": required l_out, "inner": required l_in, "outer_loss", "inner_loss"}`` (the
    losses at each :data:`GRID` threshold), or None when the structure is absent from the label and not predicted."""
    p_all = prob.detach().float().cpu().numpy().astype(_F32, copy=False)
    label_np = torch.as_tensor(label).detach().cpu().numpy().reshape(p_all.shape[1:])
    pred_all = p_all.argmax(0)
    names = list(class_names)[1:] if class_names else [f"class_{c}" for c in range(1, p_all.shape[0])]
    out: dict[str, dict[str, Any] | None] = {}
    for c, name in enumerate(names, start=1):
        p, truth, pred = p_all[c].reshape(-1), (label_np == c).reshape(-1), (pred_all == c).reshape(-1)
        if not truth.any() and not pred.any():
            out[name] = None
            continue
        outer, outer_loss = _outer(p, truth, pred, epsilon)
        inner, inner_loss = _inner(p, truth, pred, epsilon)
        out[name] = {"outer": outer, "inner": inner, "outer_loss": outer_loss, "inner_loss": inner_loss}
    return out


def subject_requirements(
    volumes: Sequence[Mapping[str, dict[str, Any] | None]], subjects: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Each subject's requirement per structure, its worst volume's: the smallest required ``l_out``, the largest
    ``l_in`` and the largest loss at each threshold; a subject whose volumes all leave the structure out is left
    out. ``{name: {"subjects": [...], "outer": [...], "inner": [...], "outer_loss": (m, G), "inner_loss": (m, G)}}``."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for volume, subject in zip(volumes, subjects):
        for name, need in volume.items():
            by.setdefault(name, {})
            if need is None:
                continue
            worst = by[name].get(subject)
            if worst is None:
                by[name][subject] = {k: (np.array(v) if k.endswith("_loss") else v) for k, v in need.items()}
                continue
            worst["outer"], worst["inner"] = min(worst["outer"], need["outer"]), max(worst["inner"], need["inner"])
            for key in ("outer_loss", "inner_loss"):
                worst[key] = np.maximum(worst[key], need[key])
    out = {}
    for name, per in by.items():
        names = sorted(per)
        out[name] = {
            "subjects": names,
            "outer": [per[s]["outer"] for s in names],
            "inner": [per[s]["inner"] for s in names],
            "outer_loss": np.array([per[s]["outer_loss"] for s in names]).reshape(len(names), len(GRID)),
            "inner_loss": np.array([per[s]["inner_loss"] for s in names]).reshape(len(names), len(GRID)),
        }
    return out


def _expected(loss: np.ndarray, alpha: float, largest: bool) -> float | None:
    """Conformal risk control: the largest (outer) or smallest (inner) :data:`GRID` threshold with
    ``(sum_s loss_s(l) + 1) / (m + 1) <= alpha``; None when none is."""
    m = loss.shape[0]
    feasible = np.flatnonzero((loss.sum(0) + 1.0) / (m + 1) <= alpha + 1e-12)
    if not feasible.size:
        return None
    return float(GRID[feasible[-1] if largest else feasible[0]])


def subjects_needed(alpha: float) -> int:
    """The fewest subjects with ``floor(alpha (m + 1)) >= 1``: ``ceil(1 / alpha - 1)`` (also conformal risk
    control's, whose bound ``1 / (m + 1)`` must be at most ``alpha``)."""
    return math.ceil(1 / alpha - 1 - 1e-9)


@dataclass
class ContourMargins:
    """The lambdas of each structure and what they were chosen on: ``classes`` ``{name: {"lambda_out",
    "lambda_in" (None: too few subjects), "subjects" m, "rank" (k of the per-case quantile, None for the expected
    rate), "required_out", "required_in" (each subject's), "reason"}}``; ``info``: the split and weights."""

    classes: dict[str, dict[str, Any]]
    alpha: float = CONTOUR_ALPHA
    epsilon: float = CONTOUR_EPSILON
    risk: str = CONTOUR_RISK
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.alpha = check_number("contour_alpha", self.alpha, 0, 1, low_open=True, high_open=True)
        self.epsilon = check_number("contour_epsilon", self.epsilon, 0, 1, low_open=True, high_open=True)
        self.risk = check_option("contour_risk", self.risk, RISKS)

    @classmethod
    def from_validation(
        cls,
        volumes: Sequence[Mapping[str, dict[str, Any] | None]],
        subjects: Sequence[str],
        alpha: float = CONTOUR_ALPHA,
        epsilon: float = CONTOUR_EPSILON,
        risk: str = CONTOUR_RISK,
        **info: Any,
    ) -> ContourMargins:
        """Choose the lambdas from each validation volume's :func:`volume_requirements` (made with ``epsilon``) and
        its subject (``""``: its own)."""
        named = [s or f"volume {i}" for i, s in enumerate(subjects)]
        classes = {}
        for name, need in subject_requirements(volumes, named).items():
            m = len(need["subjects"])
            j = flag_rank(alpha, m)
            entry: dict[str, Any] = {"subjects": m, "required_out": need["outer"], "required_in": need["inner"]}
            if risk == "per_case" and j >= 1:
                entry["rank"] = m + 1 - j
                entry["lambda_out"] = sorted(need["outer"])[j - 1]  # the j-th smallest: k-th largest
                entry["lambda_in"] = sorted(need["inner"])[m - j]  # the k-th smallest
            elif risk == "expected" and m:
                entry["rank"] = None
                entry["lambda_out"] = _expected(need["outer_loss"], alpha, largest=True)
                entry["lambda_in"] = _expected(need["inner_loss"], alpha, largest=False)
            if entry.get("lambda_out") is None or entry.get("lambda_in") is None:
                entry.update(lambda_out=None, lambda_in=None, rank=None)
                entry["reason"] = (
                    f"cannot vouch at contour_alpha = {alpha:g} with {m} validation subjects having {name}: needs at "
                    f"least {subjects_needed(alpha)} (or contour_alpha >= {1 / (m + 1):.3g})"
                )
            classes[name] = entry
        return cls(classes, alpha, epsilon, risk, dict(info))

    @property
    def guarantee(self) -> str:
        """The stated guarantee, in words."""
        if self.risk == "expected":
            return (
                "expected missed fraction of each structure's outer contour and expected fraction of its inner "
                f"contour outside the structure each at most {self.alpha:g} (conformal risk control)"
            )
        return (
            f"for a new case like the validation subjects, each structure's outer contour holds at least "
            f"{1 - self.epsilon:.3g} of the true structure, and its inner contour lies at least {1 - self.epsilon:.3g} "
            f"inside it, each with probability at least {1 - self.alpha:.3g} (per case)"
        )

    def record(self) -> dict[str, Any]:
        """The JSON record; ``calibrate`` writes it with the weights' SHA-256
        (:func:`~calib_monai.review.rule.write_measured`)."""
        classes = {n: {k: v for k, v in e.items()} for n, e in self.classes.items()}
        return {
            "alpha": self.alpha,
            "epsilon": self.epsilon,
            "risk": self.risk,
            "guarantee": self.guarantee,
            "classes": classes,
            "info": self.info,
        }


def read_contour_margins(
    path: str | os.PathLike, weights: str | os.PathLike | None = None
) -> tuple[ContourMargins | None, str]:
    """``(margins, "")``, or ``(None, why not)`` when there is no ``contours.json`` at ``path`` (or in the folder);
    a file chosen with other weights than ``weights``, or not a contour set, raises a one-line ValueError."""
    path = Path(path)
    if path.is_dir():
        path = path / CONTOURS_FILE
    if not path.is_file():
        return None, f"no contour set at {path}: {_FIX} to get contours"
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise ValueError(f"it holds a {type(record).__name__}")
        fields = {k: record[k] for k in ("classes", "alpha", "epsilon", "risk")}
    except (ValueError, KeyError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a contour set of calib_monai ({err}): delete it and {_FIX}") from None
    if weights is not None and Path(weights).is_file():
        now = file_sha256(weights)
        if record.get("weights_sha256") != now:
            raise ValueError(
                f"{path} is a contour set from other weights (sha256 {short_sha(record.get('weights_sha256'))}, "
                f"{weights} is {short_sha(now)}): {_FIX}"
            )
    return ContourMargins(**fields, info=record.get("info", {})), ""


def contour_masks(
    prob: torch.Tensor,
    lambdas: Mapping[str, Mapping[str, Any]],
    class_names: Sequence[str] | None = None,
    pred: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inner, outer)``, each ``(C - 1, *spatial)`` uint8, one channel per foreground class in label order, from the
    probabilities ``prob`` ``(C, *spatial)`` and each class's ``{"lambda_in", "lambda_out"}`` (by name; a class
    without lambdas gets empty channels); ``pred``: ``prob``'s argmax, when the caller has it. Thresholds compare in
    float32, as they were chosen."""
    p = torch.as_tensor(prob).float()
    pred = p.max(0).indices if pred is None else pred  # argmax's first maximum, in a tenth of its time (CPU)
    names = list(class_names)[1:] if class_names else [f"class_{c}" for c in range(1, p.shape[0])]
    inner = torch.zeros((p.shape[0] - 1, *p.shape[1:]), dtype=torch.uint8, device=p.device)
    outer = torch.zeros_like(inner)
    for c, name in enumerate(names, start=1):
        entry = lambdas.get(name) or {}
        if entry.get("lambda_out") is None or entry.get("lambda_in") is None:
            continue
        predicted = pred == c
        outer[c - 1] = (predicted | (p[c] >= float(entry["lambda_out"]))).to(torch.uint8)
        inner[c - 1] = (predicted & (p[c] >= float(entry["lambda_in"]))).to(torch.uint8)
    return inner, outer


def contour_losses(truth: np.ndarray, inner: np.ndarray, outer: np.ndarray, epsilon: float) -> dict[str, Any]:
    """What the guarantee speaks of for one structure of one case (boolean masks): ``outer_holds`` (``outer``
    misses at most ``floor(eps |T|)`` of the truth ``T``), ``inner_inside`` (at most ``floor(eps |I|)`` of ``inner``
    lies outside it; an empty set does), and the fractions the expected rate bounds, ``outer_missed`` ``|T \\ O| /
    |T|`` and ``inner_outside`` ``|I \\ T| / |I|`` (0 for an empty ``T`` or ``I``)."""
    truth, inner, outer = (np.asarray(a, bool) for a in (truth, inner, outer))
    n_true, n_inner = int(truth.sum()), int(inner.sum())
    missed, outside = int((truth & ~outer).sum()), int((inner & ~truth).sum())
    return {
        "outer_holds": missed <= _allowed(epsilon, n_true),
        "inner_inside": outside <= _allowed(epsilon, n_inner),
        "outer_missed": missed / n_true if n_true else 0.0,
        "inner_outside": outside / n_inner if n_inner else 0.0,
    }


def contour_segment_name(name: str, kind: str, alpha: float) -> str:
    """``"liver (outer 90%)"``: the structure, the contour (``"inner"`` or ``"outer"``) and ``1 - alpha`` in percent,
    as the Slicer files and MONAI Label's margins task name the segments."""
    return f"{name} ({kind} {round(100 * (1 - alpha), 6):g}%)"
