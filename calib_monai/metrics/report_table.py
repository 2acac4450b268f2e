"""``SegmentationReportTable``: the evaluation report, one row per volume, and its files.

Filled by ``calib_monai.handlers.SegmentationReport`` or by :meth:`~SegmentationReportTable.add`; :meth:`write`
writes atomically ``metrics.csv`` (one row per volume, then the review verdict's columns), ``summary.json``
(``settings``, ``metrics``: mean / std / count per column, ``pooled``, ``case_quality``, ``review``),
``reliability.png`` and ``risk_coverage.png``.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calib_monai.atomic import save_atomically, write_text_atomically
from calib_monai.defaults import BAND_RADIUS, EMPTY_CLASS, LOW_CONFIDENCE, NUM_BINS

from .calibration import save_reliability_diagram
from .case_quality import CASE_SCORE
from .failure_detection import failure_detection_summary, quality_agreement, save_risk_coverage_plot
from .segmentation_report import SegmentationReportMetric, column_summary

__all__ = ["SegmentationReportTable", "case_name", "served_verdict", "voxel_spacing"]


def case_name(item: dict[str, Any], index: int) -> str:
    """The file name of the item's image (its meta data), else ``volume_<index>``."""
    meta = getattr(item.get("image"), "meta", {}) or {}
    name = meta.get("filename_or_obj")
    return os.path.basename(str(name)) if name else f"volume_{index:04d}"


def voxel_spacing(item: dict[str, Any]) -> list[float] | None:
    """Voxel size (mm) of the evaluated grid, from the affine of the item's (preprocessed) image; None when unknown."""
    affine = getattr(item.get("image"), "affine", None)
    if affine is None:
        return None
    affine = torch.as_tensor(affine, dtype=torch.float64)
    return [float(v) for v in torch.linalg.norm(affine[:3, :3], dim=0)]


def served_verdict(quality: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A case's review verdict (``CaseQualityd``) with its served case score and, when measured
    (``DeliveredDiced``), the delivered segmentation's true mean DSC."""
    if not quality or quality.get("review") is None:
        return None
    verdict = {**quality["review"], "served_case_score": quality.get("case_score")}
    if "delivered" in quality:
        verdict["delivered_mean_dice"] = quality["delivered"]["mean_dice"]
    return verdict


def _review_columns(review: Mapping[str, Any] | None) -> dict[str, Any]:
    """``review_flag`` (``yes`` / ``no`` / empty: cannot judge, as ``quality.csv``), ``review_reasons``,
    ``served_case_score`` and ``delivered_mean_dice`` (NaN when the verdict lacks them)."""
    flag = (review or {}).get("flag")
    reasons = (review or {}).get("reasons", ["no review verdict"] if review is None else [])
    columns: dict[str, Any] = {
        "review_flag": "" if flag is None else ("yes" if flag else "no"),
        "review_reasons": "; ".join(reasons),
    }
    for key in ("served_case_score", "delivered_mean_dice"):  # every row the same columns (one CSV header)
        value = (review or {}).get(key)
        columns[key] = float("nan") if value is None else float(value)
    return columns


def _save_figure_atomically(save, path: Path, *args, **kwargs) -> None:
    """The figure, or a warning when matplotlib (the ``plots`` extra) is missing: the tables are the result."""
    try:
        save_atomically(None, path, write=lambda _, tmp: save(*args, tmp, **kwargs))
    except ImportError as err:
        logging.getLogger("calib_monai").warning(f"{path} not written: {err} The tables beside it are complete.")


class SegmentationReportTable:
    """Per-volume segmentation, calibration and case-quality metrics of an evaluation.

    Args:
        label_names, num_bins, empty_class, regions, surface_distances: build the
            :class:`~calib_monai.metrics.SegmentationReportMetric` when ``metric`` is None.
        metric: an existing metric whose volumes are the table (the Ignite handler's, gathered over ranks).
        cases, reviews: the case names and review verdicts of ``metric``'s volumes, in order.

    Example::

        table = SegmentationReportTable({"0": "background", "1": "liver"})
        for prob, label, spacing, name in volumes:
            table.add(prob, label, spacing=spacing, case=name)  # prob (C, *spatial), label (1, *spatial)
        table.write("eval")
    """

    def __init__(
        self,
        label_names: dict[str, str] | None = None,
        num_bins: int = NUM_BINS,
        empty_class: str = EMPTY_CLASS,
        regions: dict[str, Sequence[int]] | None = None,
        surface_distances: bool = True,
        metric: SegmentationReportMetric | None = None,
        cases: Sequence[str] = (),
        reviews: Sequence[Mapping[str, Any] | None] = (),
    ) -> None:
        if metric is None:
            if label_names is None:
                raise ValueError("SegmentationReportTable needs label_names (or an existing metric)")
            metric = SegmentationReportMetric(label_names, num_bins, empty_class, regions, surface_distances)
        self.metric = metric
        self.cases: list[str] = list(cases)
        self.reviews: list[Mapping[str, Any] | None] = list(reviews) or [None] * len(self.cases)

    @property
    def class_names(self) -> list[str]:
        return self.metric.class_names

    def add(
        self,
        prob: Any,
        label: Any,
        pred: Any = None,
        spacing: Any = None,
        case: str | None = None,
        same_segmentation_as: dict[str, float] | None = None,
        review: Mapping[str, Any] | None = None,
    ) -> dict:
        """Score one volume (``prob (C, *spatial)``, ``label (1, *spatial)``, optional prediction and spacing in mm)
        and return its row (``case`` first, default ``volume_<index>``). ``same_segmentation_as``: a row of the same
        argmax (e.g. before a temperature) whose DSC / HD95 / ASD are reused; ``review``: the case's verdict."""
        table = self.metric(
            [prob],
            [label],
            pred=None if pred is None else [pred],
            spacing=[spacing],
            segmentation=[same_segmentation_as],
        )[0]
        self.cases.append(case if case is not None else f"volume_{len(self.cases):04d}")
        self.reviews.append(review)
        return self._row(self.cases[-1], table[0].tolist(), review, bool(review))

    def _row(self, case: str, values: list[float], review: Mapping[str, Any] | None, reviewed: bool) -> dict:
        return {"case": case, **dict(zip(self.metric.columns, values)), **(_review_columns(review) if reviewed else {})}

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict per volume: ``case`` then every column, as Python floats."""
        reviewed = any(r is not None for r in self.reviews)
        table = self.metric.aggregate().tolist()
        return [self._row(*row, reviewed) for row in zip(self.cases, table, self.reviews)]

    def review_summary(self) -> dict[str, Any]:
        """Volumes flagged / passed / not judged and their true mean DSC (the delivered segmentation's where measured),
        and the rule's bound (``{}`` without review verdicts)."""
        if not any(r is not None for r in self.reviews):
            return {}
        dice, out = self.values("mean_dice"), {}
        truth = [(r or {}).get("delivered_mean_dice", dice[i]) for i, r in enumerate(self.reviews)]
        truth = np.asarray([np.nan if v is None else v for v in truth], dtype=np.float64)
        for name, value in (("flagged", True), ("passed", False), ("not_judged", None)):
            chosen = [i for i, r in enumerate(self.reviews) if (r or {}).get("flag") is value]
            finite = [float(truth[i]) for i in chosen if np.isfinite(truth[i])]
            out[name] = {"volumes": len(chosen), "mean_dice": float(np.mean(finite)) if finite else float("nan")}
        first = next(r for r in self.reviews if r is not None)
        out.update({k: first[k] for k in ("bound", "alpha", "validation_volumes") if k in first})
        return out

    def __len__(self) -> int:
        return len(self.cases)

    def values(self, column: str) -> np.ndarray:
        """One column over the volumes, float64."""
        return self.metric.aggregate()[:, self.metric.columns.index(column)].numpy()

    def summary(self) -> dict[str, dict[str, float]]:
        """``{column: {"mean", "std", "volumes"}}`` over the volumes (non-finite entries left out)."""
        return dict(zip(self.metric.columns, column_summary(self.metric.aggregate().numpy())))

    def pooled(self) -> dict[str, float]:
        """ECE / CECE / NLL / Brier of all ground-truth foreground voxels of the volumes together."""
        return self.metric.pooled()

    def reliability_data(self) -> dict[str, np.ndarray]:
        """Top-label reliability bins pooled over the volumes (as ``reliability_diagram_data``)."""
        return self.metric.reliability_data()

    def case_quality(self) -> dict[str, Any]:
        """How the label-free estimates compare with the truth: ``estimate`` (``quality_agreement`` of
        ``est_mean_dice`` with ``mean_dice``), ``failure_detection`` (``failure_detection_summary`` with risk
        ``1 - mean_dice``) and ``volume`` (per class: mean relative error of the expected and predicted volumes, and
        the share of true volumes inside the interval)."""
        if not len(self):
            return {}
        estimate, true = self.values(CASE_SCORE), self.values("mean_dice")
        out: dict[str, Any] = {
            "estimate": quality_agreement(estimate, true),
            "failure_detection": failure_detection_summary(estimate, 1 - true),
        }
        volume: dict[str, dict[str, float]] = {}
        for name in self.class_names[1:]:
            truth = self.values(f"volume_{name}")
            present = truth > 0
            if not present.any():
                continue
            t = truth[present]
            rel = {kind: np.abs(self.values(f"volume_{kind}_{name}")[present] - t) / t for kind in ("prob", "pred")}
            low, high = (self.values(f"volume_prob_{bound}_{name}")[present] for bound in ("low", "high"))
            volume[name] = {
                "prob_relative_error": float(np.mean(rel["prob"])),
                "pred_relative_error": float(np.mean(rel["pred"])),
                "interval_coverage": float(np.mean((low <= t) & (t <= high))),
                "volumes": int(t.size),
            }
        out["volume"] = volume
        return out

    def write(
        self,
        output_dir: str | os.PathLike,
        settings: dict[str, Any] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        """Write the report's files to ``output_dir`` (nothing, with a warning, when no volume was added);
        ``settings`` are added to the table's own in ``summary.json``."""
        logger = logger or logging.getLogger("calib_monai")
        output_dir = Path(output_dir)
        if not len(self):
            logger.warning(f"SegmentationReport: no volumes were evaluated; nothing written to {output_dir}")
            return
        rows = self.rows
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomically(output_dir / "metrics.csv", buffer.getvalue())
        summary, pooled, quality = self.summary(), self.pooled(), self.case_quality()
        m = self.metric
        meta = {
            "volumes": len(rows),
            "num_bins": m.num_bins,
            "empty_class": m.empty_class,
            "classes": m.class_names,
            "band_radius": BAND_RADIUS,
            "confidence_threshold": LOW_CONFIDENCE,
            **(settings or {}),
            "reduction": "mean over volumes",  # of metrics.<column>.mean / std (and the handlers' val_* / test_*)
            "pooled": "all ground-truth foreground voxels of all volumes",
        }
        content = {"settings": meta, "metrics": summary, "pooled": pooled, "case_quality": quality}
        review = self.review_summary()
        if review:
            content["review"] = review
        write_text_atomically(output_dir / "summary.json", json.dumps(content, indent=2) + "\n")
        # the bins and the ECE drawn are pooled (the log leads with the mean over volumes): the figure says so
        _save_figure_atomically(
            save_reliability_diagram,
            output_dir / "reliability.png",
            self.reliability_data(),
            ece_label="pooled ECE",
            title=f"Reliability, pooled over all ground-truth\nforeground voxels of {len(rows)} volumes",
        )
        estimate, risk = self.values(CASE_SCORE), 1 - self.values("mean_dice")
        if int((np.isfinite(estimate) & np.isfinite(risk)).sum()) >= 2:
            _save_figure_atomically(save_risk_coverage_plot, output_dir / "risk_coverage.png", estimate, risk)
        headline = ", ".join(
            f"{k} {summary[k]['mean']:.4f}" for k in ("mean_dice", "mean_hd95", "ece", "cece", "tace") if k in summary
        )
        logger.info(
            f"evaluated {len(rows)} volume(s), mean over {len(rows)} volumes: {headline}; pooled ECE "
            f"{pooled.get('pooled_ece', float('nan')):.4f}; per-volume metrics in {output_dir}"
        )
        if quality:
            est, fd = quality["estimate"], quality["failure_detection"]
            logger.info(
                f"case quality: estimated vs true mean DSC over {est['cases']} volumes: MAE {est['mae']:.3f}, "
                f"Spearman {est['spearman']:.2f}; sorted by the estimate, AURC {fd['aurc']:.4f} "
                f"(random {fd['aurc_random']:.4f}, oracle {fd['aurc_oracle']:.4f}: "
                f"{fd['aurc_gap_closed']:.0%} of the gap closed)"
            )
        if review:
            counts = ", ".join(
                f"{review[k]['volumes']} {k.replace('_', ' ')} (true mean DSC {review[k]['mean_dice']:.3f})"
                for k in ("flagged", "passed", "not_judged")
            )
            bound = f"; the rule flags at most {review['bound']:.1%} of ordinary cases" if "bound" in review else ""
            logger.info(f"review flags: {counts}{bound}")
