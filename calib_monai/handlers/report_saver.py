"""``SegmentationReportSaver``: writes the report of ``SegmentationReportMetricHandler`` (the table's files)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ignite.engine import Engine, Events
from monai.utils import min_version, optional_import

idist, _ = optional_import("ignite", "0.4.4", min_version, "distributed")

__all__ = ["SegmentationReportSaver"]


class SegmentationReportSaver:
    """Write the report of ``SegmentationReportMetricHandler`` at ``COMPLETED``, on rank ``save_rank`` only.

    Reads ``engine.state.metric_details[metric_name]["report"]`` (the handler's
    :class:`calib_monai.metrics.SegmentationReportTable`, every rank's volumes gathered) and writes its files to
    ``output_dir`` (:meth:`~calib_monai.metrics.SegmentationReportTable.write`: ``metrics.csv``, ``summary.json``,
    ``reliability.png``, ``risk_coverage.png``). It computes nothing. ``monai.handlers.MetricsSaver`` is the model,
    but it cannot write these files: it writes
    one ``<name>_raw.csv`` per metric with one column per class (not one row per volume with all metrics), its
    summaries are per-class statistics (not the pooled values), and it has no reliability diagram.

    Args:
        output_dir: folder of the files.
        metric_name: the name the metric handler was attached under.
        save_rank: the rank that writes in multi-GPU evaluation (the handler has gathered every rank's volumes).
        logger_name: logger of the one-line summary.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        metric_name: str = "segmentation_report",
        save_rank: int = 0,
        logger_name: str = "calib_monai",
    ) -> None:
        self.output_dir = Path(output_dir)
        self.metric_name = metric_name
        self.save_rank = save_rank
        self.logger = logging.getLogger(logger_name)

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.COMPLETED, self)

    def __call__(self, engine: Engine) -> None:
        if idist.get_rank() != self.save_rank:
            return
        details = getattr(engine.state, "metric_details", {}).get(self.metric_name)
        if details is None:
            self.logger.warning(f"SegmentationReport: no volumes were evaluated; nothing written to {self.output_dir}")
            return
        details["report"].write(self.output_dir, logger=self.logger)
