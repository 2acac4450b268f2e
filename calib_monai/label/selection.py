"""Which unlabelled image to label next, from each image's case score and pooled network features (NumPy and SciPy).

``next_to_label`` follows TypiClust (Hacohen, Dekel and Weinshall, "Active learning on a budget: opposite strategies
suit high and low budgets", ICML 2022): with few labels, typical examples teach a model more than uncertain ones,
which are often outliers. The pool (labelled and unlabelled images) is clustered into labels + 1 parts with k-means
on standardised features; the largest part without a label is taken and, in it, the most typical image
(typicality: the inverse of the mean distance to the K = 20 nearest neighbours, here within the part). With
``by_score`` the case score decides instead, among the part's more typical half: the least confident image like many
others. A part of one image is an outlier: while the largest part without a label is one image, the pool is split
finer.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist

__all__ = ["kmeans", "next_to_label", "standardized", "typicality"]

MAX_SPLITS = 10  # how many more parts than labels + 1 are tried before every candidate is taken as one part


def standardized(features: np.ndarray) -> np.ndarray:
    """Each column shifted to mean 0 and scaled to spread 1 over the rows; constant columns are dropped."""
    x = np.asarray(features, dtype=np.float64)
    spread = x.std(axis=0)
    keep = spread > 1e-12 * max(1.0, float(np.abs(x).max(initial=0.0)))
    return (x[:, keep] - x[:, keep].mean(axis=0)) / spread[keep]


def kmeans(x: np.ndarray, k: int, seed: int = 0, iterations: int = 100) -> np.ndarray:
    """The cluster of each row of ``x`` under Lloyd's k-means with k-means++ seeding (``seed``): ``(n,)`` ints in
    ``[0, k)``. Fewer clusters when the rows have fewer distinct values than ``k``."""
    x = np.asarray(x, dtype=np.float64)
    rng = np.random.default_rng(seed)
    centres = [x[rng.integers(len(x))]]
    while len(centres) < k:
        nearest = cdist(x, np.asarray(centres), "sqeuclidean").min(1)
        if nearest.sum() <= 0:
            break
        centres.append(x[rng.choice(len(x), p=nearest / nearest.sum())])
    centres = np.asarray(centres)
    assigned = np.full(len(x), -1)
    for _ in range(iterations):
        new = cdist(x, centres, "sqeuclidean").argmin(1)
        if (new == assigned).all():
            break
        assigned = new
        for j in range(len(centres)):
            if (assigned == j).any():  # an emptied cluster keeps its centre
                centres[j] = x[assigned == j].mean(0)
    return assigned


def typicality(x: np.ndarray, neighbours: int = 20) -> np.ndarray:
    """TypiClust's typicality of each row: 1 / the mean Euclidean distance to its ``neighbours`` nearest other rows
    (all others when there are fewer); inf for a row with that many exact copies."""
    x = np.asarray(x, dtype=np.float64)
    k = min(int(neighbours), len(x) - 1)
    if k < 1:
        return np.ones(len(x))
    distance = cdist(x, x)
    np.fill_diagonal(distance, np.inf)
    mean = np.sort(distance, axis=1)[:, :k].mean(1)
    with np.errstate(divide="ignore"):
        return 1.0 / mean


def next_to_label(
    scores: np.ndarray,
    features: np.ndarray,
    labelled: np.ndarray | None = None,
    seed: int = 0,
    by_score: bool = False,
) -> int:
    """The index of the candidate to label next (see the module).

    Args:
        scores: ``(n,)`` the candidates' case scores (estimated mean DSC; NaN: unscored, taken last).
        features: ``(n, d)`` the candidates' pooled network features, all from the weights that scored them.
        labelled: ``(m, d)`` the labelled images' features from the same weights (None or ``m = 0``: none yet).
        seed: the k-means seeding.
        by_score: the least confident of the part's more typical half; False (default): the part's most typical
            image, as TypiClust takes it (the scores only break ties).
    """
    scores = np.asarray(scores, dtype=np.float64)
    features = np.asarray(features, dtype=np.float64)
    width = features.shape[-1] if features.ndim else 0
    labelled = np.zeros((0, width)) if labelled is None else np.asarray(labelled, dtype=np.float64)
    shapes_agree = features.ndim == 2 and len(features) == len(scores) and labelled.shape[1:] == (width,)
    if scores.ndim != 1 or not shapes_agree:
        raise ValueError(
            f"next_to_label: scores {scores.shape}, features {features.shape} and labelled "
            f"{labelled.shape} must be (n,), (n, d) and (m, d)"
        )
    if not len(scores):
        raise ValueError("next_to_label: no candidates")
    if not (np.isfinite(features).all() and np.isfinite(labelled).all()):
        raise ValueError("next_to_label: the features hold NaN or Inf; score the images again")
    order = np.where(np.isnan(scores), np.inf, scores)
    x = standardized(np.concatenate([features, labelled]))
    if x.shape[1] == 0:  # every image alike: the case score alone decides
        return int(np.argmin(order))
    n, part = len(scores), np.arange(len(scores))  # all candidates unless a part without a label has two or more
    for k in range(len(labelled) + 1, min(len(x), len(labelled) + 1 + MAX_SPLITS) + 1):
        assigned = kmeans(x, k, seed=seed)
        sizes = np.bincount(assigned)
        open_parts = sorted(set(assigned[:n].tolist()) - set(assigned[n:].tolist()), key=lambda j: (-sizes[j], j))
        if not open_parts:
            break
        if sizes[open_parts[0]] > 1:  # a part of one image is an outlier, not a part: else split finer
            part = np.flatnonzero(assigned[:n] == open_parts[0])
            break
    typical = typicality(x[part])  # within the part: its dense core, not the pool's centre
    rank = dict(zip(part.tolist(), typical.tolist()))
    if not by_score:
        return int(min(part, key=lambda i: (-rank[i], order[i], i)))
    chosen = part[typical >= np.median(typical)]
    return int(min(chosen, key=lambda i: (order[i], -rank[i], i)))  # equal scores: the more typical first
