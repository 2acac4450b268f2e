"""The main comparison: every method on one data set (the papers' Tables 1 and 2, ranks, radar, reliability,
qualitative and logit figures)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bundle_factory.specs import METHODS
from calib_monai.metrics import friedman_rank, mean_case_rank, sum_rank
from studies import figures
from studies.evaluation import EvaluatedVolume, TrainedRun, case_table, evaluate_run
from studies.study import StudySetup, format_mean_std, heading, write_table

__all__ = ["LogitStatistics", "main_comparison"]

RANKED = (("mean_dice", True), ("mean_hd95", False), ("ece", False), ("cece", False), ("tace", False))
LOGIT_EDGES = np.linspace(-10.0, 40.0, 101)


@dataclass
class LogitStatistics:
    """Logits of the evaluated volumes: mean |logit| per (ground-truth class, logit channel) and the histogram of
    the max logit over voxels (the NACL journal's logit study)."""

    num_classes: int
    abs_sum: np.ndarray = field(init=False)
    count: np.ndarray = field(init=False)
    max_logit_hist: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.abs_sum = np.zeros((self.num_classes, self.num_classes))
        self.count = np.zeros(self.num_classes, dtype=np.int64)
        self.max_logit_hist = np.zeros(len(LOGIT_EDGES) - 1, dtype=np.int64)

    def add(self, volume: EvaluatedVolume, prob: torch.Tensor | None = None) -> None:
        logits = volume.logits.reshape(self.num_classes, -1).double()
        labels = volume.label.reshape(-1)
        for k in range(self.num_classes):
            hit = labels == k
            self.count[k] += int(hit.sum())
            self.abs_sum[k] += logits[:, hit].abs().sum(1).numpy()
        top = logits.max(0).values.clamp(LOGIT_EDGES[0], LOGIT_EDGES[-1]).numpy()
        self.max_logit_hist += np.histogram(top, bins=LOGIT_EDGES)[0]

    def mean_abs(self) -> np.ndarray:
        """``(ground-truth class, logit channel)`` mean absolute logit."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.abs_sum / self.count[:, None]


class _QualitativeSlice:
    """Keeps one slice (the one with the most foreground) of one chosen test volume for the qualitative figure."""

    def __init__(self, case_index: int) -> None:
        self.case_index, self.seen, self.kept = case_index, 0, None

    def add(self, volume: EvaluatedVolume, prob: torch.Tensor) -> None:
        if self.seen == self.case_index:
            k = int(volume.label[0].reshape(-1, volume.label.shape[-1]).gt(0).sum(0).argmax())
            conf, pred = prob[..., k].max(0)
            self.kept = (
                volume.case,
                k,
                volume.image[0, ..., k].numpy(),
                volume.label[0, ..., k].numpy(),
                pred.numpy(),
                conf.numpy(),
            )
        self.seen += 1


def _median_foreground_case(run: TrainedRun) -> int:
    sizes = [int(torch.as_tensor(item["label"]).gt(0).sum()) for item in run.dataset("test")]
    return int(np.argsort(sizes)[len(sizes) // 2])


def main_comparison(setup: StudySetup, methods: Sequence[str] = tuple(METHODS), command: str = "") -> dict:
    """Train (or reuse) every method's run, evaluate on the test volumes, write tables and figures to
    ``<results_dir>/main``; returns ``{method: {column: mean}}``."""
    methods = setup.check_methods(methods)
    out = setup.study_dir("main")
    reports, logits, slices, specs = {}, {}, {}, []
    case_index = None
    for method in methods:
        run = setup.trained(method)
        specs.append(setup.spec(method))
        case_index = _median_foreground_case(run) if case_index is None else case_index
        stats, view = LogitStatistics(run.num_classes), _QualitativeSlice(case_index)

        def on_volume(volume, prob, stats=stats, view=view):
            stats.add(volume)
            view.add(volume, prob)

        reports[method] = evaluate_run(run, "test", output_dir=run.run_dir / "eval_test", on_volume=on_volume)
        logits[method], slices[method] = stats, view.kept
        names = [run.label_names[k] for k in sorted(run.label_names, key=int)]
    summaries = {m: r.summary() for m, r in reports.items()}
    means = {m: {k: v["mean"] for k, v in s.items()} for m, s in summaries.items()}

    with open(out / "per_volume.csv", "w", newline="") as f:
        columns = list(reports[methods[0]].rows[0])
        writer = csv.DictWriter(f, fieldnames=["method", *columns])
        writer.writeheader()
        for m in methods:
            writer.writerows({"method": m, **row} for row in reports[m].rows)

    def cells(method: str, columns: Sequence[str]) -> dict[str, str]:
        s = summaries[method]
        return {heading(c): format_mean_std(s[c]["mean"], s[c]["std"]) if c in s else "n/a" for c in columns}

    fg = names[1:]
    seg_cols = [f"dice_{n}" for n in fg] + ["mean_dice"] + [f"hd95_{n}" for n in fg] + ["mean_hd95"]
    table1 = write_table(
        [{"method": m, **cells(m, seg_cols)} for m in methods],
        out / "table1_segmentation",
        "Table 1: DSC and HD95 per structure (mean ± std over test volumes)",
    )
    calibration_columns = ["ece", "cece", "tace", "ml1ace_gt", "nll", "brier", "ml1ace", "cece_all"]
    table2 = write_table(
        [{"method": m, **cells(m, calibration_columns)} for m in methods],
        out / "table2_calibration",
        "Table 2: calibration on ground-truth foreground voxels (ECE to Brier; mL1-ACE (gt) is the mL1-ACE formula "
        "there, background included), and as the papers that score every voxel define it (mL1-ACE, CECE (all): per "
        "volume, all voxels, background excluded, 20 bins)",
    )

    columns = [c for c, _ in RANKED]
    higher = [h for _, h in RANKED]
    scores = np.array([[means[m][c] for c in columns] for m in methods])
    cases = np.stack([case_table(reports[m], columns) for m in methods])
    ranks = zip(methods, sum_rank(scores, higher), mean_case_rank(cases, higher), friedman_rank(scores, higher))
    table3 = write_table(
        [
            {"method": m, "sum_rank": float(s), "mean_case_rank": float(c), "friedman_rank": float(f)}
            for m, s, c, f in ranks
        ],
        out / "ranks",
        "Ranks over DSC, HD95, ECE, CECE, TACE (lower is better)",
    )
    logit_rows = []
    for m in methods:
        table = logits[m].mean_abs()
        for k, name in enumerate(names):
            logit_rows.append(
                {"method": m, "ground_truth": name, **{f"logit {n}": float(table[k, j]) for j, n in enumerate(names)}}
            )
    table4 = write_table(
        logit_rows, out / "logits_mean_abs", "Mean |logit| per channel for the voxels of each ground-truth class"
    )

    figures.radar_plot(
        means,
        [
            ("mean_dice", "DSC", True),
            ("mean_hd95", "HD95", False),
            ("ece", "ECE", False),
            ("cece", "CECE", False),
            ("tace", "TACE", False),
        ],
        out / "radar.png",
        f"{setup.dataset}: DSC vs calibration (outer is better)",
    )
    figures.reliability_grid(
        {m: reports[m].reliability_data() for m in methods},
        out / "reliability.png",
        f"{setup.dataset}: reliability, ground-truth foreground voxels of the test volumes",
    )
    kept = slices[methods[0]]
    figures.qualitative_figure(
        kept[2],
        kept[3],
        {m: (slices[m][4], slices[m][5]) for m in methods},
        out / "qualitative.png",
        len(names),
        f"{kept[0]}, slice {kept[1]}",
    )
    figures.logit_histograms(
        {m: logits[m].max_logit_hist for m in methods},
        LOGIT_EDGES,
        out / "max_logit_hist.png",
        f"{setup.dataset}: max logit over test voxels",
    )
    setup.write_readme(
        "main",
        f"Main comparison on {setup.dataset}",
        command or "(called from Python)",
        [
            table1,
            table2,
            table3,
            table4,
            "Figures: `radar.png`, `reliability.png`, `qualitative.png`, `max_logit_hist.png`; "
            "per-volume values: `per_volume.csv`.",
        ],
        specs,
    )
    return means
