"""Per-volume evaluation report of an evaluator run, in MONAI's pattern: ``SegmentationReportMetric`` computes,
:class:`SegmentationReportMetricHandler` attaches it, :class:`SegmentationReportSaver` writes the
``SegmentationReportTable``'s files; :class:`SegmentationReport` (bundles' ``evaluate.json``) attaches both."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ignite.engine import Engine, Events
from ignite.metrics.metric import reinit__is_reduced
from monai.handlers import IgniteMetricHandler
from monai.utils import min_version, optional_import, string_list_all_gather

from calib_monai.defaults import EMPTY_CLASS, NUM_BINS
from calib_monai.metrics.report_table import SegmentationReportTable, case_name, served_verdict, voxel_spacing
from calib_monai.metrics.segmentation_report import SegmentationReportMetric

idist, _ = optional_import("ignite", "0.4.4", min_version, "distributed")

__all__ = ["SegmentationReport", "SegmentationReportMetricHandler", "SegmentationReportSaver"]


class SegmentationReportMetricHandler(IgniteMetricHandler):
    """Attach :class:`calib_monai.metrics.SegmentationReportMetric` to an evaluator, volume by volume.

    Reads per volume dict (``output_transform(engine.state.output)``, the decollated list): ``"prob"``
    probabilities ``(C, *spatial)``, ``"pred"`` the prediction, ``"label"`` the ground truth, the spacing and case
    name from ``"image"`` and, when there, ``"quality"``'s review verdict (``CaseQualityd``). At the end of the
    epoch, all ranks gathered: ``engine.state.metrics[name]`` holds the means over volumes and the ``pooled_*``
    values; ``engine.state.metric_details[name]`` ``{"report": SegmentationReportTable, "columns", "cases", "table"
    (N, K) float64, "pooled"}``. ``metric`` is built from ``metric_args`` when None.
    """

    def __init__(
        self,
        metric: SegmentationReportMetric | None = None,
        output_transform: Callable = lambda x: x,
        **metric_args: Any,
    ) -> None:
        metric = SegmentationReportMetric(**metric_args) if metric is None else metric
        super().__init__(metric_fn=metric, output_transform=output_transform, save_details=True)
        self._metrics_result_mode = "named"  # the means stay under the handler's name (no clash with other metrics)
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
        for item in items:
            self._cases.append(case_name(item, len(self._cases)))
            self._reviews.append(json.dumps(served_verdict(item.get("quality"))))
        self.metric_fn(
            [item["prob"] for item in items],
            [item["label"] for item in items],
            pred=[item["pred"] for item in items],
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
        means = {column: s["mean"] for column, s in details["report"].summary().items()}  # non-finite entries left out
        return {**means, **details["pooled"]}


class SegmentationReportSaver:
    """Write the ``SegmentationReportTable`` in ``engine.state.metric_details[metric_name]["report"]`` (every rank's
    volumes gathered) to ``output_dir`` at ``COMPLETED``, on rank 0 only; it computes nothing. Not
    ``monai.handlers.MetricsSaver``: that writes one CSV per metric with a column per class, no pooled values and no
    reliability diagram.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        metric_name: str = "segmentation_report",
    ) -> None:
        self.output_dir = Path(output_dir)
        self.metric_name = metric_name
        self.logger = logging.getLogger("calib_monai")

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.COMPLETED, self)

    def __call__(self, engine: Engine) -> None:
        if idist.get_rank() != 0:
            return
        details = getattr(engine.state, "metric_details", {}).get(self.metric_name)
        if details is None:
            self.logger.warning(f"SegmentationReport: no volumes were evaluated; nothing written to {self.output_dir}")
            return
        details["report"].write(self.output_dir, logger=self.logger)


class SegmentationReport:
    """Evaluate every volume an evaluator sees and write the report's files to ``output_dir`` at the end of the run:
    attaches a :class:`SegmentationReportMetricHandler` (``engine.state.metrics["segmentation_report"]``) and a
    :class:`SegmentationReportSaver`. After the run, ``table`` (a ``SegmentationReportTable``) holds its volumes.

    Args:
        output_dir: folder of the files.
        label_names, num_bins, empty_class, regions, surface_distances: see
            :class:`calib_monai.metrics.SegmentationReportMetric` (``regions``, e.g. BraTS' ``{"ET": [3], "TC":
            [1, 3], "WT": [1, 2, 3]}``, add ``dice_ET``, ``hd95_ET``, ...).
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        label_names: dict[str, str],
        num_bins: int = NUM_BINS,
        empty_class: str = EMPTY_CLASS,
        regions: dict[str, list[int]] | None = None,
        surface_distances: bool = True,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.metric = SegmentationReportMetric(label_names, num_bins, empty_class, regions, surface_distances)
        self.handler = SegmentationReportMetricHandler(self.metric)
        self.saver = SegmentationReportSaver(output_dir)
        self.table = SegmentationReportTable(metric=self.metric)

    def attach(self, engine: Engine) -> None:
        self.handler.attach(engine, "segmentation_report")
        self.saver.attach(engine)
        engine.add_event_handler(Events.COMPLETED, self._keep_table)

    def _keep_table(self, engine: Engine) -> None:
        details = engine.state.metric_details.get("segmentation_report")
        self.table = details["report"] if details is not None else SegmentationReportTable(metric=self.metric)
