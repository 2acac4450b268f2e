"""Robustness studies: Gaussian noise on the test images, and smaller shares of the training data."""

from __future__ import annotations

from collections.abc import Sequence

from studies import figures
from studies.evaluation import evaluate_run
from studies.study import StudySetup, format_mean_std, heading, write_table

__all__ = ["data_fraction_study", "noise_study"]

COLUMNS = ("mean_dice", "ece", "cece", "tace")


def _row(label: dict, summary: dict) -> dict:
    return {**label, **{heading(c): format_mean_std(summary[c]["mean"], summary[c]["std"]) for c in COLUMNS}}


def noise_study(
    setup: StudySetup,
    methods: Sequence[str] = ("ce_dice", "nacl"),
    sigmas: Sequence[float] = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05),
    command: str = "",
) -> dict:
    """Evaluate each method's main run with ``N(0, sigma^2)`` added to the preprocessed test images (scaled to
    [0, 1]; the same seeded noise for every method); tables and curves in ``<results_dir>/noise``."""
    methods = setup.check_methods(methods)
    sigmas = [float(s) for s in ([sigmas] if isinstance(sigmas, (int, float)) else sigmas)]
    out = setup.study_dir("noise")
    rows, curves = [], {c: {} for c in COLUMNS}
    for method in methods:
        run = setup.trained(method)
        summaries = [evaluate_run(run, "test", noise_sigma=s, surface_distances=False).summary() for s in sigmas]
        rows += [_row({"method": method, "sigma": s}, summary) for s, summary in zip(sigmas, summaries)]
        for c in COLUMNS:
            curves[c][method] = [summary[c]["mean"] for summary in summaries]
    table = write_table(rows, out / "noise", "Test images with Gaussian noise (mean ± std over test volumes)")
    for c, name in (("ece", "ECE"), ("mean_dice", "mean DSC"), ("tace", "TACE")):
        figures.line_plot(
            sigmas,
            curves[c],
            out / f"noise_{c}.png",
            "noise sigma (images in [0, 1])",
            name,
            f"{setup.dataset}: {name} under test-image noise",
        )
    setup.write_readme(
        "noise",
        f"Noise robustness on {setup.dataset}",
        command or "(called from Python)",
        [table, "Figures: `noise_ece.png`, `noise_mean_dice.png`, `noise_tace.png`."],
        [setup.spec(m) for m in methods],
    )
    return curves


def data_fraction_study(
    setup: StudySetup,
    methods: Sequence[str] = ("ce_dice", "nacl"),
    fractions: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
    command: str = "",
) -> dict:
    """Train each method on the first ``fraction`` of the training cases of the seeded split (nested subsets; the
    validation and test volumes are unchanged) and evaluate on the test volumes; ``<results_dir>/data_fraction``."""
    methods = setup.check_methods(methods)
    fractions = [float(f) for f in ([fractions] if isinstance(fractions, (int, float)) else fractions)]
    out = setup.study_dir("data_fraction")
    rows, specs, curves = [], [], {c: {m: [] for m in methods} for c in COLUMNS}
    for method in methods:
        for fraction in fractions:
            variant = "" if fraction == setup.train_fraction else f"fraction{fraction:g}"
            extra = {"train_fraction": fraction}
            run = setup.trained(method, variant, extra)
            specs.append(setup.spec(method, variant, extra))
            summary = evaluate_run(run, "test", surface_distances=False).summary()
            rows.append(_row({"method": method, "training_cases": f"{fraction:.0%}"}, summary))
            for c in COLUMNS:
                curves[c][method].append(summary[c]["mean"])
    table = write_table(rows, out / "data_fraction", "Share of the training cases (mean ± std over test volumes)")
    for c, name in (("ece", "ECE"), ("mean_dice", "mean DSC")):
        figures.line_plot(
            [100 * f for f in fractions],
            curves[c],
            out / f"data_fraction_{c}.png",
            "training cases (%)",
            name,
            f"{setup.dataset}: {name} against training data",
        )
    setup.write_readme(
        "data_fraction",
        f"Training-data size on {setup.dataset}",
        command or "(called from Python)",
        [table, "Figures: `data_fraction_ece.png`, `data_fraction_mean_dice.png`."],
        specs,
    )
    return curves
