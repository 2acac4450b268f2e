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
    """Write the ``SegmentationReportTable`` in ``engine.state.metric_details[metric_name]["report"]`` (every rank's
    volumes gathered) to ``output_dir`` at ``COMPLETED``, on rank ``save_rank`` only; it computes nothing. Not
    ``monai.handlers.MetricsSaver``: that writes one CSV per metric with a column per class, no pooled values and no
    reliability diagram.
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
