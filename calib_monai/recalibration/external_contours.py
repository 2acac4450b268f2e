"""The contours of ``calib-monai calibrate-probabilities``: each structure's inner and outer contour of every evaluated
case, with the guarantee of :mod:`calib_monai.review.contours`.

The lambdas are chosen on the calibration set, each fit case its own subject, cross-fitted as the bundles'
``calibrate`` does (2 seeded folds, each scored with the temperature fitted on the other); the evaluated cases are
scaled by the temperature of all fit cases: cross-conformal, approximate. Without a calibration set the lambdas are
null and say why. Written under ``<output_dir>/contours/``: ``<case>_inner.nii.gz`` / ``<case>_outer.nii.gz`` as
``inferring`` writes them, in the label file's geometry (when a structure has lambdas), ``contours.json``
(:meth:`~calib_monai.review.contours.ContourMargins.record`) and ``contours.csv`` (:data:`COLUMNS`).
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch

from calib_monai.atomic import save_atomically, write_json_atomically, write_text_atomically
from calib_monai.defaults import CONTOUR_ALPHA, CONTOUR_EPSILON, CONTOUR_RISK, CROSSFIT_FOLDS
from calib_monai.geometry import reorient, reorientation
from calib_monai.recalibration.readers import CaseFiles, Volume, read_case
from calib_monai.recalibration.splits import split_volumes
from calib_monai.recalibration.temperature import temperature_scale
from calib_monai.review.contours import (
    CONTOURS_FILE,
    ContourMargins,
    contour_losses,
    contour_masks,
    volume_requirements,
)

__all__ = ["COLUMNS", "CONTOURS_FOLDER", "ContourWriter", "choose_contours"]

logger = logging.getLogger("calib_monai")
CONTOURS_FOLDER = "contours"
#: ``contours.csv``: ``counted`` is False where the structure is in neither the label nor the prediction (the
#: guarantee and the coverage leave such a case out); the contour columns are empty for a structure without lambdas
COLUMNS = (
    "case",
    "structure",
    "counted",
    "inner_ml",
    "predicted_ml",
    "outer_ml",
    "true_ml",
    "outer_holds",
    "inner_inside",
    "outer_missed",
    "inner_outside",
)
NO_FIT_SET = (
    "no calibration set (--fit_predictions/--fit_labels): lambdas chosen on the evaluated cases would vouch for "
    "nothing (in-sample); give a calibration set to get contours"
)


def choose_contours(
    fit_cases: Sequence[CaseFiles],
    fit_temperature: Callable[[Sequence[CaseFiles]], float],
    class_names: Sequence[str],
    alpha: float = CONTOUR_ALPHA,
    epsilon: float = CONTOUR_EPSILON,
    risk: str = CONTOUR_RISK,
    seed: int = 0,
    device: str = "cpu",
    **info: Any,
) -> ContourMargins:
    """The lambdas of each foreground class, chosen on ``fit_cases`` cross-fitted in 2 folds (each fold's temperature
    from ``fit_temperature(cases)``); ``class_names``: background first; ``info`` goes to the record. One fit case
    cannot be cross-fitted: null lambdas."""
    names = list(class_names)
    volumes: list[dict[str, Any]] = []
    subjects: list[str] = []
    folds = []
    if len(fit_cases) >= 2:
        split = split_volumes(len(fit_cases), seed=seed, crossfit=True, folds=CROSSFIT_FOLDS)
        for fit_indices, scored in split.folds:
            temperature = fit_temperature([fit_cases[i] for i in fit_indices])
            folds.append(
                {
                    "fit": [fit_cases[i].name for i in fit_indices],
                    "scored": [fit_cases[i].name for i in scored],
                    "temperature": temperature,
                }
            )
            for i in scored:
                volume = read_case(fit_cases[i])
                prob = temperature_scale(torch.from_numpy(volume.probabilities).to(device), temperature)
                volumes.append(volume_requirements(prob, torch.from_numpy(volume.label), epsilon, names))
                subjects.append(fit_cases[i].name)
                del volume, prob
    else:  # the library's reason, with the 0 subjects measured
        volumes, subjects = [dict.fromkeys(names[1:])], [fit_cases[0].name if fit_cases else ""]
        info["note"] = f"{len(fit_cases)} fit case(s): cross-fitting needs at least 2, no requirement was measured"
    chosen_on = (
        f"the {len(fit_cases)} fit cases, each its own subject, temperature-scaled by the temperature of the fold "
        f"that did not see it ({CROSSFIT_FOLDS}-fold cross-fitting, seed {seed}); the evaluated cases are scaled by "
        "the temperature fitted on all fit cases: cross-conformal, approximate"
    )
    return ContourMargins.from_validation(
        volumes, subjects, alpha, epsilon, risk, chosen_on=chosen_on, folds=folds, **info
    )


def unchosen_contours(
    class_names: Sequence[str], alpha: float, epsilon: float, risk: str, **info: Any
) -> ContourMargins:
    """Null lambdas for every foreground class, with :data:`NO_FIT_SET` as the reason (in-sample)."""
    entry = {"lambda_out": None, "lambda_in": None, "rank": None, "subjects": 0, "reason": NO_FIT_SET}
    classes = {name: dict(entry) for name in list(class_names)[1:]}
    return ContourMargins(classes, alpha, epsilon, risk, {"chosen_on": None, **info})


class ContourWriter:
    """Writes each evaluated case's contours (:meth:`add`) to ``folder``, then (:meth:`finish`) ``contours.csv``,
    ``contours.json`` and the coverage in the log."""

    def __init__(self, margins: ContourMargins, class_names: Sequence[str], folder: Path) -> None:
        self.margins, self.folder = margins, Path(folder)
        self.names = list(class_names)[1:]
        self.vouched = [n for n in self.names if (margins.classes.get(n) or {}).get("lambda_out") is not None]
        self.vouched = [n for n in self.vouched if margins.classes[n].get("lambda_in") is not None]
        self.rows: list[dict[str, Any]] = []

    def add(self, case: CaseFiles, volume: Volume, prob: torch.Tensor) -> None:
        """The contour files and rows of one case from its calibrated probabilities ``prob`` ``(C, x, y, z)``."""
        voxel_ml = float(abs(np.linalg.det(volume.affine[:3, :3]))) / 1000.0
        pred = prob.argmax(0).cpu().numpy()
        if self.vouched:
            inner, outer = (m.cpu().numpy() for m in contour_masks(prob, self.margins.classes, ["", *self.names]))
            self._write(case, volume, inner, "inner")
            self._write(case, volume, outer, "outer")
        for c, name in enumerate(self.names, start=1):
            truth, predicted = volume.label == c, pred == c
            row: dict[str, Any] = {
                "case": case.name,
                "structure": name,
                "counted": bool(truth.any() or predicted.any()),
                "predicted_ml": float(predicted.sum()) * voxel_ml,
                "true_ml": float(truth.sum()) * voxel_ml,
            }
            if name in self.vouched:
                row.update(inner_ml=float(inner[c - 1].sum()) * voxel_ml, outer_ml=float(outer[c - 1].sum()) * voxel_ml)
                row.update(contour_losses(truth, inner[c - 1], outer[c - 1], self.margins.epsilon))
            self.rows.append(row)

    def _write(self, case: CaseFiles, volume: Volume, mask: np.ndarray, kind: str) -> None:
        """``<case>_<kind>.nii.gz``: ``mask`` ``(S, x, y, z)`` in the label file's voxel order and header."""
        label = nib.load(str(case.label))  # the header only
        data = reorient(mask.astype(np.uint8), reorientation(volume.affine, label.affine), channel_axis=0)
        data = data[0] if data.shape[0] == 1 else np.moveaxis(data, 0, -1)
        image = nib.Nifti1Image(data, label.affine, label.header)
        image.set_data_dtype(np.uint8)
        save_atomically(image, self.folder / f"{case.name}_{kind}.nii.gz", write=lambda i, tmp: nib.save(i, tmp))

    def coverage(self) -> dict[str, dict[str, Any]]:
        """Per structure with lambdas: the counted cases, how many each contour held, the mean missed and outside
        fractions."""
        out = {}
        for name in self.vouched:
            rows = [r for r in self.rows if r["structure"] == name and r["counted"]]
            out[name] = {
                "cases": len(rows),
                "outer_holds": sum(r["outer_holds"] for r in rows),
                "inner_inside": sum(r["inner_inside"] for r in rows),
                "outer_missed": float(np.mean([r["outer_missed"] for r in rows])) if rows else None,
                "inner_outside": float(np.mean([r["inner_outside"] for r in rows])) if rows else None,
            }
        return out

    def finish(self) -> dict[str, dict[str, Any]]:
        """Write ``contours.csv`` and ``contours.json``, log the coverage per structure and return it."""
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, COLUMNS, restval="")
        writer.writeheader()
        writer.writerows(self.rows)
        write_text_atomically(self.folder / "contours.csv", text.getvalue())
        coverage = self.coverage()
        write_json_atomically(self.folder / CONTOURS_FILE, {**self.margins.record(), "coverage": coverage})
        margins, target = self.margins, 1 - self.margins.alpha
        for name in self.names:
            if name not in coverage:
                logger.warning(f"contours of {name}: none ({margins.classes[name].get('reason')})")
            elif not coverage[name]["cases"]:
                logger.info(f"contours of {name}: in neither the labels nor the predictions of the evaluated cases")
            elif margins.risk == "expected":
                c = coverage[name]
                logger.info(
                    f"contours of {name} over {c['cases']} case(s): mean missed fraction of the outer contour "
                    f"{c['outer_missed']:.3g}, mean fraction of the inner outside it {c['inner_outside']:.3g}, "
                    f"against contour_alpha {margins.alpha:g} (expected rate)"
                )
            else:
                c, n = coverage[name], coverage[name]["cases"]
                logger.info(
                    f"contours of {name}: the outer held at least {1 - margins.epsilon:.3g} of the truth in "
                    f"{c['outer_holds']} of {c['cases']} case(s) ({c['outer_holds'] / n:.0%}), the inner lay at least "
                    f"{1 - margins.epsilon:.3g} inside it in {c['inner_inside']} ({c['inner_inside'] / n:.0%}); "
                    f"1 - contour_alpha = {target:.0%}"
                )
        return coverage
