"""The study commands (``python scripts/experiments.py <study> ...`` or ``calib-monai experiment <study> ...``).

Every study takes the set-up flags of :class:`studies.study.StudySetup`: ``--dataset`` (``hpc``,
``acdc``, ``flare``, ...), ``--dataset_dir``, ``--results_dir`` (tables, figures, README), ``--runs_dir``
(checkpoints; default ``runs/experiments/<dataset>``), ``--epochs``, ``--lr_milestone``, ``--train_fraction``,
``--seed``, ``--overrides '{"data#resize": [128, 128]}'`` and ``--demo`` (FLARE phantoms' ``demo.json``).
Runs are trained when missing, resumed when stopped, and reused when finished, so the studies share them.

Example (the Hippocampus results in docs/results/hpc)::

    python scripts/experiments.py main --dataset hpc --dataset_dir ../shared/data/Task04_Hippocampus \\
        --results_dir docs/results/hpc --epochs 6 --lr_milestone 4 --train_fraction 0.5
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bundle_factory.specs import METHODS
from calib_monai.data.site_shift import SITE_SHIFT_KINDS
from calib_monai.defaults import CONTOUR_ALPHA, CONTOUR_EPSILON, LTS_STEPS
from studies.ablations import (
    NACL_ABLATIONS,
    crac_vs_nacl_study,
    logit_epochs_study,
    nacl_ablation_study,
    posthoc_study,
)
from studies.anchor import anchor_rows, read_ranges
from studies.calibrated import calibrated_study
from studies.comparison import main_comparison
from studies.crac_study import CRAC_VARIANTS, crac_ablation_study
from studies.margin_figures import margin_figures as margin_figures_study
from studies.margin_summary import rescore_margins
from studies.margins import margins_study
from studies.quality import quality_study
from studies.robustness import data_fraction_study, noise_study
from studies.site import read_records, write_site_results
from studies.study import StudySetup, command_line_overrides

__all__ = ["COMMANDS", "run"]


def _command_line() -> str:
    """The command line that started this study, for its README."""
    program = os.path.basename(sys.argv[0])
    program = "python scripts/experiments.py" if program == "experiments.py" else program  # or calib-monai
    return f"{program} {shlex.join(sys.argv[1:])}"


def _run(study, name: str, setup: StudySetup, *args: Any, **kwargs: Any) -> str:
    """Run a study with the command line that started it (for its README); return its results folder."""
    study(setup, *args, command=_command_line(), **kwargs)
    return str(setup.study_dir(name))


def main(dataset: str, methods: Sequence[str] = tuple(METHODS), **setup: Any) -> str:
    """Table 1 (DSC, HD95), Table 2 (ECE, CECE, TACE), ranks, radar, reliability, qualitative and logit figures."""
    return _run(main_comparison, "main", StudySetup(dataset, **setup), methods)


def noise(
    dataset: str,
    methods: Sequence[str] = ("ce_dice", "nacl"),
    sigmas: Sequence[float] = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05),
    **setup: Any,
) -> str:
    """Gaussian noise of ``sigmas`` on the test images, for the main runs of ``methods``."""
    return _run(noise_study, "noise", StudySetup(dataset, **setup), methods, sigmas)


def data_fraction(
    dataset: str,
    methods: Sequence[str] = ("ce_dice", "nacl"),
    fractions: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
    **setup: Any,
) -> str:
    """Training on ``fractions`` of the training cases."""
    return _run(data_fraction_study, "data_fraction", StudySetup(dataset, **setup), methods, fractions)


def nacl_ablation(dataset: str, groups: Sequence[str] = tuple(NACL_ABLATIONS), **setup: Any) -> str:
    """NACL's lambda, prior, distance, logits/softmax and patch size, one at a time."""
    return _run(nacl_ablation_study, "nacl_ablation", StudySetup(dataset, **setup), groups)


def crac_vs_nacl(dataset: str, lambdas: Sequence[float] = (0.01, 0.1, 0.5, 1.0), **setup: Any) -> str:
    """NACL for several lambda against CRaC's learned multipliers."""
    return _run(crac_vs_nacl_study, "crac_vs_nacl", StudySetup(dataset, **setup), lambdas)


def crac_ablation(
    dataset: str, variants: Sequence[str] = tuple(CRAC_VARIANTS), seeds: Sequence[int] = (0, 1), **setup: Any
) -> str:
    """CRaC presets, tolerance, margin, averaging and rho0 against CE+Dice and NACL, for every seed."""
    return _run(crac_ablation_study, "crac_ablation", StudySetup(dataset, **setup), variants, seeds)


def calibrated(
    dataset: str,
    methods: Sequence[str] = tuple(METHODS),
    seeds: Sequence[int] = (0, 1),
    ece_bound: float = 0.05,
    surface_distances: bool = False,
    lts_steps: int = LTS_STEPS,
    **setup: Any,
) -> str:
    """Every method with and without temperature scaling (and local temperature scaling) under each model-selection
    rule (best validation DSC, lowest validation NLL, best DSC with validation ECE <= ``ece_bound``), every seed."""
    return _run(
        calibrated_study,
        "calibrated",
        StudySetup(dataset, **setup),
        methods,
        seeds,
        ece_bound,
        surface_distances,
        lts_steps,
    )


def quality(
    dataset: str,
    methods: Sequence[str] = ("ce_dice", "nacl", "sl1ace"),
    seeds: Sequence[int] = (0, 1),
    other_dataset: str = "",
    other_dir: str = "",
    other_overrides: dict | str | None = None,
    shifts: Sequence[str] = SITE_SHIFT_KINDS,
    strengths: Sequence[str] = ("mild", "strong"),
    calibrate_overrides: dict | str | None = None,
    **setup: Any,
) -> str:
    """The served verdict: every method x seed trained, recalibrated by the bundle's ``calibrate`` and served
    through ``inference.json`` on the test images, each site shift at each strength and ``other_dataset``'s images
    (``other_dir``, with its bundle ``other_overrides``); ``--split_seed 0`` keeps one test set for every seed;
    ``calibrate_overrides``: settings of the ``calibrate`` step only (e.g. ``'{"review_score_check": false}'``)."""
    other_overrides = command_line_overrides(other_overrides, "--other_overrides")
    calibrate_overrides = command_line_overrides(calibrate_overrides, "--calibrate_overrides")
    return _run(
        quality_study,
        "quality",
        StudySetup(dataset, **setup),
        methods,
        seeds,
        other_dataset,
        other_dir,
        other_overrides or {},
        shifts,
        strengths,
        calibrate_settings=calibrate_overrides or {},
    )


def site(dataset: str, orders: int = 100, **options: Any) -> str:
    """The site monitor through the serving path: the ``quality`` study with ``options`` (its runs reused, its cases
    served), then :func:`site_tables` from its served records, in ``<results_dir>/site``."""
    served = Path(quality(dataset, **options))
    return site_tables(dataset, orders, str(served.parent), options.get("runs_dir", ""))


def site_tables(dataset: str, orders: int = 100, results_dir: str = "", runs_dir: str = "") -> str:
    """From the ``quality`` study's served records (``<results_dir>/quality``) and its runs' validated ranges: each
    signal's rank histogram on the ordinary test volumes, false alarms over ``orders`` random orders, the cases to an
    alarm for each stream, and each stream's answers re-anchored from 2, 4 and 8 site labels (:mod:`studies.anchor`),
    in ``<results_dir>/site``. Serves nothing."""
    setup = StudySetup(dataset, results_dir=results_dir, runs_dir=runs_dir)
    records = read_records(Path(setup.results_dir) / "quality" / "per_volume.csv.gz")
    anchors = anchor_rows(records, read_ranges(setup.runs_dir, dataset, records))
    write_site_results(Path(setup.results_dir) / "site", records, orders, _command_line(), anchors)
    return str(Path(setup.results_dir) / "site")


def margins(
    dataset: str,
    runs_dir: str,
    results_dir: str = "",
    work_dir: str = "",
    methods: Sequence[str] = ("ce_dice", "nacl", "sl1ace"),
    seeds: Sequence[int] = (0, 1),
    epsilons: Sequence[float] = (CONTOUR_EPSILON, 0.1),
    alpha: float = CONTOUR_ALPHA,
    shifts: Sequence[str] = (),
) -> str:
    """Issue 49's contour study on the quality study's finished runs (``<runs_dir>/seed<s>/<method>_<dataset>``;
    trains nothing): each run's weights copied to ``work_dir`` (default ``/tmp/calib_monai_margins/<dataset>``),
    recalibrated with contours at each of ``epsilons`` and served on its test split (and each ``kind_strength`` of
    ``shifts``, e.g. ``contrast_strong``) and validation split; coverage, excess and missing volume of the served
    contours and of the morphological margin, in ``<results_dir>`` (default ``docs/results/margins/<dataset>``)."""
    pairs = [tuple(s.rsplit("_", 1)) for s in ([shifts] if isinstance(shifts, str) else shifts)]
    runs = _margin_runs(dataset, results_dir, work_dir, methods, seeds)
    return margins_study(
        dataset,
        runs_dir,
        runs["results_dir"],
        runs["work_dir"],
        runs["methods"],
        runs["seeds"],
        [epsilons] if isinstance(epsilons, float) else epsilons,
        alpha,
        pairs,
        _command_line(),
    )


def margin_summary(dataset: str, results_dir: str = "", alpha: float = CONTOUR_ALPHA) -> str:
    """The contour study's summary and README verdicts made again from its ``per_case.csv.gz`` in ``<results_dir>``
    (default ``docs/results/margins/<dataset>``; serves nothing), the README's header kept."""
    return rescore_margins(results_dir or f"docs/results/margins/{dataset}", alpha)


def _margin_runs(dataset: str, results_dir: str, work_dir: str, methods, seeds) -> dict[str, Any]:
    """The contour study's folders (their defaults) and runs, a single method or seed given on the command line
    made a list."""
    return {
        "results_dir": results_dir or f"docs/results/margins/{dataset}",
        "work_dir": work_dir or f"/tmp/calib_monai_margins/{dataset}",
        "methods": [methods] if isinstance(methods, str) else list(methods),
        "seeds": [seeds] if isinstance(seeds, int) else list(seeds),
    }


def margin_figures(
    dataset: str,
    runs_dir: str,
    results_dir: str = "",
    work_dir: str = "",
    methods: Sequence[str] = ("ce_dice", "nacl", "sl1ace"),
    seeds: Sequence[int] = (0, 1),
    epsilon: float = CONTOUR_EPSILON,
    alphas: Sequence[float] = (0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3),
) -> str:
    """The contour study's pictures from its served runs (run ``margins`` first, same ``work_dir``): the test cases'
    coverage against alpha, and one case's contours over its image, in ``<results_dir>`` (default
    ``docs/results/margins/<dataset>``)."""
    runs = _margin_runs(dataset, results_dir, work_dir, methods, seeds)
    return margin_figures_study(
        dataset,
        runs_dir,
        runs["work_dir"],
        runs["results_dir"],
        runs["methods"],
        runs["seeds"],
        float(epsilon),
        [alphas] if isinstance(alphas, float) else alphas,
    )


def posthoc(dataset: str, methods: Sequence[str] = ("ce_dice", "nacl"), **setup: Any) -> str:
    """Temperature scaling and local temperature scaling, fitted on validation, on each method's test volumes."""
    return _run(posthoc_study, "posthoc", StudySetup(dataset, **setup), methods)


def logit_epochs(
    dataset: str, methods: Sequence[str] = ("ce_dice", "nacl"), snapshots: Sequence[int] = (1, 2, 4), **setup: Any
) -> str:
    """Max-logit histograms of validation voxels after the ``snapshots`` epochs and the last one."""
    return _run(logit_epochs_study, "logit_epochs", StudySetup(dataset, **setup), methods, snapshots)


COMMANDS = {
    "main": main,
    "noise": noise,
    "data_fraction": data_fraction,
    "nacl_ablation": nacl_ablation,
    "crac_vs_nacl": crac_vs_nacl,
    "crac_ablation": crac_ablation,
    "calibrated": calibrated,
    "quality": quality,
    "site": site,
    "site_tables": site_tables,
    "margins": margins,
    "margin_figures": margin_figures,
    "margin_summary": margin_summary,
    "posthoc": posthoc,
    "logit_epochs": logit_epochs,
}


def run() -> None:
    """Entry point of ``scripts/experiments.py``."""
    import fire

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fire.Fire(COMMANDS, name="experiments.py")
