"""``SegmentationReportSaver``: writes the report (``metrics.csv``, ``summary.json``, ``reliability.png``)."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
from ignite.engine import Engine, Events
from monai.utils import min_version, optional_import

from calib_monai.metrics import save_reliability_diagram
from calib_monai.metrics.segmentation_report import column_summary

idist, _ = optional_import("ignite", "0.4.4", min_version, "distributed")

__all__ = ["REDUCTION", "SegmentationReportSaver", "summarize_rows", "write_report"]

#: What ``metrics.<column>.mean`` / ``std`` of ``summary.json`` (and the handlers' ``val_*`` / ``test_*``) reduce.
REDUCTION = "mean over volumes"
POOLED_OVER = "all ground-truth foreground voxels of all volumes"


def summarize_rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{column: {"mean", "std", "volumes"}}`` over the rows (volumes), non-finite entries left out."""
    columns = [c for c in rows[0] if c != "case"] if rows else []
    table = np.array([[row[c] for c in columns] for row in rows], dtype=np.float64).reshape(len(rows), len(columns))
    return dict(zip(columns, column_summary(table)))


def write_report(
    output_dir: str | os.PathLike,
    rows: list[dict[str, Any]],
    reliability: dict[str, np.ndarray],
    pooled: dict[str, float],
    settings: dict[str, Any],
    logger: logging.Logger,
) -> None:
    """Write the three files of a report (nothing, with a warning, when there are no rows).

    ``rows``: one dict per volume (``case`` then the metric columns); ``reliability``: pooled top-label bins as
    :func:`calib_monai.metrics.reliability_diagram_data`; ``pooled``: ``{"pooled_ece": ...}``; ``settings``: the
    metric's settings (``num_bins``, ``empty_class``, ``classes``).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if not rows:
        logger.warning(f"SegmentationReport: no volumes were evaluated; nothing written to {output_dir}")
        return
    with open(output_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = summarize_rows(rows)
    settings = {"volumes": len(rows), **settings, "reduction": REDUCTION, "pooled": POOLED_OVER}
    content = {"settings": settings, "metrics": summary, "pooled": pooled}
    (output_dir / "summary.json").write_text(json.dumps(content, indent=2))
    # the bins and the ECE drawn are pooled (the log leads with the mean over volumes): the figure says so
    save_reliability_diagram(reliability, output_dir / "reliability.png", ece_label="pooled ECE",
                             title=f"Reliability, pooled over all ground-truth\nforeground voxels of {len(rows)} volumes")
    headline = ", ".join(
        f"{k} {summary[k]['mean']:.4f}" for k in ("mean_dice", "mean_hd95", "ece", "cece", "tace") if k in summary
    )
    logger.info(f"evaluated {len(rows)} volume(s), mean over {len(rows)} volumes: {headline}; pooled ECE "
                f"{pooled.get('pooled_ece', float('nan')):.4f}; per-volume metrics in {output_dir}")  # fmt: skip


class SegmentationReportSaver:
    """Write the report of ``SegmentationReportMetricHandler`` at ``COMPLETED``, on rank ``save_rank`` only.

    Reads ``engine.state.metric_details[metric_name]`` (set by the handler: ``columns``, ``cases``, the per-volume
    ``table``, the ``pooled`` values, the ``reliability`` bins and the ``settings``) and writes to ``output_dir``:

    * ``metrics.csv``: one row per volume (``case``, then every column);
    * ``summary.json``: ``settings`` (with ``"reduction": "mean over volumes"``), ``metrics.<column>.mean/std/volumes``
      (the mean over volumes, non-finite entries left out: the papers' reduction) and ``pooled`` (``pooled_ece``,
      ``pooled_cece``, ``pooled_nll``, ``pooled_brier`` of all ground-truth foreground voxels of all volumes);
    * ``reliability.png``: the top-label reliability diagram pooled over the same voxels.

    It computes nothing. ``monai.handlers.MetricsSaver`` is the model, but it cannot write these files: it writes
    one ``<name>_raw.csv`` per metric with one column per class (not one row per volume with all metrics), its
    summaries are per-class statistics (not the pooled values), and it has no reliability diagram.

    Args:
        output_dir: folder of the three files.
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
        write_report(self.output_dir, details_rows(details), details["reliability"], details["pooled"],
                     details["settings"], self.logger)  # fmt: skip


def details_rows(details: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``metrics.csv`` rows of the handler's details: ``case`` then every column, as Python floats."""
    return [{"case": case, **dict(zip(details["columns"], (float(v) for v in values)))}
            for case, values in zip(details["cases"], details["table"].tolist())]  # fmt: skip
