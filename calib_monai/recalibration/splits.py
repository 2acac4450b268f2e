"""Which validation volumes fit the recalibration and which measure the validated range, by subject: the volumes of
one patient stay on one side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from calib_monai.checks import check_number
from calib_monai.defaults import CALIBRATION_SPLIT, CROSSFIT_FOLDS

__all__ = ["CROSSFIT_NOTE", "Split", "split_volumes", "subject_names"]


@dataclass
class Split:
    """Which validation volumes fit the served recalibration (``fit``), which are in the range (``range``), and the
    ``folds``: ``(fit, scored)`` pairs, each scored volume scored by a recalibration fitted on its fold's ``fit``."""

    fit: list[int]
    range: list[int]
    rule: str
    in_sample: bool = False
    folds: list[tuple[list[int], list[int]]] = field(default_factory=list)
    crossfit: bool = False

    def __post_init__(self) -> None:
        if not self.folds:
            self.folds = [(list(self.fit), list(self.range))]

    def record(self, volumes: Sequence[Any]) -> dict[str, Any]:
        """The split by the volumes' ``case`` names (``ValidationVolume``)."""
        names = [v.case for v in volumes]
        return {
            "rule": self.rule,
            "in_sample": self.in_sample,
            "crossfit": self.crossfit,
            "fit_volumes": [names[i] for i in self.fit],
            "range_volumes": [names[i] for i in self.range],
            "folds": [{"fit": [names[i] for i in f], "scored": [names[i] for i in r]} for f, r in self.folds],
            **({"exchangeability": CROSSFIT_NOTE} if self.crossfit else {}),
        }


CROSSFIT_NOTE = (
    "approximate: each range volume is scored by a recalibration fitted on the other folds of the validation volumes, "
    "and a served case's case score is compared with it as that fold scores the case (cross-conformal, Vovk 2015; "
    "jackknife+, Barber et al. 2021): the whole validation set sets the threshold, at the cost of exact "
    "exchangeability"
)


def subject_names(subjects: Sequence[str]) -> list[str]:
    """Each volume's subject; a volume without one (``""``) is its own (``"volume <i>"``)."""
    return [subject or f"volume {i}" for i, subject in enumerate(subjects)]


def split_volumes(
    n: int,
    fit_share: float = CALIBRATION_SPLIT,
    seed: int = 0,
    crossfit: bool = False,
    subjects: Sequence[str] = (),
    folds: int = CROSSFIT_FOLDS,
) -> Split:
    """A seeded split of ``n`` validation volumes by subject (``subjects``; ``()``: each volume its own). ``crossfit``:
    the ``m`` subjects in ``folds`` near-equal groups, each scored by the fit on the others, all ``n`` in the range.
    Else ``round(fit_share * m)`` subjects (1 to ``m - 1``) fit and the others measure the range. One subject, or
    ``fit_share`` 0, does both (``in_sample``)."""
    if n < 1:
        raise ValueError("the calibrate step saw no validation volume: check the data set's validation split")
    if not 0 <= float(fit_share) < 1:
        raise ValueError(
            f"calibration_split must be in [0, 1) (the share of validation volumes that fit), got {fit_share}"
        )
    folds = check_number("calibration_folds", folds, low=2, integer=True)
    names = subject_names(subjects or [""] * n)
    if len(names) != n:
        raise ValueError(f"split_volumes: {len(names)} subjects for {n} validation volumes; give one per volume")
    groups = list(dict.fromkeys(names))  # in order of first appearance: one volume each keeps the volume order
    m, unit = len(groups), "volumes" if len(groups) == n else f"subjects ({n} volumes)"
    if m == 1 or float(fit_share) == 0:
        why = ("1 validation volume" if n == 1 else "1 validation subject") if m == 1 else "calibration_split 0"
        return Split(list(range(n)), list(range(n)), f"none ({why}): the same volumes fit and measure", True)
    order = torch.randperm(m, generator=torch.Generator().manual_seed(int(seed))).tolist()

    def volumes_of(chosen: Sequence[int]) -> list[int]:
        keep = {groups[g] for g in chosen}
        return [i for i, name in enumerate(names) if name in keep]

    if crossfit:
        if folds > m:  # a fold without a subject: refused rather than run with fewer folds than recorded
            raise ValueError(
                f"calibration_folds {folds} is more than the {m} validation {unit}: each fold needs a subject; set "
                f"--calibration_folds {m} or less (or validate on more subjects)"
            )
        k = folds
        bounds = [-(-i * m // k) for i in range(k + 1)]  # ceil(i m / k): the first folds take the remainder
        groups_of = [volumes_of(order[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
        # fold i scores group i + 1 (2 folds: A fits and B is scored, then the reverse)
        scored_of = groups_of[1:] + groups_of[:1]
        pairs = [(sorted(set(range(n)) - set(scored)), scored) for scored in scored_of]
        sizes = " and ".join([", ".join(str(len(g)) for g in groups_of[:-1]), str(len(groups_of[-1]))])
        parts = f"halves of {sizes} volumes, each" if k == 2 else f"folds of {sizes} volumes, each"
        rule = (
            f"{k}-fold cross-fitting of the validation {unit} (seed {seed}): {parts} scored by the recalibration "
            f"fitted on the other{'' if k == 2 else 's'}; all {n} measure the range; the served recalibration is "
            f"fitted on all {n}"
        )
        return Split(list(range(n)), list(range(n)), rule, folds=pairs, crossfit=True)
    k = min(m - 1, max(1, round(float(fit_share) * m)))
    fit, measured = volumes_of(order[:k]), volumes_of(order[k:])
    rule = (
        f"seeded split of the validation {unit} (seed {seed}): {len(fit)} volumes fit the recalibration, "
        f"{len(measured)} measure the range"
    )
    return Split(fit, measured, rule)
