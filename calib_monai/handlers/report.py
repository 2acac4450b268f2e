"""Per-volume evaluation report of an evaluator run: the metric handler and the ``SegmentationReport`` handler.

MONAI's pattern: :class:`calib_monai.metrics.SegmentationReportMetric` computes (one row per volume),
:class:`SegmentationReportMetricHandler` attaches it to the engine (``engine.state.metrics`` / ``metric_details``),
:class:`calib_monai.handlers.report_saver.SegmentationReportSaver` writes the files. ``SegmentationReport`` attaches
both, with the arguments it always had (bundles' ``evaluate.json``, the experiment harness).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ignite.engine import Engine, Events
from ignite.metrics.metric import reinit__is_reduced
from monai.handlers import IgniteMetricHandler
from monai.utils import min_version, optional_import, string_list_all_gather

from calib_monai.metrics.segmentation_report import SegmentationReportMetric

from .report_saver import SegmentationReportSaver, details_rows, summarize_rows, write_report

idist, _ = optional_import("ignite", "0.4.4", min_version, "distributed")

__all__ = ["SegmentationReport", "SegmentationReportMetricHandler", "case_name"]


def case_name(item: dict[str, Any], index: int) -> str:
    """The file name of the item's image (its meta data), else ``volume_<index>``."""
    meta = getattr(item.get("image"), "meta", {}) or {}
    name = meta.get("filename_or_obj")
    return os.path.basename(str(name)) if name else f"volume_{index:04d}"


def _spacing(item: dict[str, Any]) -> list[float] | None:
    """Voxel size (mm) of the evaluated grid, from the affine of the (preprocessed) image; None when unknown."""
    affine = getattr(item.get("image"), "affine", None)
    if affine is None:
        return None
    affine = torch.as_tensor(affine, dtype=torch.float64)
    return [float(v) for v in torch.linalg.norm(affine[:3, :3], dim=0)]


class SegmentationReportMetricHandler(IgniteMetricHandler):
    """Attach :class:`calib_monai.metrics.SegmentationReportMetric` to an evaluator, volume by volume.

    Reads, per volume of ``output_transform(engine.state.output)`` (default: the evaluator's decollated list of
    dicts): ``prob_key`` softmax probabilities ``(C, *spatial)``, ``pred_key`` the one-hot or label-map prediction,
    ``label_key`` the ground truth, the voxel spacing from the affine of ``"image"`` and the case name from its meta
    data (``filename_or_obj``). At the end of the epoch, with the volumes of all ranks gathered:

    * ``engine.state.metrics[name]``: ``{column: mean over volumes}`` (non-finite entries left out) and the
      ``pooled_ece`` / ``pooled_cece`` / ``pooled_nll`` / ``pooled_brier`` of all ground-truth foreground voxels;
    * ``engine.state.metric_details[name]``: ``{"columns", "cases", "table" (N, K) float64, "pooled",
      "reliability" (the pooled top-label bins), "settings"}``: what ``SegmentationReportSaver`` writes.

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
        **metric_args: Any,
    ) -> None:
        metric = SegmentationReportMetric(**metric_args) if metric is None else metric
        super().__init__(metric_fn=metric, output_transform=output_transform, save_details=True)
        self._metrics_result_mode = "named"  # the means stay under the handler's name (no clash with other metrics)
        self.keys = (prob_key, pred_key, label_key)
        self._cases: list[str] = []

    @reinit__is_reduced
    def reset(self) -> None:
        super().reset()
        self._cases = []

    @reinit__is_reduced
    def update(self, output: Any) -> None:  # type: ignore[override]
        """Add the volumes of one iteration (a dict or a list of dicts)."""
        items = output if isinstance(output, (list, tuple)) else [output]
        prob_key, pred_key, label_key = self.keys
        for item in items:
            self._cases.append(case_name(item, len(self._cases)))
        self.metric_fn([item[prob_key] for item in items], [item[label_key] for item in items],
                       pred=[item[pred_key] for item in items], spacing=[_spacing(item) for item in items])  # fmt: skip

    def details(self) -> dict[str, Any]:
        """The report of the volumes so far (gathered over ranks; every rank must call it in distributed runs)."""
        metric: SegmentationReportMetric = self.metric_fn  # type: ignore[assignment]
        table = metric.aggregate()
        world = idist.get_world_size()
        cases = string_list_all_gather(self._cases) if world > 1 else list(self._cases)
        settings = {"num_bins": metric.num_bins, "empty_class": metric.empty_class, "classes": metric.class_names}
        return {"columns": metric.columns, "cases": cases, "table": table, "pooled": metric.pooled(),
                "reliability": metric.reliability_data(), "settings": settings}  # fmt: skip

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
    """Evaluate every volume an evaluator sees and write the papers' metrics to ``output_dir``.

    Attaches a :class:`SegmentationReportMetricHandler` (the computation: one row per volume, see
    :class:`calib_monai.metrics.SegmentationReportMetric`) and a
    :class:`calib_monai.handlers.report_saver.SegmentationReportSaver` (the files, at the end of the run):

    * ``metrics.csv``: one row per volume: DSC, HD95 and ASD per foreground class (mm when the image affine
      gives the spacing) and their means; ECE, CECE and TACE on ground-truth foreground voxels (the papers) and on
      prediction-or-ground-truth foreground voxels (``*_union``, the NACL journal's Sec. 4.2.8); NLL and Brier on
      ground-truth foreground voxels;
    * ``summary.json``: mean and standard deviation over volumes of every column (the papers' reduction: the
      unweighted mean over volumes; NaN entries, e.g. an absent class, are left out), the settings, and the
      ``pooled`` ECE / CECE / NLL / Brier of all ground-truth foreground voxels of all volumes;
    * ``reliability.png``: the top-label reliability diagram pooled over all ground-truth foreground voxels.

    Without an engine (the experiment harness): ``evaluate_volume`` gives a volume's row (and adds its bins to the
    pooled statistics), ``rows`` collects them, ``write`` writes the files. After an engine run, ``rows`` holds the
    run's rows. Where things are computed: see the metric (calibration on the tensors' device, only bins and
    per-volume numbers reach the host).

    Args:
        output_dir: folder of the three files.
        label_names: ``{"0": "background", "1": ...}``: class names for the columns.
        num_bins: bins of the calibration metrics.
        empty_class: ``"nan"`` or ``"papers"`` (DSC 1 / HD 0 for a class absent from both), see
            :func:`calib_monai.metrics.segmentation_metrics_per_volume`.
        regions: extra columns for unions of classes scored as one binary segmentation, e.g. BraTS'
            ``{"ET": [3], "TC": [1, 3], "WT": [1, 2, 3]}`` (``dice_ET``, ``hd95_ET``, ...).
        surface_distances: False leaves out the HD95 and ASD columns (much faster; e.g. the noise study).
        name: the key of the handler's entries in ``engine.state.metrics`` / ``metric_details``.
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
        name: str = "segmentation_report",
    ) -> None:
        self.output_dir = Path(output_dir)
        self.metric = SegmentationReportMetric(label_names, num_bins, empty_class, regions, surface_distances)
        self.handler = SegmentationReportMetricHandler(self.metric, prob_key, pred_key, label_key)
        self.saver = SegmentationReportSaver(output_dir, name, logger_name=logger_name)
        self.name = name
        self.logger = logging.getLogger(logger_name)
        self.rows: list[dict[str, Any]] = []

    @property
    def class_names(self) -> list[str]:
        return self.metric.class_names

    @property
    def num_bins(self) -> int:
        return self.metric.num_bins

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self._reset)
        self.handler.attach(engine, self.name)
        self.saver.attach(engine)
        engine.add_event_handler(Events.COMPLETED, self._collect_rows)

    def _reset(self, engine: Engine | None = None) -> None:
        self.rows = []
        self.metric.reset()

    def _collect_rows(self, engine: Engine) -> None:
        """``rows`` of the run, from the handler's details (as the saver wrote them)."""
        details = engine.state.metric_details.get(self.name)
        self.rows = details_rows(details) if details is not None else []

    def evaluate_volume(self, item: dict[str, Any], index: int = 0) -> dict[str, Any]:
        """The CSV row of one volume (and its reliability bins added to the pooled statistics)."""
        prob_key, pred_key, label_key = self.handler.keys
        table = self.metric([item[prob_key]], [item[label_key]], pred=[item[pred_key]], spacing=[_spacing(item)])[0]
        return {"case": case_name(item, index), **dict(zip(self.metric.columns, table[0].tolist()))}

    def summary(self) -> dict[str, dict[str, float]]:
        """``{column: {"mean", "std", "volumes"}}`` over ``rows`` (mean over volumes)."""
        return summarize_rows(self.rows)

    def pooled(self) -> dict[str, float]:
        """ECE / CECE / NLL / Brier of all ground-truth foreground voxels of the evaluated volumes together."""
        return self.metric.pooled()

    def reliability_data(self) -> dict[str, np.ndarray]:
        """Top-label reliability bins pooled over the evaluated volumes (as ``reliability_diagram_data``)."""
        return self.metric.reliability_data()

    def write(self, engine: Engine | None = None) -> None:
        """Write ``rows`` (the harness's volumes) to ``output_dir``: the saver's files."""
        settings = {"num_bins": self.num_bins, "empty_class": self.metric.empty_class, "classes": self.class_names}
        write_report(self.output_dir, self.rows, self.reliability_data(), self.pooled(), settings, self.logger)
