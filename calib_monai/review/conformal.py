"""The review rule's ranks and robust distances of the ``n + 1`` cases, symmetric functions of the ``n + 1`` so that
exchangeable cases keep the full-conformal guarantee (:mod:`calib_monai.review.rule`)."""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "TIE_TOLERANCE",
    "at_least",
    "combined_scores",
    "competition_ranks",
    "draw_bound",
    "flag_rank",
    "standardised",
    "subject_maxima",
]

#: Two nonconformities this close (relative; absolute below 1) are a tie: the same image measured twice on a GPU
#: differs in the 12th digit (float sums in another order), which must not move its rank.
TIE_TOLERANCE = 1e-9


def flag_rank(alpha: float, m: int) -> int:
    """``k = floor(alpha (m + 1))``, rounding-safe: a rule over ``m`` validation subjects flags the ``k`` most extreme
    of the ``m + 1`` (0: it cannot flag at this alpha)."""
    return math.floor(alpha * (m + 1) + 1e-9)


def _slack(a: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(a), TIE_TOLERANCE * np.maximum(1.0, np.abs(a)), 0.0)


def at_least(a: np.ndarray, b: float) -> np.ndarray:
    """``a >= b`` with values within :data:`TIE_TOLERANCE` of ``b`` counted as equal (an infinite ``b`` exactly)."""
    b64 = np.float64(b)
    return np.asarray(a, dtype=np.float64) >= b64 - _slack(b64)


def competition_ranks(nonconformity: np.ndarray) -> np.ndarray:
    """``1 + #{m: a_m > a_i}`` for each ``a_i``: rank 1 is the most extreme (largest), ties (within
    :data:`TIE_TOLERANCE`) share the smaller rank."""
    a = np.asarray(nonconformity, dtype=np.float64)
    return 1 + (a[None, :] > (a + _slack(a))[:, None]).sum(1)


def standardised(nonconformity: np.ndarray) -> np.ndarray:
    """How far each ``a_i`` lies beyond the others: ``(a_i - median_{m != i} a_m) / (1.4826 MAD_{m != i})`` (the
    others' standard deviation when their MAD is 0, else a tiny scale), over the others' finite values; ``+inf``
    stays ``+inf``. Each value is measured against the other ``n``: a symmetric function of the ``n + 1``."""
    a = np.asarray(nonconformity, dtype=np.float64)
    out = np.empty(len(a))
    for i in range(len(a)):
        others = np.delete(a, i)
        others = others[np.isfinite(others)]
        median = float(np.median(others)) if others.size else 0.0
        scale = 1.4826 * float(np.median(np.abs(others - median))) if others.size else 0.0
        if scale <= 0 and others.size > 1:
            scale = float(others.std())
        out[i] = (a[i] - median) / (scale if scale > 0 else 1e-12)
    return out


def combined_scores(values: dict[str, np.ndarray], size: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Each signal's :func:`standardised` nonconformities of the ``size`` cases and the combined score, their
    largest per case (``-inf`` where no signal judges)."""
    z = {name: standardised(a) for name, a in values.items()}
    return z, np.max(np.stack([*z.values(), np.full(size, -np.inf)]), axis=0)


def subject_maxima(combined: np.ndarray, subject_of: np.ndarray, m: int) -> np.ndarray:
    """Each of the ``m`` subjects' most extreme ``combined`` score over its volumes (``subject_of``: each volume's)."""
    most = np.full(m, -np.inf)
    np.maximum.at(most, subject_of, combined)
    return most


def draw_bound(k: int, m: int, confidence: float = 0.9) -> float:
    """The ``confidence`` quantile of ``Beta(k, m + 1 - k)``, the flag rate of ordinary cases given the validation draw
    of a rule flagging the ``k`` most extreme of ``m + 1`` (``ValidatedRange.draw_bound``)."""
    from scipy.stats import beta  # scipy on first use: the serving path imports this module

    return float(beta.ppf(confidence, k, m + 1 - k))
