"""Calibrate and evaluate anyone's probabilities (``calib-monai calibrate-probabilities``): saved softmax outputs of 3D
segmentations and their labels in, the evaluation report before and after a fitted temperature out.

Inputs: ``"nnunet"``, nnU-Net v2's ``--save_probabilities`` output (:mod:`calib_monai.recalibration.nnunet_files`;
region-based models refused), or ``"nifti"``, ``<case>.nii.gz`` maps ``(x, y, z, C)`` or ``(x, y, z, 1, C)`` on the
label's grid; labels are ``<case>.nii.gz`` in the original geometry, paired by case name.

Output: ``before/`` and ``after/`` (:class:`calib_monai.metrics.SegmentationReportTable`'s files; the argmax is kept,
so ``after/`` repeats the HD95 / ASD), ``comparison.csv`` (``metric, before, after``), ``temperature.json``
(``{"temperature", "fitted_on", "in_sample", "voxels"}``), ``calibrated/`` (``softmax(log(p) / T)`` in the input's
format, with ``write_calibrated``) and ``contours/`` (:mod:`calib_monai.recalibration.external_contours`).

The temperature is fitted on a seeded sample of at most ``max_voxels`` voxels spread evenly over the calibration set,
else over the evaluated cases (the ``after`` numbers are then in-sample, and say so). One volume is in memory at a
time.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from calib_monai.atomic import check_folder, write_json_atomically, write_text_atomically
from calib_monai.bundle.runtime import as_bool
from calib_monai.checks import check_number, check_option
from calib_monai.defaults import CONTOUR_ALPHA, CONTOUR_EPSILON, CONTOUR_RISK, EMPTY_CLASS, MAX_VOXELS, NUM_BINS
from calib_monai.metrics.report_table import SegmentationReportTable
from calib_monai.recalibration import readers
from calib_monai.recalibration.external_contours import (
    CONTOURS_FOLDER,
    NO_FIT_SET,
    ContourWriter,
    choose_contours,
    unchosen_contours,
)
from calib_monai.recalibration.readers import detect_format, label_names_from, match_cases, read_case
from calib_monai.recalibration.temperature import LOG_FLOOR, fit_temperature, sample_voxels, temperature_scale
from calib_monai.review.contours import RISKS

__all__ = ["calibrate_probabilities"]

logger = logging.getLogger("calib_monai")
#: ``comparison.csv`` rows: summary columns (mean over cases) then pooled values.
COMPARED = (
    "ece",
    "cece",
    "tace",
    "ml1ace_gt",
    "ml1ace",
    "cece_all",
    "ece_union",
    "cece_union",
    "tace_union",
    "nll",
    "brier",
    "ece_all",
    "ece_band",
    "mean_dice",
    "est_mean_dice",
)


def _fit(cases: Sequence, max_voxels: int, seed: int) -> tuple[float, int, int]:
    """The temperature of a seeded sample of ``max_voxels`` voxels (an equal share from each case), their count and
    the cases' number of classes."""
    share = max(1, math.ceil(max_voxels / len(cases)))
    logits, labels = [], []
    for i, case in enumerate(cases):
        volume = read_case(case)
        flat = torch.from_numpy(volume.probabilities).reshape(volume.probabilities.shape[0], -1).T
        lg, lb = sample_voxels(flat, torch.from_numpy(volume.label).reshape(-1), share, seed + i)
        logits.append(lg.clamp_min(LOG_FLOOR).log())
        labels.append(lb.clone())
        del volume, flat
    classes = sorted({lg.shape[1] for lg in logits})
    if len(classes) > 1:
        raise ValueError(f"the fitting cases have different numbers of classes: {classes}")
    logits_all, labels_all = torch.cat(logits), torch.cat(labels)
    return fit_temperature(logits_all, labels_all), int(labels_all.numel()), classes[0]


def _resolve(predictions: str | Path, labels: str | Path, fmt: str, ignore_extra_labels: bool) -> list:
    predictions = Path(predictions)
    fmt = detect_format(predictions) if fmt == "auto" else fmt
    return match_cases(predictions, Path(labels), fmt, ignore_extra_labels)


def calibrate_probabilities(
    predictions: str,
    labels: str,
    output_dir: str,
    fit_predictions: str | None = None,
    fit_labels: str | None = None,
    format: str = "auto",  # noqa: A002 - the command-line name
    label_names: dict[str, str] | None = None,
    num_bins: int = NUM_BINS,
    empty_class: str = EMPTY_CLASS,
    surface_distances: bool = True,
    max_voxels: int = MAX_VOXELS,
    seed: int = 0,
    write_calibrated: bool = False,
    ignore_extra_labels: bool = True,
    device: str = "cpu",
    contours: bool = True,
    contour_alpha: float = CONTOUR_ALPHA,
    contour_epsilon: float = CONTOUR_EPSILON,
    contour_risk: str = CONTOUR_RISK,
) -> dict[str, Any]:
    """Evaluate saved probabilities against labels, fit a temperature, evaluate again; write the report.

    Args:
        predictions: folder of <case>.npz files (nnU-Net's --save_probabilities output) or <case>.nii.gz probability
            maps (x, y, z, C).
        labels: folder of <case>.nii.gz label maps in the original image geometry (e.g. nnU-Net's labelsTr); labels
            without a prediction are left out (see ignore_extra_labels).
        output_dir: where before/, after/, comparison.csv, temperature.json (and calibrated/) are written.
        fit_predictions: predictions of a separate calibration set (same format) to fit the temperature on; give
            fit_labels with it. Without them the temperature is fitted on the evaluated cases, so the after numbers
            are in-sample and optimistic (the log and summary.json say so).
        fit_labels: the label folder of fit_predictions (it may be the same labelsTr folder as labels).
        format: "auto" (nnunet when the predictions folder holds .npz files), "nnunet" or "nifti".
        label_names: class names, e.g. {"0": "background", "1": "liver"}; default: the dataset.json beside the
            predictions, else class_<i>.
        num_bins: number of bins of ECE, CECE and TACE (15 in the papers).
        empty_class: "nan" or "papers": the DSC and HD95 of a class absent from a label, as in
            calib_monai.metrics.segmentation_metrics_per_volume.
        surface_distances: False leaves out HD95 and ASD (much faster on large volumes).
        max_voxels: voxels sampled (seeded) to fit the temperature, which bounds its memory.
        seed: seed of that sample.
        write_calibrated: also write the temperature-scaled probabilities to output_dir/calibrated, in the format
            of the input.
        ignore_extra_labels: True (default) evaluates the predicted cases and leaves out labels without a
            prediction, the usual layout (labelsTr against one fold's predictions); False makes them an error.
        device: where the metrics run ("cuda" on a GPU machine).
        contours: False leaves out contours/ (each structure's inner and outer contour of every case).
        contour_alpha: the contours fail for at most this share of cases (risk "per_case").
        contour_epsilon: the share of the structure the outer contour may miss (and of the inner contour that may
            lie outside it).
        contour_risk: "per_case" (the share of cases) or "expected" (the expected missed fraction <= contour_alpha).

    Returns:
        ``{"temperature", "in_sample", "cases", "output_dir", "comparison", "contours"}`` (``contours``: per
        structure with lambdas, how many of the counted cases each contour held; None with contours=False).
    """
    _check_arguments(num_bins, max_voxels, seed, empty_class, contours, contour_alpha, contour_epsilon, contour_risk)
    surface_distances = as_bool(surface_distances, "surface_distances")  # the command line's "false": a string
    write_calibrated = as_bool(write_calibrated, "write_calibrated")
    ignore_extra_labels = as_bool(ignore_extra_labels, "ignore_extra_labels")
    output_dir = check_folder(Path(output_dir), "output_dir")  # not a file (created when the report is written)
    cases = _resolve(predictions, labels, format, ignore_extra_labels)
    if (fit_predictions is None) != (fit_labels is None):
        raise ValueError("give both fit_predictions and fit_labels (a calibration set), or neither")
    fit_cases = cases if fit_predictions is None else _resolve(fit_predictions, fit_labels, format, True)
    overlap = sorted({c.name for c in fit_cases} & {c.name for c in cases})
    in_sample = bool(overlap)
    if fit_predictions is None:
        logger.warning(
            "no calibration set given (--fit_predictions/--fit_labels): the temperature is fitted on "
            f"the {len(cases)} evaluated case(s), so the 'after' numbers are in-sample (optimistic)"
        )
    elif overlap:
        logger.warning(
            f"{len(overlap)} case name(s) are in both the calibration and the evaluated set "
            f"({', '.join(overlap[:10])}): the 'after' numbers are partly in-sample (optimistic)"
        )
    temperature, voxels, fit_classes = _fit(fit_cases, max_voxels, seed)
    fitted_on = [c.name for c in fit_cases]
    logger.info(f"temperature {temperature:.4f} fitted on {voxels} voxels of {len(fit_cases)} case(s)")
    names = label_names or label_names_from(cases[0].probabilities.parent, fit_classes)
    listed = [str(names[k]) for k in sorted(names, key=int)]  # as the report lists them
    if len(listed) != fit_classes:
        raise ValueError(
            f"label_names names {len(listed)} classes ({listed}) but the probabilities have {fit_classes}: give one "
            "name per class, background first"
        )
    writer = None
    if contours:
        options = {"alpha": contour_alpha, "epsilon": contour_epsilon, "risk": contour_risk}
        fit_info = {"temperature": temperature, "fitted_on": fitted_on, "in_sample_cases": overlap}
        if fit_predictions is None:
            logger.warning(f"contours: not vouched for: {NO_FIT_SET}")
            margins = unchosen_contours(listed, **options, **fit_info)
        else:
            fit_one = lambda chosen: _fit(chosen, max_voxels, seed)[0]  # noqa: E731
            margins = choose_contours(fit_cases, fit_one, listed, **options, seed=seed, device=device, **fit_info)
        writer = ContourWriter(margins, listed, output_dir / CONTOURS_FOLDER)

    before = SegmentationReportTable(names, num_bins, empty_class, surface_distances=surface_distances)
    after = SegmentationReportTable(names, num_bins, empty_class, surface_distances=surface_distances)
    for case in cases:
        volume = read_case(case)
        if volume.probabilities.shape[0] != fit_classes:  # a temperature of another model's maps
            raise ValueError(
                f"the fit set {fit_predictions} has {fit_classes} classes but the evaluated set {predictions} has "
                f"{volume.probabilities.shape[0]} (case {case.name}): give --fit_predictions of the same model and "
                "classes as the predictions"
            )
        affine = torch.as_tensor(volume.affine, dtype=torch.float64)
        spacing = [float(v) for v in torch.linalg.norm(affine[:3, :3], dim=0)]  # mm, for HD95 / ASD and volumes
        label = torch.from_numpy(volume.label)[None].to(device)
        prob = torch.from_numpy(volume.probabilities).to(device)
        row = before.add(prob, label, spacing=spacing, case=case.name)
        scaled = temperature_scale(prob, temperature)
        del prob
        after.add(scaled, label, spacing=spacing, case=case.name, same_segmentation_as=row)  # the argmax is unchanged
        if write_calibrated:
            readers.write_calibrated(case, volume, scaled.cpu().numpy(), output_dir / "calibrated")
        if writer is not None:
            writer.add(case, volume, scaled)
        del volume, scaled

    settings = {
        "empty_class": empty_class,
        "foreground": "ground-truth foreground voxels (ece, cece, tace, nll, brier)",
        "predictions": str(predictions),
        "labels": str(labels),
    }
    fit_info = {"temperature": temperature, "fitted_on": fitted_on, "in_sample": in_sample, "voxels": voxels}
    before.write(output_dir / "before", {**settings, "probabilities": "as given"}, logger)
    note = (
        "the temperature was fitted on these cases: in-sample, optimistic"
        if in_sample
        else "the temperature was fitted on a separate calibration set"
    )
    after.write(
        output_dir / "after",
        {
            **settings,
            "probabilities": f"softmax(log(p) / {temperature:.6g})",
            **fit_info,
            "note": note,
            "segmentation": "DSC / HD95 / ASD of before/ (same argmax)",
        },
        logger,
    )
    write_json_atomically(output_dir / "temperature.json", fit_info)
    comparison = _write_comparison(output_dir / "comparison.csv", before, after)
    coverage = writer.finish() if writer is not None else None
    logger.info(
        "before -> after temperature scaling: "
        + ", ".join(
            f"{k} {v['before']:.4f} -> {v['after']:.4f}" for k, v in comparison.items() if k in ("ece", "cece", "nll")
        )
    )
    return {
        "temperature": temperature,
        "in_sample": in_sample,
        "cases": len(cases),
        "output_dir": str(output_dir),
        "comparison": comparison,
        "contours": coverage,
    }


def _write_comparison(path: Path, before, after) -> dict[str, dict[str, float]]:
    """``comparison.csv`` (``metric, before, after``) and its content: means over cases, then pooled values."""
    means = [report.summary() for report in (before, after)]
    pooled = [report.pooled() for report in (before, after)]
    table = {k: {"before": means[0][k]["mean"], "after": means[1][k]["mean"]} for k in COMPARED if k in means[0]}
    table.update({k: {"before": pooled[0][k], "after": pooled[1][k]} for k in pooled[0]})
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(["metric", "before", "after"])
    writer.writerows([k, v["before"], v["after"]] for k, v in table.items())
    write_text_atomically(path, text.getvalue())
    return table


def _check_arguments(num_bins, max_voxels, seed, empty_class, contours, contour_alpha, contour_epsilon, contour_risk):
    """The command's options before any file is read: one line naming the option, its value and the fix."""
    for name, value, low, example in (
        ("num_bins", num_bins, 1, NUM_BINS),
        ("max_voxels", max_voxels, 1, MAX_VOXELS),
        ("seed", seed, 0, 0),
    ):
        try:
            check_number(name, value, low, integer=True)
        except ValueError:
            raise ValueError(
                f"--{name} {value!r} is not valid: it must be a whole number >= {low}; pass e.g. --{name} {example}"
            ) from None
    check_option("--empty_class", empty_class, ("nan", "papers"))
    if not isinstance(contours, bool):
        raise ValueError(f"--contours {contours!r} is not valid: pass --contours=False to leave them out, or nothing")
    for name, value, example in (
        ("contour_alpha", contour_alpha, CONTOUR_ALPHA),
        ("contour_epsilon", contour_epsilon, CONTOUR_EPSILON),
    ):
        try:
            check_number(name, value, 0, 1, low_open=True, high_open=True)
        except ValueError:
            raise ValueError(
                f"--{name} {value!r} is not valid: it must be a number in (0, 1); pass e.g. --{name} {example}"
            ) from None
    check_option("--contour_risk", contour_risk, RISKS)
