"""The case score's level from labelled cases the served model did not train on: a lower bound on every served
estimate, its level set by the validation volumes, re-anchored once the site has labels.

An error is a labelled case's served case score minus the true mean DSC of its delivered segmentation
(``info.case_score_error.per_volume``; or a site label's).

* **Lower bound**: each of the ``m`` validation subjects counts with its largest error; with
  ``k = ceil((m + 1)(1 - alpha))`` a case of a new exchangeable subject has a true DSC of at least ``score - e_(k)``
  with probability at least ``1 - alpha`` (split conformal, one-sided; Vovk et al. 2005); none when ``k > m``.
* **Level** (no site labels yet): the score minus the validation volumes' mean error; the bound does not move.
* **Re-anchored** (``n >= SITE_LABELS_MIN`` site labels): the score minus the site labels' mean error; its bound is
  the conformal one on the site errors alone when ``n`` suffices, else the validation errors' spread about their
  mean plus the site mean's one-sided Student-t margin (it assumes the site moves the level, not the spread).

Validation volumes that are site labels (a fine-tune's held-out labels, ``info.site_volumes``) count as site labels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calib_monai.defaults import CASE_SCORE_BOUND_ALPHA, SITE_LABELS_MIN

__all__ = ["CaseScoreAnchor", "conformal_upper_error"]


def conformal_upper_error(errors: Sequence[float], alpha: float) -> float | None:
    """``e_(k)``, ``k = ceil((m + 1)(1 - alpha))``, of ``m`` exchangeable errors: a new error stays at most this with
    probability at least ``1 - alpha``; None when ``k > m`` (too few)."""
    values = np.sort(np.asarray([e for e in errors if math.isfinite(e)], dtype=np.float64))
    k = math.ceil((len(values) + 1) * (1 - alpha) - 1e-9)
    return float(values[k - 1]) if 1 <= k <= len(values) else None


def subjects_needed(alpha: float) -> int:
    """The fewest exchangeable errors with ``k <= m``: ``ceil((1 - alpha) / alpha)``."""
    return math.ceil((1 - alpha) / alpha - 1e-9)


@dataclass(frozen=True)
class CaseScoreAnchor:
    """The errors of the labelled cases like a served one, and what they say of its case score.

    Args:
        subject_errors: each validation subject's largest error (NaN: none measured).
        site_errors: the site's labelled cases' errors (not trained on).
        alpha: one minus the lower bound's coverage.
        validation_error: the validation volumes' mean error (site volumes left out): the level without site labels.
    """

    subject_errors: tuple[float, ...] = ()
    site_errors: tuple[float, ...] = ()
    alpha: float = CASE_SCORE_BOUND_ALPHA
    validation_error: float = 0.0

    @classmethod
    def from_range(cls, validated: Any, site_errors: Sequence[float] = (), alpha: float = CASE_SCORE_BOUND_ALPHA):
        """From a :class:`~calib_monai.review.ValidatedRange` (its stored per-volume errors and subjects; its site
        volumes join ``site_errors``)."""
        info = getattr(validated, "info", None) or {}
        per_volume = (info.get("case_score_error") or {}).get("per_volume")
        if per_volume is None or validated is None or len(per_volume) != validated.n:
            return cls((), tuple(site_errors), alpha)
        errors = np.array([math.nan if e is None else float(e) for e in per_volume])
        site = set(info.get("site_volumes") or [])
        worst: dict[int, float] = {}
        for i, (subject, error) in enumerate(zip(validated.subject_of, errors)):
            if i not in site and math.isfinite(error):
                worst[int(subject)] = max(worst.get(int(subject), -math.inf), float(error))
        ranged_site = [float(errors[i]) for i in sorted(site) if math.isfinite(errors[i])]
        validation = [float(e) for i, e in enumerate(errors) if i not in site and math.isfinite(e)]
        level = float(np.mean(validation)) if validation else 0.0
        return cls(tuple(worst.values()), (*ranged_site, *map(float, site_errors)), alpha, level)

    @property
    def anchored(self) -> bool:
        return len(self.site_errors) >= SITE_LABELS_MIN

    @property
    def offset(self) -> float:
        """What re-anchoring adds to the served score: minus the site labels' mean error, or without enough of them
        minus the validation volumes'."""
        return -float(np.mean(self.site_errors)) if self.anchored else -self.validation_error

    def margin(self) -> tuple[float | None, str]:
        """``(how far below the estimate the bound lies, how it was made)``; None and what it lacks when none."""
        needed = subjects_needed(self.alpha)
        if self.anchored and len(self.site_errors) >= needed:
            return conformal_upper_error(self.site_errors, self.alpha) + self.offset, (
                f"{len(self.site_errors)} site labels"
            )
        upper = conformal_upper_error(self.subject_errors, self.alpha)
        if upper is None:
            return None, (
                f"no lower bound at {1 - self.alpha:.0%}: it needs the errors of {needed} labelled validation subjects "
                f"(or site labels), the range has {len(self.subject_errors)} (run calibrate again with more)"
            )
        if not self.anchored:  # the bound stays the score minus the conformal error: the level moves, not the bound
            return upper + self.offset, f"{len(self.subject_errors)} validation subjects"
        from scipy.stats import t

        n = len(self.site_errors)
        spread = upper - float(np.mean(self.subject_errors))
        level = float(t.ppf(1 - self.alpha, n - 1) * np.std(self.site_errors, ddof=1) / math.sqrt(n))
        return spread + level, (
            f"{n} site labels for the level and {len(self.subject_errors)} validation subjects for the spread "
            "(assumes the site moves the level, not the spread)"
        )

    def answer(self, score: float | None) -> dict[str, Any]:
        """The served estimate and its lower bound for a raw case score: ``{"case_score", "case_score_low",
        "coverage", "from", "site_labels", "offset", "raw_case_score"}`` (None where undefined)."""
        margin, made_from = self.margin()
        if 0 < len(self.site_errors) < SITE_LABELS_MIN:
            made_from += f"; not re-anchored: {len(self.site_errors)} site label(s), it needs {SITE_LABELS_MIN}"
        if not self.anchored and self.validation_error:
            made_from += f"; level: minus the validation volumes' mean error ({self.validation_error:+.3f})"
        finite = score is not None and math.isfinite(float(score))
        estimate = min(1.0, max(0.0, float(score) + self.offset)) if finite else None
        low = min(estimate, max(0.0, float(score) + self.offset - margin)) if finite and margin is not None else None
        return {
            "case_score": estimate,
            "case_score_low": low,
            "coverage": 1 - self.alpha,
            "from": made_from,
            "site_labels": len(self.site_errors),
            "offset": self.offset,
            "raw_case_score": float(score) if finite else None,
        }


def anchor_quality(quality: Mapping[str, Any], anchor: CaseScoreAnchor) -> dict[str, Any]:
    """``quality`` with its case score re-anchored (by the site labels, else the validation volumes) and
    ``quality["level"]`` (the lower bound and what it comes from); the raw score stays in ``level.raw_case_score``."""
    raw = quality.get("level", {}).get("raw_case_score", quality.get("case_score"))
    level = anchor.answer(raw)
    out = {**quality, "level": level, "case_score_low": level["case_score_low"]}
    if level["case_score"] is not None:
        out["case_score"] = level["case_score"]
    return out
