"""Per-volume evaluation report of an evaluator run: the metric handler and the ``SegmentationReport`` handler.

MONAI's pattern: :class:`calib_monai.metrics.SegmentationReportMetric` computes (one row per volume),
:class:`SegmentationReportMetricHandler` attaches it to the engine (``engine.state.metrics`` / ``metric_details``,
whose ``"report"`` is the :class:`calib_monai.metrics.SegmentationReportTable` of the run),
:class:`calib_monai.handlers.report_saver.SegmentationReportSaver` writes the table's files. ``SegmentationReport``
attaches both (bundles' ``evaluate.json``). Code without an engine uses the table directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from ignite.engine import Engine, Events
from ignite.metrics.metric import reinit__is_reduced
from monai.handlers import IgniteMetricHandler
from monai.utils import min_version, optional_import, string_list_all_gather

from calib_monai.defaults import BAND_RADIUS, EMPTY_CLASS, LOW_CONFIDENCE, NUM_BINS
from calib_monai.metrics.report_table import SegmentationReportTable, case_name, served_verdict, voxel_spacing
from calib_monai.metrics.segmentation_report import SegmentationReportMetric

from .report_saver import SegmentationReportSaver

idist, _ = optional_import("ignite", "0.4.4", min_version, "distributed")

__all__ = ["SegmentationReport", "SegmentationReportMetricHandler", "case_name"]


class SegmentationReportMetricHandler(IgniteMetricHandler):
    """Attach :class:`calib_monai.metrics.SegmentationReportMetric` to an evaluator, volume by volume.

    Reads, per volume of ``output_transform(engine.state.output)`` (default: the evaluator's decollated list of
    dicts): ``prob_key`` softmax probabilities ``(C, *spatial)``, ``pred_key`` the one-hot or label-map prediction,
    ``label_key`` the ground truth, the voxel spacing from the affine of ``"image"``, the case name from its meta
    data (``filename_or_obj``) and, when there, the review verdict ``quality_key``'s ``"review"``
    (``calib_monai.review.CaseQualityd``, the transform ``inferring`` runs). At the end of the epoch, with
    the volumes of all ranks gathered:

    * ``engine.state.metrics[name]``: ``{column: mean over volumes}`` (non-finite entries left out) and the
      ``pooled_ece`` / ``pooled_cece`` / ``pooled_nll`` / ``pooled_brier`` of all ground-truth foreground voxels;
    * ``engine.state.metric_details[name]``: ``{"report": the SegmentationReportTable of the volumes (what
      ``SegmentationReportSaver`` writes), "columns", "cases", "table" (N, K) float64, "pooled"}``.

    Args:
        metric: the metric (built from ``metric_args`` when None: ``label_names``, ``num_bins``, ``empty_class``,
            ``regions``, ``surface_distances``).
        prob_key, pred_key, label_key: keys of a volume's dict.
        output_transform: extracts the list of volume dicts from ``engine.state.output``.
    """

    def __init__(
        self,
        metric: SegmentationReportMetric | None = None,
        prob_key: str = "prob",
        pred_key: str = "pred",
        label_key: str = "label",
        output_transform: Callable = lambda x: x,
        quality_key: str = "quality",
        **metric_args: Any,
    ) -> None:
        metric = SegmentationReportMetric(**metric_args) if metric is None else metric
        super().__init__(metric_fn=metric, output_transform=output_transform, save_details=True)
        self._metrics_result_mode = "named"  # the means stay under the handler's name (no clash with other metrics)
        self.keys = (prob_key, pred_key, label_key)
        self.quality_key = quality_key
        self._cases: list[str] = []
        self._reviews: list[str] = []  # JSON of each volume's review verdict ("null" without one)

    @reinit__is_reduced
    def reset(self) -> None:
        super().reset()
        self._cases, self._reviews = [], []

    @reinit__is_reduced
    def update(self, output: Any) -> None:  # type: ignore[override]
        """Add the volumes of one iteration (a dict or a list of dicts)."""
        items = output if isinstance(output, (list, tuple)) else [output]
        prob_key, pred_key, label_key = self.keys
        for item in items:
            self._cases.append(case_name(item, len(self._cases)))
            self._reviews.append(json.dumps(served_verdict(item.get(self.quality_key))))
        self.metric_fn(
            [item[prob_key] for item in items],
            [item[label_key] for item in items],
            pred=[item[pred_key] for item in items],
            spacing=[voxel_spacing(item) for item in items],
        )

    def details(self) -> dict[str, Any]:
        """The report of the volumes so far (gathered over ranks; every rank must call it in distributed runs)."""
        metric: SegmentationReportMetric = self.metric_fn  # type: ignore[assignment]
        world = idist.get_world_size()
        cases = string_list_all_gather(self._cases) if world > 1 else list(self._cases)
        reviews = string_list_all_gather(self._reviews) if world > 1 else list(self._reviews)
        report = SegmentationReportTable(metric=metric, cases=cases, reviews=[json.loads(r) for r in reviews])
        return {
            "report": report,
            "columns": metric.columns,
            "cases": cases,
            "table": metric.aggregate(),
            "pooled": metric.pooled(),
        }

    def compute(self) -> dict[str, float]:
        details = self.details()
        self._is_reduced = True
        if self._engine is None or self._name is None:
            raise RuntimeError("please call the attach() function to connect expected engine first.")
        self._engine.state.metric_details[self._name] = details
        return {**self.metric_fn.summary_means(), **details["pooled"]}  # type: ignore[attr-defined]

    def attach(self, engine: Engine, name: str = "segmentation_report") -> None:  # type: ignore[override]
        super().attach(engine, name)


class SegmentationReport:
    """Evaluate every volume an evaluator sees and write the report to ``output_dir`` at the end of the run.

    Attaches a :class:`SegmentationReportMetricHandler` (the computation: one row per volume, see
    :class:`calib_monai.metrics.SegmentationReportMetric`) and a
    :class:`calib_monai.handlers.report_saver.SegmentationReportSaver` (the files of
    :class:`calib_monai.metrics.SegmentationReportTable`: ``metrics.csv``, ``summary.json``, ``reliability.png``,
    ``risk_coverage.png``; with the review verdicts of ``CaseQualityd`` under ``quality_key``, ``review_flag`` and
    ``review_reasons`` beside the true DSC). After the run, ``table`` / ``rows`` hold the run's volumes.

    Args:
        output_dir: folder of the files.
        label_names: ``{"0": "background", "1": ...}``: class names for the columns.
        num_bins: bins of the calibration metrics.
        empty_class: ``"nan"`` or ``"papers"`` (DSC 1 / HD 0 for a class absent from both), see
            :func:`calib_monai.metrics.segmentation_metrics_per_volume`.
        regions: extra columns for unions of classes scored as one binary segmentation, e.g. BraTS'
            ``{"ET": [3], "TC": [1, 3], "WT": [1, 2, 3]}`` (``dice_ET``, ``hd95_ET``, ...).
        surface_distances: False leaves out the HD95 and ASD columns (much faster).
        name: the key of the handler's entries in ``engine.state.metrics`` / ``metric_details``.
        band_radius, confidence_threshold: see :class:`calib_monai.metrics.SegmentationReportMetric`.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        label_names: dict[str, str],
        num_bins: int = NUM_BINS,
        empty_class: str = EMPTY_CLASS,
        prob_key: str = "prob",
        pred_key: str = "pred",
        label_key: str = "label",
        regions: dict[str, list[int]] | None = None,
        logger_name: str = "calib_monai",
        surface_distances: bool = True,
        name: str = "segmentation_report",
        band_radius: int = BAND_RADIUS,
        confidence_threshold: float = LOW_CONFIDENCE,
        quality_key: str = "quality",
    ) -> None:
        self.output_dir = Path(output_dir)
        self.metric = SegmentationReportMetric(
            label_names, num_bins, empty_class, regions, surface_distances, band_radius, confidence_threshold
        )
        self.handler = SegmentationReportMetricHandler(
            self.metric, prob_key, pred_key, label_key, quality_key=quality_key
        )
        self.saver = SegmentationReportSaver(output_dir, name, logger_name=logger_name)
        self.name = name
        self.table = SegmentationReportTable(metric=self.metric)

    def attach(self, engine: Engine) -> None:
        self.handler.attach(engine, self.name)
        self.saver.attach(engine)
        engine.add_event_handler(Events.COMPLETED, self._keep_table)

    def _keep_table(self, engine: Engine) -> None:
        details = engine.state.metric_details.get(self.name)
        self.table = details["report"] if details is not None else SegmentationReportTable(metric=self.metric)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The run's rows (``case`` then every column)."""
        return self.table.rows

    def summary(self) -> dict[str, dict[str, float]]:
        return self.table.summary()

    def pooled(self) -> dict[str, float]:
        return self.table.pooled()

    def reliability_data(self) -> dict[str, np.ndarray]:
        return self.table.reliability_data()
