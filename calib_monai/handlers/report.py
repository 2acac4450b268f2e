"""Per-volume evaluation report of an evaluator run: CSV, summary and reliability diagram."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ignite.engine import Engine, Events

from calib_monai.metrics import calibration_errors, save_reliability_diagram
from calib_monai.metrics._inputs import as_plain_tensor
from calib_monai.metrics.calibration import accumulator_values, pooled_accumulator
from calib_monai.metrics.calibration_torch import first_argmax
from calib_monai.metrics.segmentation import segmentation_metrics_per_volume

__all__ = ["SegmentationReport"]

CALIBRATION_COLUMNS = ("ece", "cece", "tace")


def case_name(item: dict[str, Any], index: int) -> str:
    """The file name of the item's image (its meta data), else ``volume_<index>``."""
    meta = getattr(item.get("image"), "meta", {}) or {}
    name = meta.get("filename_or_obj")
    return os.path.basename(str(name)) if name else f"volume_{index:04d}"


def _on_device(x: Any, device: torch.device | None) -> torch.Tensor:
    """A detached plain tensor (MetaTensor metadata dropped), moved to ``device`` when given (a no-op if there)."""
    t = as_plain_tensor(x) if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    return t if device is None else t.to(device)


def _spacing(item: dict[str, Any]) -> list[float] | None:
    """Voxel size (mm) of the evaluated grid, from the affine of the (preprocessed) image; None when unknown."""
    affine = getattr(item.get("image"), "affine", None)
    if affine is None:
        return None
    affine = torch.as_tensor(affine, dtype=torch.float64)
    return [float(v) for v in torch.linalg.norm(affine[:3, :3], dim=0)]


class SegmentationReport:
    """Evaluate every volume an evaluator sees and write the papers' metrics to ``output_dir``.

    Reads, per volume of ``engine.state.output`` (MONAI evaluators decollate batches into a list of dicts):
    ``prob_key`` softmax probabilities ``(C, *spatial)``, ``pred_key`` the one-hot or label-map prediction and
    ``label_key`` the ground truth (one-hot or label map). Writes at the end of the run:

    * ``metrics.csv``: one row per volume: DSC, HD95 and ASD per foreground class (mm when the image affine
      gives the spacing) and their means; ECE, CECE and TACE on ground-truth foreground voxels (the papers) and on
      prediction-or-ground-truth foreground voxels (``*_union``, the NACL journal's Sec. 4.2.8); NLL and Brier on
      ground-truth foreground voxels;
    * ``summary.json``: mean and standard deviation over volumes of every column (the papers' reduction: the
      unweighted mean over volumes; NaN entries, e.g. an absent class, are left out), and the settings;
    * ``reliability.png``: the top-label reliability diagram pooled over all ground-truth foreground voxels.

    The calibration metrics are computed on the device of the evaluator's tensors (int64 counts, float64 sums; see
    :mod:`calib_monai.metrics.calibration_torch`): only per-bin statistics come to the host. DSC / HD95 / ASD go
    through MONAI on the argmax label maps (moved to the CPU for the distance transforms).

    Args:
        output_dir: folder of the three files.
        label_names: ``{"0": "background", "1": ...}``: class names for the columns.
        num_bins: bins of the calibration metrics.
        empty_class: ``"nan"`` or ``"papers"`` (DSC 1 / HD 0 for a class absent from both), see
            :func:`calib_monai.metrics.segmentation_metrics_per_volume`.
        regions: extra columns for unions of classes scored as one binary segmentation, e.g. BraTS'
            ``{"ET": [3], "TC": [1, 3], "WT": [1, 2, 3]}`` (``dice_ET``, ``hd95_ET``, ...).
        surface_distances: False leaves out the HD95 and ASD columns (much faster; e.g. the noise study).
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        label_names: dict[str, str],
        num_bins: int = 15,
        empty_class: str = "nan",
        prob_key: str = "prob",
        pred_key: str = "pred",
        label_key: str = "label",
        regions: dict[str, list[int]] | None = None,
        logger_name: str = "calib_monai",
        surface_distances: bool = True,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.class_names = [label_names[k] for k in sorted(label_names, key=int)]
        self.num_bins = num_bins
        self.empty_class = empty_class
        self.keys = (prob_key, pred_key, label_key)
        self.regions = {str(k): [int(c) for c in v] for k, v in (regions or {}).items()}
        self.logger = logging.getLogger(logger_name)
        self.surface_distances = bool(surface_distances)
        self.rows: list[dict[str, Any]] = []
        self._bins = np.zeros((3, num_bins), dtype=np.float64)  # count, sum of confidence, sum of accuracy

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self._reset)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._add_batch)
        engine.add_event_handler(Events.COMPLETED, self.write)

    def _reset(self, engine: Engine) -> None:
        self.rows, self._bins = [], np.zeros_like(self._bins)

    def _add_batch(self, engine: Engine) -> None:
        output = engine.state.output
        for item in output if isinstance(output, list) else [output]:
            self.rows.append(self.evaluate_volume(item, len(self.rows)))

    def evaluate_volume(self, item: dict[str, Any], index: int = 0) -> dict[str, Any]:
        """The CSV row of one volume (and its reliability bins added to the pooled diagram)."""
        prob_key, pred_key, label_key = self.keys
        prob = _on_device(item[prob_key], None)[None]  # stays on its device: no copy of the volume
        label = _on_device(item[label_key], prob.device)
        label = (first_argmax(label, dim=0)[1][None] if label.shape[0] > 1 else label)[None]
        pred = _on_device(item[pred_key], prob.device)[None]
        row: dict[str, Any] = {"case": case_name(item, index)}
        spacing = _spacing(item)
        seg = segmentation_metrics_per_volume(pred, label, num_classes=prob.shape[1], spacing=spacing,
                                              empty_class=self.empty_class,
                                              surface_distances=self.surface_distances)  # fmt: skip
        for metric, values in seg.items():
            for name, value in zip(self.class_names[1:], values[0]):
                row[f"{metric}_{name}"] = float(value)
            row[f"mean_{metric}"] = float(np.nanmean(values[0])) if np.isfinite(values[0]).any() else float("nan")
        row.update(self._region_metrics(pred, label, prob.shape[1], spacing))
        # one voxel selection per foreground mode for all its metrics (NLL and Brier on ground-truth foreground)
        names = CALIBRATION_COLUMNS + ("nll", "brier")
        acc = pooled_accumulator(prob, label, names, self.num_bins, "gt")
        gt = accumulator_values(acc, names, include_background=True)
        union = calibration_errors(prob, label, CALIBRATION_COLUMNS, self.num_bins, "union")
        row.update({column: gt[column] for column in CALIBRATION_COLUMNS})
        row.update({f"{column}_union": union[column] for column in CALIBRATION_COLUMNS})
        row["nll"], row["brier"] = gt["nll"], gt["brier"]
        ece_bins = acc.statistics("ece")  # (M, 3): count, sum of confidences, correct; None without foreground
        if ece_bins is not None:
            self._bins += ece_bins.T.cpu().numpy()
        return row

    def _region_metrics(self, pred: torch.Tensor, label: torch.Tensor, num_classes: int, spacing) -> dict[str, float]:
        """DSC/HD95/ASD of each region (a union of classes) as a binary segmentation."""
        out: dict[str, float] = {}
        if not self.regions:
            return out
        pred_map = pred.argmax(1, keepdim=True) if pred.shape[1] > 1 else pred.long()
        for region, classes in self.regions.items():
            members = torch.tensor(classes, device=pred_map.device)
            binary = [torch.isin(m, members).long() for m in (pred_map, label)]
            seg = segmentation_metrics_per_volume(*binary, num_classes=2, spacing=spacing, empty_class=self.empty_class,
                                                  surface_distances=self.surface_distances)  # fmt: skip
            out.update({f"{metric}_{region}": float(values[0, 0]) for metric, values in seg.items()})
        return out

    def summary(self) -> dict[str, dict[str, float]]:
        columns = [c for c in self.rows[0] if c != "case"] if self.rows else []
        out = {}
        for column in columns:
            values = np.array([row[column] for row in self.rows], dtype=np.float64)
            finite = values[np.isfinite(values)]
            out[column] = {
                "mean": float(finite.mean()) if finite.size else float("nan"),
                "std": float(finite.std()) if finite.size else float("nan"),
                "volumes": int(finite.size),
            }
        return out

    def reliability_data(self) -> dict[str, np.ndarray]:
        """Top-label reliability bins pooled over the evaluated volumes (as ``reliability_diagram_data``)."""
        count, conf_sum, acc_sum = self._bins
        with np.errstate(invalid="ignore", divide="ignore"):
            return {
                "edges": np.linspace(0.0, 1.0, self.num_bins + 1),
                "count": count.astype(np.int64),
                "confidence": np.where(count > 0, conf_sum / count, np.nan),
                "accuracy": np.where(count > 0, acc_sum / count, np.nan),
            }

    def write(self, engine: Engine | None = None) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if not self.rows:
            self.logger.warning(f"SegmentationReport: no volumes were evaluated; nothing written to {self.output_dir}")
            return
        with open(self.output_dir / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            writer.writeheader()
            writer.writerows(self.rows)
        summary = self.summary()
        settings = {"volumes": len(self.rows), "num_bins": self.num_bins, "empty_class": self.empty_class,
                    "classes": self.class_names}  # fmt: skip
        (self.output_dir / "summary.json").write_text(json.dumps({"settings": settings, "metrics": summary}, indent=2))
        save_reliability_diagram(self.reliability_data(), self.output_dir / "reliability.png", title=f"Reliability ({len(self.rows)} volumes)")
        headline = ", ".join(
            f"{k} {summary[k]['mean']:.4f}" for k in ("mean_dice", "mean_hd95", "ece", "cece", "tace") if k in summary
        )
        self.logger.info(f"evaluated {len(self.rows)} volume(s): {headline}; per-volume metrics in {self.output_dir}")
