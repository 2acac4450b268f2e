"""Rankings of methods over a table of results: sum-rank, mean-case-rank and Friedman rank.

Ranks are 1 for the best method; ties get the average of the ranks they span (``scipy.stats.rankdata``, "average").
``higher_is_better`` says, per metric, which direction wins (DSC: True; HD, ASD, ECE, CECE, TACE: False).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata

__all__ = ["sum_rank", "mean_case_rank", "friedman_rank", "rank_methods"]


def rank_methods(scores: np.ndarray, higher_is_better: bool | Sequence[bool]) -> np.ndarray:
    """Ranks of methods (axis 0) for every column of ``scores (methods, metrics)``; 1 = best, ties averaged.

    NaN scores (a method without a value) rank last.

    >>> scores = [[0.90, 0.05], [0.80, 0.02], [0.85, 0.03]]  # 3 methods x (DSC: higher better, ECE: lower)
    >>> rank_methods(scores, [True, False]).tolist()
    [[1.0, 3.0], [3.0, 1.0], [2.0, 2.0]]
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores must be a (methods, metrics) table, got shape {scores.shape}.")
    flags = np.broadcast_to(np.asarray(higher_is_better, dtype=bool), (scores.shape[1],))
    signed = scores * np.where(flags, -1.0, 1.0)[None, :]
    signed = np.where(np.isnan(signed), np.inf, signed)
    return rankdata(signed, method="average", axis=0)


def sum_rank(scores: np.ndarray, higher_is_better: bool | Sequence[bool]) -> np.ndarray:
    """Sum over metrics of each method's rank per metric (MRBrainS, Mendrik et al., Comput Intell Neurosci 2015;
    MbLS Sec. 5): ``scores (methods, metrics)`` of mean values -> ``(methods,)``; lower is better.

    >>> scores = [[0.90, 0.05], [0.80, 0.02], [0.85, 0.03]]  # 3 methods x (DSC: higher better, ECE: lower)
    >>> sum_rank(scores, [True, False]).tolist()  # 1 + 3, 3 + 1, 2 + 2
    [4.0, 4.0, 4.0]
    """
    return rank_methods(scores, higher_is_better).sum(axis=1)


def mean_case_rank(case_scores: np.ndarray, higher_is_better: bool | Sequence[bool]) -> np.ndarray:
    """Mean-case-rank (ISLES, Maier et al., MedIA 2017; MbLS Sec. 5): for each case rank the methods on every
    metric, average those ranks over the metrics (the method's rank for that case), then average over cases.

    ``case_scores (methods, cases, metrics)`` -> ``(methods,)``; lower is better.

    >>> case_scores = [[[0.9], [0.7]], [[0.8], [0.8]]]  # 2 methods, 2 cases, DSC
    >>> mean_case_rank(case_scores, True).tolist()  # case 1: (1, 2), case 2: (2, 1)
    [1.5, 1.5]
    """
    case_scores = np.asarray(case_scores, dtype=np.float64)
    if case_scores.ndim != 3:
        raise ValueError(f"case_scores must be (methods, cases, metrics), got shape {case_scores.shape}.")
    per_case = [rank_methods(case_scores[:, c, :], higher_is_better).mean(axis=1) for c in range(case_scores.shape[1])]
    return np.mean(per_case, axis=0)


def friedman_rank(scores: np.ndarray, higher_is_better: bool | Sequence[bool]) -> np.ndarray:
    """Friedman rank (Friedman, JASA 1937; CRaC Appendix B): ``1/m sum_i rank_i`` over the m evaluation settings
    (metric x dataset columns of ``scores (methods, m)``) -> ``(methods,)``; lower is better.

    >>> scores = [[0.90, 0.05], [0.80, 0.02], [0.85, 0.03]]  # 3 methods x (DSC: higher better, ECE: lower)
    >>> friedman_rank(scores, [True, False]).tolist()  # (1 + 3) / 2, (3 + 1) / 2, (2 + 2) / 2
    [2.0, 2.0, 2.0]
    """
    return rank_methods(scores, higher_is_better).mean(axis=1)
