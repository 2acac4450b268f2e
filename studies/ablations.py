"""NACL ablations, CRaC against NACL's lambda, post-hoc temperature scaling, and the max logit over epochs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from calib_monai.defaults import LTS_STEPS
from studies import figures
from studies.comparison import LOGIT_EDGES, LogitStatistics
from studies.evaluation import TrainedRun, evaluate_run
from studies.posthoc import VolumeLocalTemperature, VolumeTemperature
from studies.runs import train
from studies.study import StudySetup, format_mean_std, heading, write_table

__all__ = ["NACL_ABLATIONS", "crac_vs_nacl_study", "logit_epochs_study", "nacl_ablation_study", "posthoc_study"]

COLUMNS = ("mean_dice", "mean_hd95", "ece", "cece", "tace")

# the NACL journal's ablations (Sec. 4.2): one setting changed at a time from lambda 0.1, 3x3 mean prior, L1, logits
NACL_ABLATIONS: dict[str, dict[str, dict]] = {
    "lambda": {f"alpha{a}": {"loss#alpha": a} for a in (0.1, 0.2, 0.3)},
    "prior": {f"prior_{p}": {"loss#kernel_ops": p} for p in ("mean", "svls", "max", "min", "median", "mode")},
    "distance": {f"distance_{d}": {"loss#distance_type": d} for d in ("l1", "l2")},
    "space": {f"space_{s}": {"loss#space": s} for s in ("logits", "softmax")},
    "patch": {f"patch{k}": {"loss#kernel_size": k} for k in (3, 5)},
}
NACL_DEFAULTS = {
    "loss#alpha": 0.1,
    "loss#kernel_ops": "mean",
    "loss#distance_type": "l1",
    "loss#space": "logits",
    "loss#kernel_size": 3,
}


def _cells(summary: dict) -> dict[str, str]:
    return {heading(c): format_mean_std(summary[c]["mean"], summary[c]["std"]) for c in COLUMNS}


def _variant(setup: StudySetup, method: str, name: str, extra: dict, defaults: dict):
    """The main run when ``extra`` is the bundle's default setting, else a variant run."""
    if all(defaults.get(k) == v for k, v in extra.items()):
        return setup.trained(method), setup.spec(method)
    return setup.trained(method, name, extra), setup.spec(method, name, extra)


def nacl_ablation_study(setup: StudySetup, groups: Sequence[str] = tuple(NACL_ABLATIONS), command: str = "") -> str:
    """Train the NACL variants of ``groups`` (keys of ``NACL_ABLATIONS``) and tabulate their test metrics in
    ``<results_dir>/nacl_ablation``; the default setting is the main ``nacl`` run."""
    groups = [groups] if isinstance(groups, str) else list(groups)
    unknown = [g for g in groups if g not in NACL_ABLATIONS]
    if unknown:
        raise ValueError(f"groups must be among {list(NACL_ABLATIONS)}, got {unknown}")
    out = setup.study_dir("nacl_ablation")
    rows, specs = [], []
    for group in groups:
        for name, extra in NACL_ABLATIONS[group].items():
            run, spec = _variant(setup, "nacl", name, extra, NACL_DEFAULTS)
            specs.append(spec)
            rows.append({"ablation": group, "setting": name, **_cells(evaluate_run(run, "test").summary())})
    table = write_table(
        rows, out / "nacl_ablation", "NACL ablations (one setting changed from lambda 0.1, 3x3 mean prior, L1, logits)"
    )
    setup.write_readme(
        "nacl_ablation", f"NACL ablations on {setup.dataset}", command or "(called from Python)", [table], specs
    )
    return table


def crac_vs_nacl_study(setup: StudySetup, lambdas: Sequence[float] = (0.01, 0.1, 0.5, 1.0), command: str = "") -> str:
    """NACL's sensitivity to its lambda against CRaC's learned multipliers (CRaC paper, Fig. 1)."""
    lambdas = [float(a) for a in ([lambdas] if isinstance(lambdas, (int, float)) else lambdas)]
    out = setup.study_dir("crac_vs_nacl")
    rows, specs, curves = [], [], {"NACL": {c: [] for c in COLUMNS}}
    for a in lambdas:
        run, spec = _variant(setup, "nacl", f"alpha{a:g}", {"loss#alpha": a}, NACL_DEFAULTS)
        specs.append(spec)
        summary = evaluate_run(run, "test").summary()
        rows.append({"method": "NACL", "lambda": f"{a:g}", **_cells(summary)})
        for c in COLUMNS:
            curves["NACL"][c].append(summary[c]["mean"])
    crac = evaluate_run(setup.trained("crac"), "test").summary()
    specs.append(setup.spec("crac"))
    rows.append({"method": "CRaC", "lambda": "learned", **_cells(crac)})
    table = write_table(rows, out / "crac_vs_nacl", "NACL for several lambda, CRaC with learned multipliers")
    for c, name in (("ece", "ECE"), ("mean_dice", "mean DSC")):
        series = {"NACL": curves["NACL"][c], "CRaC (learned)": [crac[c]["mean"]] * len(lambdas)}
        figures.line_plot(
            lambdas,
            series,
            out / f"crac_vs_nacl_{c}.png",
            "NACL lambda",
            name,
            f"{setup.dataset}: {name}, NACL lambda vs CRaC",
        )
    setup.write_readme(
        "crac_vs_nacl",
        f"CRaC vs NACL's lambda on {setup.dataset}",
        command or "(called from Python)",
        [table, "Figures: `crac_vs_nacl_ece.png`, `crac_vs_nacl_mean_dice.png`."],
        specs,
    )
    return table


def posthoc_study(
    setup: StudySetup, methods: Sequence[str] = ("ce_dice", "nacl"), command: str = "", lts_steps: int = LTS_STEPS
) -> str:
    """Temperature scaling and local temperature scaling (``lts_steps`` Adam steps) fitted on each method's
    validation volumes, applied to its test volumes; ``<results_dir>/posthoc``."""
    methods = setup.check_methods(methods)
    out = setup.study_dir("posthoc")
    rows = []
    for method in methods:
        run = setup.trained(method)
        validation = list(run.volumes("validation"))
        ts = VolumeTemperature().fit(validation)
        lts = VolumeLocalTemperature(steps=lts_steps).fit(validation)
        del validation
        for name, calibrate in (("none", None), (f"TS (T={ts.temperature:.3f})", ts), ("LTS", lts)):
            rows.append(
                {"method": method, "post-hoc": name, **_cells(evaluate_run(run, "test", calibrate=calibrate).summary())}
            )
    table = write_table(rows, out / "posthoc", "Post-hoc calibration fitted on the validation volumes")
    setup.write_readme(
        "posthoc",
        f"Post-hoc calibration on {setup.dataset}",
        command or "(called from Python)",
        [table],
        [setup.spec(m) for m in methods],
    )
    return table


def logit_epochs_study(
    setup: StudySetup,
    methods: Sequence[str] = ("ce_dice", "nacl"),
    snapshots: Sequence[int] = (1, 2, 4),
    command: str = "",
) -> str:
    """Max-logit histograms of the validation voxels at several epochs (the network of each snapshot epoch and
    of the last epoch); a separate staged run per method (``<bundle>__staged``) with a fixed lr milestone."""
    methods = setup.check_methods(methods)
    if setup.epochs is None or setup.lr_milestone is None:
        raise ValueError(
            "the logit-over-epochs study needs --epochs and --lr_milestone (fixed while the run is "
            "stopped and resumed at each snapshot)"
        )
    snapshots = [int(e) for e in ([snapshots] if isinstance(snapshots, int) else snapshots)]
    out = setup.study_dir("logit_epochs")
    rows, specs = [], []
    for method in methods:
        spec = replace(setup.spec(method, "staged"), snapshots=tuple(snapshots))
        train(spec)
        specs.append(spec)
        histograms = {}
        for epoch in spec.stages():
            run = TrainedRun(spec.run_dir, checkpoint=spec.snapshot_path(epoch).name)
            stats = LogitStatistics(run.num_classes)
            for volume in run.volumes("validation"):
                stats.add(volume)
            histograms[f"epoch {epoch}"] = stats.max_logit_hist
            centres = 0.5 * (LOGIT_EDGES[1:] + LOGIT_EDGES[:-1])
            mean_max = float((stats.max_logit_hist * centres).sum() / max(stats.max_logit_hist.sum(), 1))
            rows.append(
                {
                    "method": method,
                    "epoch": epoch,
                    "mean_max_logit": mean_max,
                    "mean_abs_logit": float(np.nanmean(stats.mean_abs())),
                }
            )
        figures.logit_histograms(
            histograms,
            LOGIT_EDGES,
            out / f"max_logit_{method}.png",
            f"{setup.dataset}, {method}: max logit of validation voxels",
        )
    table = write_table(rows, out / "logit_epochs", "Max logit of the validation voxels over epochs")
    setup.write_readme(
        "logit_epochs",
        f"Logits over epochs on {setup.dataset}",
        command or "(called from Python)",
        [table, "Figures: `max_logit_<method>.png`."],
        specs,
    )
    return table
