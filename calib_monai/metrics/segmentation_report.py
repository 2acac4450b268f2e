"""``SegmentationReportMetric``: the evaluation report's per-volume table as a MONAI ``CumulativeIterationMetric``.

One row per volume (``columns``): DSC, HD95, ASD per foreground class, their means and each region's (MONAI);
ECE / CECE / TACE on ground-truth foreground voxels (the papers) and on prediction-or-ground-truth voxels
(``*_union``); NLL, Brier; ``ml1ace`` / ``cece_all`` as their paper defines them; and what a user reads without
the label (:mod:`calib_monai.metrics.case_quality`): the estimated DSC (``est_mean_dice``, the case score), ECE over
all voxels (``ece_all``) and within ``BAND_RADIUS`` voxels of the structures (``ece_band``), volumes (mL when the
spacing is known) and the share of voxels below ``LOW_CONFIDENCE`` (``low_conf_*``). ``pooled`` /
``reliability_data`` bin all ground-truth foreground voxels of all volumes together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from monai.metrics import CumulativeIterationMetric

from calib_monai.checks import check_option, check_positive_int
from calib_monai.defaults import BAND_RADIUS, EMPTY_CLASS, L1ACE_NUM_BINS, LOW_CONFIDENCE, NUM_BINS
from calib_monai.tensors import detached_plain_tensor

from .calibration import (
    calibration_errors,
    calibration_statistics,
    statistics_values,
    value_from_statistics,
)
from .case_quality import CASE_SCORE, case_quality, structure_band
from .segmentation import EMPTY_CLASS_CONVENTIONS, segmentation_metrics_per_volume

__all__ = ["ALL_VOXEL_COLUMNS", "CALIBRATION_COLUMNS", "POOLED_METRICS", "SegmentationReportMetric", "column_summary"]

#: The papers' foreground metrics (ground-truth foreground voxels, ``num_bins``); ``ml1ace_gt`` is the mL1-ACE formula
#: on those voxels, background included (not the paper's mL1-ACE: that is the ``ml1ace`` column).
CALIBRATION_COLUMNS = ("ece", "cece", "tace", "ml1ace_gt")
_FORMULAS = ("ece", "cece", "tace", "ml1ace")  # what each column of CALIBRATION_COLUMNS computes
#: Metrics as the papers that score every voxel define them: per volume, background excluded, 20 bins.
ALL_VOXEL_COLUMNS = ("ml1ace", "cece_all")
#: Per-class quality columns ``<prefix>_<class>`` (estimated DSC, volumes, low-confidence share).
QUALITY_PREFIXES = (
    "est_dice",
    "volume",
    "volume_pred",
    "volume_prob",
    "volume_prob_low",
    "volume_prob_high",
    "low_conf",
)
#: ``case_quality``'s key of each ``QUALITY_PREFIXES`` column but the true volume (from the label).
_QUALITY_KEYS = ("est_dice", "volume_predicted", "volume", "volume_low", "volume_high", "low_confidence_fraction")
#: Metrics of the ``pooled`` section: their per-volume statistics add up (equal-width bins, sums), TACE's do not.
POOLED_METRICS = ("ece", "cece", "nll", "brier")


def column_summary(table: Any) -> list[dict[str, float]]:
    """Mean, standard deviation and count over volumes of each column of ``table (N, K)``; non-finite entries
    (NaN: an absent class; inf: a missed class's distances) are left out, as the papers' scripts do."""
    values = np.asarray(table, dtype=np.float64)
    out = []
    for column in values.T:
        finite = column[np.isfinite(column)]
        out.append(
            {
                "mean": float(finite.mean()) if finite.size else float("nan"),
                "std": float(finite.std()) if finite.size else float("nan"),
                "volumes": int(finite.size),
            }
        )
    return out


class SegmentationReportMetric(CumulativeIterationMetric):
    """Per-volume segmentation and calibration metrics of an evaluation, one volume per batch item.

    The buffer holds ``[rows (N, K), statistics (N, S)]`` on ``y_pred``'s device: each volume's row and its additive
    ground-truth foreground calibration statistics, nothing of the voxels. Calibration runs on ``y_pred``'s device;
    DSC / HD95 / ASD through MONAI on the argmax label maps.

    Args:
        label_names: ``{"0": "background", "1": ...}``: class names for the columns (channel order).
        num_bins: bins of the calibration metrics.
        empty_class: ``"nan"`` or ``"papers"`` (:func:`calib_monai.metrics.segmentation_metrics_per_volume`).
        regions: unions of classes scored as one binary segmentation, e.g. BraTS' ``{"ET": [3], "TC": [1, 3]}``.
        surface_distances: False leaves out the HD95 and ASD columns (much faster).

    Inputs of ``__call__(y_pred, y, pred=None, spacing=None)``: ``y_pred`` softmax probabilities ``(B, C, *spatial)``
    or a list of ``(C, *spatial)``; ``y`` label maps ``(B, 1, ...)`` or one-hot, or a list; ``pred`` the
    prediction scored by DSC / HD95 / ASD (one-hot or label map, same form; default: the argmax of ``y_pred``);
    ``spacing`` the voxel size in mm (one for all volumes, or a list with one entry per volume; None: voxels).
    """

    def __init__(
        self,
        label_names: dict[str, str],
        num_bins: int = NUM_BINS,
        empty_class: str = EMPTY_CLASS,
        regions: dict[str, Sequence[int]] | None = None,
        surface_distances: bool = True,
    ) -> None:
        super().__init__()
        check_option("empty_class", empty_class, EMPTY_CLASS_CONVENTIONS)
        self.class_names = [label_names[k] for k in sorted(label_names, key=int)]
        self.num_bins = check_positive_int("num_bins", num_bins)
        self.empty_class = empty_class
        self.regions = {str(k): [int(c) for c in v] for k, v in (regions or {}).items()}
        self.surface_distances = bool(surface_distances)
        self._num_classes: int | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """The names of a row's values, in order (the ``metrics.csv`` header after ``case``)."""
        out = self._segmentation_columns()
        out += [*CALIBRATION_COLUMNS, *(f"{c}_union" for c in CALIBRATION_COLUMNS), "nll", "brier"]
        out += list(ALL_VOXEL_COLUMNS)
        out += [f"est_dice_{name}" for name in self.class_names[1:]] + [CASE_SCORE, "ece_all", "ece_band"]
        out += [f"{prefix}_{name}" for prefix in QUALITY_PREFIXES[1:] for name in self.class_names[1:]]
        return tuple(dict.fromkeys(out))  # a region named like a class shares its column (as a dict row did)

    def _compute_list(self, y_pred, y=None, pred=None, spacing=None, segmentation=None):  # type: ignore[override]
        """Channel-first volumes, each with its own prediction, spacing and ``segmentation`` (None or a row of the same
        argmax scored before, e.g. before a temperature, whose DSC / HD95 / ASD columns are reused)."""
        if y is None:
            raise ValueError("SegmentationReportMetric needs labels y, got None.")
        count = len(y_pred)
        preds = list(pred) if isinstance(pred, (list, tuple, torch.Tensor)) else [pred] * count
        spacings = list(spacing) if _per_volume(spacing, count) else [spacing] * count
        known = list(segmentation) if isinstance(segmentation, (list, tuple)) else [segmentation] * count
        rows, stats = [], []
        for p, y_, pr, sp, kn in zip(y_pred, y, preds, spacings, known):
            prob = detached_plain_tensor(torch.as_tensor(p))[None]  # a MetaTensor would slow every following op
            label = detached_plain_tensor(torch.as_tensor(y_)).to(prob.device)
            label = (label.max(dim=0).indices[None] if label.shape[0] > 1 else label)[None]  # first class on ties
            scored = prob if pr is None else detached_plain_tensor(torch.as_tensor(pr)).to(prob.device)[None]
            row, stat = self._volume(prob, label, scored, sp, kn)
            rows.append(row)
            stats.append(stat)
            self._num_classes = int(prob.shape[1])
        return [torch.stack(rows), torch.stack(stats)]

    def _compute_tensor(self, y_pred: torch.Tensor, y: torch.Tensor | None = None, **kwargs) -> list[torch.Tensor]:  # type: ignore[override]
        if y_pred.ndim < 3:
            raise ValueError(f"y_pred must have shape (B, C, *spatial), got {tuple(y_pred.shape)}.")
        return self._compute_list(list(y_pred), y, **kwargs)

    def _volume(
        self,
        prob: torch.Tensor,
        label: torch.Tensor,
        pred: torch.Tensor,
        spacing: Any,
        segmentation: dict[str, float] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``(K,)`` and pooled statistics ``(S,)`` of one volume (``prob (1, C, ...)``, ``label (1, 1, ...)``)."""
        row: dict[str, float] = {}
        if segmentation is not None:  # the same prediction, already scored
            row.update({c: float(segmentation[c]) for c in self._segmentation_columns()})
        else:
            row.update(self._segmentation_metrics(pred, label, spacing, prob.shape[1]))
        # one voxel selection per foreground mode for all its metrics (NLL and Brier on ground-truth foreground)
        names = _FORMULAS + ("nll", "brier")
        stats = calibration_statistics(prob, label, names, self.num_bins, "gt")
        gt = statistics_values(stats, self.num_bins, include_background=True)
        union = calibration_errors(prob, label, _FORMULAS, self.num_bins, "union")
        row.update({column: gt[formula] for column, formula in zip(CALIBRATION_COLUMNS, _FORMULAS)})
        row.update({f"{column}_union": union[formula] for column, formula in zip(CALIBRATION_COLUMNS, _FORMULAS)})
        row["nll"], row["brier"] = gt["nll"], gt["brier"]
        every = calibration_errors(prob, label, ("ml1ace", "cece"), L1ACE_NUM_BINS, "all", include_background=False)
        row["ml1ace"], row["cece_all"] = every["ml1ace"], every["cece"]
        row.update(self._quality(prob, label, pred, spacing))
        # additive statistics (zeros without foreground) stay on the device: bins and sums only
        pooled = torch.cat([stats[name].reshape(-1) for name in POOLED_METRICS])
        values = [row.get(column, float("nan")) for column in self.columns]
        return torch.tensor(values, dtype=torch.float64, device=pooled.device), pooled

    def _quality(self, prob: torch.Tensor, label: torch.Tensor, pred: torch.Tensor, spacing) -> dict[str, float]:
        """The label-free estimates of one volume beside the true values they estimate, and ECE where users read
        probabilities (all voxels; a band around the predicted and true structures)."""
        names = self.class_names[1:]
        p, y = prob[0], label[0, 0]
        pred_map = pred[0].argmax(0) if pred.shape[1] > 1 else pred[0, 0].long()
        voxel_ml = float(np.prod(spacing)) / 1000.0 if spacing is not None else 1.0  # mm^3 -> mL
        quality = case_quality(p, pred_map, voxel_ml, LOW_CONFIDENCE, self.class_names, self.empty_class)
        true = torch.bincount(y.reshape(-1).long(), minlength=p.shape[0])[1 : p.shape[0]].double() * voxel_ml
        row = {f"volume_{name}": value for name, value in zip(names, true.cpu().tolist())}
        for prefix, key in zip(QUALITY_PREFIXES[:1] + QUALITY_PREFIXES[2:], _QUALITY_KEYS):
            row.update({f"{prefix}_{name}": quality["classes"][name][key] for name in names})
        row[CASE_SCORE] = quality["case_score"]
        band = structure_band([pred_map > 0, y > 0], BAND_RADIUS)
        flat_p, flat_y = p.reshape(p.shape[0], -1), y.reshape(-1)
        row["ece_all"] = calibration_errors(flat_p[None], flat_y[None], ("ece",), self.num_bins, "all")["ece"]
        inside = band.reshape(-1)
        row["ece_band"] = (
            calibration_errors(flat_p[:, inside][None], flat_y[inside][None], ("ece",), self.num_bins, "all")["ece"]
            if bool(inside.any())
            else float("nan")
        )
        return row

    def _segmentation_columns(self) -> list[str]:
        shape = ("dice", "hd95", "asd") if self.surface_distances else ("dice",)
        out = [c for m in shape for c in [f"{m}_{name}" for name in self.class_names[1:]] + [f"mean_{m}"]]
        return out + [f"{m}_{region}" for region in self.regions for m in shape]

    def _segmentation_metrics(self, pred: torch.Tensor, label: torch.Tensor, spacing, num_classes: int) -> dict:
        """DSC (HD95, ASD) per class, their means, and the regions' (MONAI, on the argmax label maps)."""
        row: dict[str, float] = {}
        seg = segmentation_metrics_per_volume(
            pred,
            label,
            num_classes=num_classes,
            spacing=spacing,
            empty_class=self.empty_class,
            surface_distances=self.surface_distances,
        )
        for metric, values in seg.items():
            for name, value in zip(self.class_names[1:], values[0]):
                row[f"{metric}_{name}"] = float(value)
            row[f"mean_{metric}"] = float(np.nanmean(values[0])) if np.isfinite(values[0]).any() else float("nan")
        row.update(self._region_metrics(pred, label, spacing))
        return row

    def _region_metrics(self, pred: torch.Tensor, label: torch.Tensor, spacing) -> dict[str, float]:
        """DSC/HD95/ASD of each region (a union of classes) as a binary segmentation."""
        out: dict[str, float] = {}
        if not self.regions:
            return out
        pred_map = pred.argmax(1, keepdim=True) if pred.shape[1] > 1 else pred.long()
        for region, classes in self.regions.items():
            members = torch.tensor(classes, device=pred_map.device)
            binary = [torch.isin(m, members).long() for m in (pred_map, label)]
            seg = segmentation_metrics_per_volume(
                *binary,
                num_classes=2,
                spacing=spacing,
                empty_class=self.empty_class,
                surface_distances=self.surface_distances,
            )
            out.update({f"{metric}_{region}": float(values[0, 0]) for metric, values in seg.items()})
        return out

    def _gathered(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        buffer = self.get_buffer()  # gathered over ranks in distributed runs
        return (buffer[0], buffer[1]) if isinstance(buffer, list) and len(buffer) == 2 else None

    def aggregate(self) -> torch.Tensor:  # type: ignore[override]
        """The per-volume table ``(N, len(columns))``, float64 on the CPU (``(0, K)`` before any volume)."""
        buffers = self._gathered()
        if buffers is None:
            return torch.zeros((0, len(self.columns)), dtype=torch.float64)
        return buffers[0].double().cpu()

    def pooled_statistics(self) -> np.ndarray | None:
        """The additive statistics summed over volumes (on the device, then ``S`` numbers to the host)."""
        buffers = self._gathered()
        if buffers is None or self._num_classes is None:
            return None
        return buffers[1].double().sum(dim=0).cpu().numpy()

    def _split(self, stats: np.ndarray) -> dict[str, np.ndarray]:
        c, m = self._num_classes or 0, self.num_bins
        sizes = [m * 3, c * m * 3, 2, 2]  # the statistics of POOLED_METRICS, in order
        return dict(zip(POOLED_METRICS, np.split(stats, np.cumsum(sizes)[:-1])))

    def pooled(self) -> dict[str, float]:
        """``{"pooled_ece", "pooled_cece", "pooled_nll", "pooled_brier"}``: all ground-truth foreground voxels of all
        volumes together (CECE with background, as the per-volume column); NaN before any foreground voxel."""
        stats = self.pooled_statistics()
        if stats is None:
            return {f"pooled_{name}": float("nan") for name in POOLED_METRICS}
        parts = self._split(stats)
        return {f"pooled_{name}": value_from_statistics(parts[name], name, self.num_bins) for name in POOLED_METRICS}

    def reliability_data(self) -> dict[str, np.ndarray]:
        """Top-label reliability bins pooled over the volumes' ground-truth foreground voxels (as
        ``reliability_diagram_data``: ``edges``, ``count``, ``confidence``, ``accuracy``)."""
        stats = self.pooled_statistics()
        bins = np.zeros((self.num_bins, 3)) if stats is None else self._split(stats)["ece"].reshape(self.num_bins, 3)
        count, conf_sum, acc_sum = bins.T  # count, sum of confidences, number correct
        with np.errstate(invalid="ignore", divide="ignore"):
            return {
                "edges": np.linspace(0.0, 1.0, self.num_bins + 1),
                "count": count.astype(np.int64),
                "confidence": np.where(count > 0, conf_sum / count, np.nan),
                "accuracy": np.where(count > 0, acc_sum / count, np.nan),
            }


def _per_volume(spacing: Any, count: int) -> bool:
    """Whether ``spacing`` is a list with one entry (None or a sequence) per volume, not one spacing for all."""
    if not isinstance(spacing, (list, tuple)) or len(spacing) != count:
        return False
    return all(s is None or isinstance(s, (list, tuple, np.ndarray, torch.Tensor)) for s in spacing)
