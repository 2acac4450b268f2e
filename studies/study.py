"""What every study shares: the data set and training budget, where runs and results go, and result tables."""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bundle_factory.specs import DATASETS, METHODS
from studies.evaluation import TrainedRun
from studies.runs import RunSpec, read_record, train

__all__ = ["TARGETS_FILE", "StudySetup", "format_mean_std", "heading", "load_targets", "write_csv", "write_table"]

#: The studies' targets (bars to meet, with their source): results documentation, not code.
TARGETS_FILE = Path(__file__).resolve().parents[1] / "docs" / "results" / "targets.json"


def load_targets(study: str, path: str | os.PathLike = TARGETS_FILE) -> dict[str, Any]:
    """The targets of ``study`` in ``docs/results/targets.json`` (its numbers and their ``source``)."""
    targets = json.loads(Path(path).read_text())
    if study not in targets:
        raise KeyError(f"{path} has no targets for {study!r} (it has {sorted(targets)})")
    return targets[study]


logger = logging.getLogger(__name__)


_JSON_LITERALS = {"true": True, "false": False, "null": None}


def command_line_overrides(value: Any, name: str = "--overrides") -> dict[str, Any]:
    """Bundle overrides as the command line gives them: a JSON object (a string), or the dict Fire makes of one. Fire
    reads JSON's ``true``, ``false`` and ``null`` inside a dict as the strings "true", "false" and "null"; they are read
    as JSON means them (``"data#use_split_lists": false`` would otherwise reach the bundle as the truthy 'false')."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{name}: not a JSON object ({err}); e.g. '{{\"data#resize\": [128, 128]}}'") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}: expected a JSON object of bundle keys and values, got {value!r}")
    return {str(key): _as_json(item) for key, item in value.items()}


def _as_json(value: Any) -> Any:
    if isinstance(value, str):
        return _JSON_LITERALS.get(value, value)
    if isinstance(value, (list, tuple)):
        return [_as_json(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _as_json(item) for key, item in value.items()}
    return value


@dataclass
class StudySetup:
    """A data set, a training budget and two folders.

    Args:
        dataset: data set key of the bundles (``hpc``, ``acdc``, ``flare``, ...): bundles ``<method>_<dataset>``.
        dataset_dir: the data set folder ("" for FLARE: the embedded phantoms).
        results_dir: tables, figures and the study's README (e.g. ``docs/results/hpc``).
        runs_dir: training runs (checkpoints, logs); default ``runs/experiments/<dataset>``.
        epochs, lr_milestone, train_fraction, seed: the budget, passed to every run (None: the bundle's value).
        overrides: further bundle keys for every run, e.g. ``{"data#resize": [128, 128]}``.
        demo: also load the bundle's ``configs/demo.json`` (FLARE phantoms).
        split_seed: the seed of the data split of every run (``data#seed``); None: each run's ``seed``, so the
            seeds of a multi-seed study also draw different splits. A fixed split keeps the test volumes of all seeds
            the same (per-volume pairs, ensembles of the seeds).
    """

    dataset: str
    dataset_dir: str = ""
    results_dir: str = ""
    runs_dir: str = ""
    epochs: int | None = None
    lr_milestone: int | None = None
    train_fraction: float = 1.0
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    demo: bool = False
    split_seed: int | None = None

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(
                f"dataset must be one of {sorted(DATASETS)} (the bundles' data sets), got {self.dataset!r}"
            )
        if self.dataset_dir:
            path = Path(self.dataset_dir).expanduser()
            if not path.is_dir():
                raise ValueError(
                    f"dataset_dir {self.dataset_dir!r} is not a folder; pass the {self.dataset} data set "
                    "folder (e.g. ../shared/data/Task04_Hippocampus)"
                )
            self.dataset_dir = str(path.resolve())
        self.results_dir = Path(self.results_dir or Path("results") / self.dataset)
        self.runs_dir = Path(self.runs_dir or Path("runs") / "experiments" / self.dataset)
        self.overrides = command_line_overrides(self.overrides)

    @staticmethod
    def check_methods(methods: Sequence[str]) -> list[str]:
        methods = [methods] if isinstance(methods, str) else list(methods)
        unknown = [m for m in methods if m not in METHODS]
        if unknown or not methods:
            raise ValueError(f"methods must be among {list(METHODS)}, got {methods}")
        return methods

    def run_overrides(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The bundle overrides of a run: the setup's budget and ``overrides``, then ``extra`` (a variant)."""
        out: dict[str, Any] = {}
        if self.dataset_dir:
            out["dataset_dir"] = self.dataset_dir
        if self.epochs is not None:
            out["epochs"] = int(self.epochs)
        if self.lr_milestone is not None:
            out["lr_milestone"] = int(self.lr_milestone)
        if self.seed:
            out["seed"] = int(self.seed)
        if self.split_seed is not None and int(self.split_seed) != int(self.seed):
            out["data#seed"] = int(self.split_seed)  # the bundles' data split follows @seed unless told otherwise
        out.update(self.overrides)
        out.update(extra or {})
        if float(out.get("train_fraction", self.train_fraction)) != 1.0:
            out["train_fraction"] = float(out.get("train_fraction", self.train_fraction))
        else:
            out.pop("train_fraction", None)
        return out

    def spec(self, method: str, variant: str = "", extra: Mapping[str, Any] | None = None) -> RunSpec:
        """The run of ``method`` (and a named ``variant`` with its ``extra`` overrides) in ``runs_dir``."""
        bundle = f"{method}_{self.dataset}"
        name = f"{bundle}__{variant}" if variant else bundle
        return RunSpec(
            bundle, Path(self.runs_dir) / name, self.run_overrides(extra), ("demo.json",) if self.demo else ()
        )

    def trained(self, method: str, variant: str = "", extra: Mapping[str, Any] | None = None) -> TrainedRun:
        """Train the run unless finished (a stopped one resumes), then load it for evaluation."""
        spec = self.spec(method, variant, extra)
        train(spec)
        return TrainedRun(spec.run_dir)

    def seeded(self, seed: int) -> StudySetup:
        """The same setup at ``seed``, its runs in ``<runs_dir>/seed<seed>`` (multi-seed studies)."""
        return replace(self, seed=int(seed), runs_dir=str(Path(self.runs_dir) / f"seed{int(seed)}"))

    def study_dir(self, study: str) -> Path:
        path = Path(self.results_dir) / study
        path.mkdir(parents=True, exist_ok=True)
        return path

    def describe(self, seeds: Sequence[int] | None = None) -> str:
        """The budget in words, for the study README; ``seeds`` for a study that trains over several."""
        parts = [
            f"data set `{self.dataset}` ({DATASETS[self.dataset].title})",
            f"data `{self.dataset_dir or 'embedded phantoms'}`",
            f"epochs {self.epochs or 'bundle default'}",
            f"lr 1e-3, x0.1 from epoch {self.lr_milestone}" if self.lr_milestone else "lr 1e-3, x0.1 at half time",
            f"training cases {self.train_fraction:.0%}",
            *([f"data split of seed {self.split_seed} for every seed"] if self.split_seed is not None else []),
            f"seeds {', '.join(str(s) for s in seeds)}" if seeds else f"seed {self.seed}",
        ]
        if self.overrides:
            parts.append("overrides " + ", ".join(f"`{k}={json.dumps(v)}`" for k, v in self.overrides.items()))
        return "; ".join(parts)

    def write_readme(
        self,
        study: str,
        title: str,
        command: str,
        sections: Sequence[str],
        runs: Sequence[RunSpec],
        seeds: Sequence[int] | None = None,
    ) -> Path:
        """``<results_dir>/<study>/README.md``: the command, the budget, the results and the runs' records."""
        lines = [
            f"# {title}",
            "",
            "Command (from the repository root):",
            "",
            f"    {command}",
            "",
            f"Budget: {self.describe(seeds)}.",
            "",
        ]
        for section in sections:
            lines += [section, ""]
        lines += [
            "## Runs",
            "",
            "| run | wall time (s) | attempts | seed | torch | monai | commit |",
            "|---|---|---|---|---|---|---|",
        ]
        for spec in runs:
            record = read_record(spec.run_dir) or {}
            v = record.get("versions", {})
            lines.append(
                f"| {Path(spec.run_dir).name} | {record.get('wall_time_s', '')} | {record.get('attempts', '')} "
                f"| {record.get('seed', '')} | {v.get('torch', '')} | {v.get('monai', '')} "
                f"| {v.get('git_commit', '')[:10]} |"
            )
        lines += [
            "",
            "Each run folder holds `run.json` (overrides, command, versions, wall time) and `config.json` "
            "(the merged bundle config).",
        ]
        path = self.study_dir(study) / "README.md"
        path.write_text("\n".join(lines) + "\n")
        logger.info("wrote %s", path)
        return path


def heading(column: str) -> str:
    """``dice_RV`` -> ``DSC RV``, ``mean_hd95`` -> ``mean HD95``, ``ece`` -> ``ECE``."""
    words = {
        "dice": "DSC",
        "hd95": "HD95",
        "ece": "ECE",
        "cece": "CECE",
        "tace": "TACE",
        "ml1ace": "mL1-ACE",
        "ml1ace_gt": "mL1-ACE (gt)",
        "cece_all": "CECE (all)",
        "nll": "NLL",
        "brier": "Brier",
    }
    if column in words:
        return words[column]
    return " ".join(words.get(w, w) for w in column.split("_", 1))


def format_mean_std(mean: float, std: float | None = None, digits: int = 3) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    return f"{mean:.{digits}f}" if std is None or math.isnan(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def write_table(rows: Sequence[Mapping[str, Any]], path_stem: str | os.PathLike, title: str = "") -> str:
    """Write ``rows`` (dicts with the same keys) as ``<stem>.csv`` and ``<stem>.md``; returns the Markdown."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    columns = list(rows[0]) if rows else []
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    cell = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    md = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    text = "\n".join(md) + "\n"
    stem.with_suffix(".md").write_text(text)
    return text


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows whose keys may differ (the union of the keys, in order of appearance) as a CSV file; gzip-compressed
    (without a timestamp, so the same rows give the same bytes) when ``path`` ends in ``.gz``."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    writer.writeheader()
    writer.writerows(rows)
    if str(path).endswith(".gz"):
        Path(path).write_bytes(gzip.compress(text.getvalue().encode(), mtime=0))
    else:
        Path(path).write_text(text.getvalue(), newline="")
