"""How far a case's pooled network features (:mod:`calib_monai.metrics.network_features`) lie from the reference
cases': the shift a case score cannot see. :class:`MahalanobisDistance` (Lee et al., NeurIPS 2018; for segmentation
González et al., MedIA 2022) with Ledoit & Wolf's shrinkage (J. Multivariate Anal. 2004), on the reference's leading
``max_dim`` principal components.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from calib_monai.defaults import FEATURE_DIM

__all__ = [
    "MahalanobisDistance",
    "feature_distance_from_dict",
    "ledoit_wolf_covariance",
    "ledoit_wolf_precision",
    "mahalanobis",
]


def ledoit_wolf_covariance(x: np.ndarray) -> tuple[np.ndarray, float]:
    """The Ledoit-Wolf shrunk covariance of the rows of ``x`` (n, p) and its shrinkage ``s``:
    ``(1 - s) S + s m I`` with ``S`` the maximum-likelihood covariance (divisor ``n``), ``m = tr(S) / p``,
    ``s = min(b2, d2) / d2``, ``d2 = ||S - m I||_F^2``, ``b2 = sum_k ||x_k x_k^T - S||_F^2 / n^2`` (centred rows)."""
    x = np.asarray(x, dtype=np.float64)
    n, p = x.shape
    xc = x - x.mean(0)
    s = xc.T @ xc / n
    m = np.trace(s) / p
    d2 = float(np.sum((s - m * np.eye(p)) ** 2))
    # sum_k ||x_k x_k^T - S||_F^2 = sum_k ||x_k||^4 - n ||S||_F^2
    b2 = float((np.sum(np.sum(xc**2, 1) ** 2) - n * np.sum(s**2)) / n**2)
    shrinkage = 0.0 if d2 == 0 else min(max(b2, 0.0), d2) / d2
    return (1 - shrinkage) * s + shrinkage * m * np.eye(p), shrinkage


def ledoit_wolf_precision(x: np.ndarray) -> np.ndarray:
    """The pseudo-inverse of :func:`ledoit_wolf_covariance` of the rows of ``x`` (n, p).

    >>> ledoit_wolf_precision(np.array([[-1.0, -1.0], [1.0, -1.0], [-1.0, 1.0], [1.0, 1.0]]))  # S = I: no shrinkage
    array([[1., 0.],
           [0., 1.]])
    """
    return np.linalg.pinv(ledoit_wolf_covariance(x)[0], hermitian=True)


def mahalanobis(diff: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """``sqrt(d^T P d)`` of each row ``d`` of ``diff`` (n, p) under the precision ``P`` (p, p).

    >>> mahalanobis(np.array([[3.0, 4.0]]), np.eye(2))
    array([5.])
    """
    return np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", diff, precision, diff), 0.0))


def _checked(features: Any, name: str) -> np.ndarray:
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 3 or x.shape[1] < 1:
        raise ValueError(
            f"{name}: expected (cases, features) with at least 3 cases, got shape {x.shape}; pool one vector "
            "per validation case"
        )
    bad = np.flatnonzero(~np.isfinite(x).all(1))
    if bad.size:
        raise ValueError(
            f"{name}: cases {bad.tolist()} have NaN or infinite features; drop them (or fix their images) "
            "before fitting"
        )
    if np.all(x == x[0]):
        raise ValueError(f"{name}: all {len(x)} feature vectors are equal: no spread to measure a distance against")
    return x


class MahalanobisDistance:
    """``sqrt((z - mu)^T C^-1 (z - mu))`` of the (projected) vector ``z``, with ``mu`` and the Ledoit-Wolf
    covariance ``C`` of the (projected) reference vectors."""

    method = "mahalanobis"

    def __init__(self, max_dim: int = FEATURE_DIM) -> None:
        if int(max_dim) < 1:
            raise ValueError(f"max_dim must be >= 1, got {max_dim}; e.g. 16")
        self.max_dim = int(max_dim)
        self.mean: np.ndarray | None = None
        self.components: np.ndarray | None = None  # (d, p), None: no projection
        self.reference: np.ndarray | None = None  # projected reference vectors (n, d)

    def _project(self, x: np.ndarray) -> np.ndarray:
        x = x - self.mean
        return x if self.components is None else x @ self.components.T

    def _fit_reference(self) -> None:
        self.center = self.reference.mean(0)
        self.covariance, self.shrinkage = ledoit_wolf_covariance(self.reference)
        self.precision = np.linalg.pinv(self.covariance, hermitian=True)

    def fit(self, features: Any) -> MahalanobisDistance:
        """Fit on the reference cases' pooled vectors ``(n, p)`` (n >= 3)."""
        x = _checked(features, "features")
        self.mean = x.mean(0)
        d = min(self.max_dim, x.shape[0] - 1)
        if x.shape[1] > self.max_dim:  # max_dim >= the features' length: stored whole (conformal_distances is exact)
            _, _, vt = np.linalg.svd(x - self.mean, full_matrices=False)
            vt = vt[:d]
            vt *= np.where(vt[np.arange(d), np.abs(vt).argmax(1)] < 0, -1.0, 1.0)[:, None]  # a fixed sign
            self.components = vt
        else:
            self.components = None
        self.reference = self._project(x)
        self._fit_reference()
        return self

    def _fitted(self) -> None:
        if self.reference is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(reference_features) or from_dict(...)")

    def distance(self, features: Any) -> np.ndarray | float:
        """The distance of one vector ``(p,)`` (a float) or of each row of ``(m, p)``; NaN for a non-finite row."""
        self._fitted()
        x = np.asarray(features, dtype=np.float64)
        rows = np.atleast_2d(x)
        if rows.shape[-1] != self.mean.shape[0]:
            raise ValueError(
                f"features: expected {self.mean.shape[0]} features per case (as fitted), got {rows.shape[-1]}"
            )
        out = np.full(len(rows), np.nan)
        ok = np.isfinite(rows).all(1)
        if ok.any():
            out[ok] = mahalanobis(self._project(rows[ok]) - self.center, self.precision)
        return float(out[0]) if x.ndim == 1 else out

    def conformal_distances(self, features: Any) -> np.ndarray:
        """The distance of each of the ``n`` reference cases and of one case's ``features`` (last) from the other
        ``n`` (full conformal: the new case and the reference cases treated alike). With more than ``FEATURE_DIM``
        dimensions the ``n + 1`` vectors are first projected on their own leading principal components, so the
        distances stay a symmetric function of them and the new case's own directions are kept."""
        self._fitted()
        vector = np.asarray(features, dtype=np.float64).reshape(1, -1)
        if vector.shape[1] != len(self.mean) or not np.isfinite(vector).all():
            raise ValueError(
                f"features: expected {len(self.mean)} finite features, got {vector.shape[1]} of which "
                f"{int((~np.isfinite(vector)).sum())} NaN or infinite; the review rule reports such a case as "
                "cannot judge"
            )
        points = np.concatenate([self.reference, self._project(vector)])
        dim = min(FEATURE_DIM, len(points) - 2)
        if points.shape[1] > dim:
            points = _principal_scores(points, dim)
        return np.array([_distance_to(np.delete(points, i, 0), points[i : i + 1])[0] for i in range(len(points))])

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: what :func:`feature_distance_from_dict` reads back."""
        self._fitted()
        return {
            "method": self.method,
            "max_dim": self.max_dim,
            "mean": self.mean.tolist(),
            "components": None if self.components is None else self.components.tolist(),
            "reference": self.reference.tolist(),
        }


def _distance_to(reference: np.ndarray, z: np.ndarray) -> np.ndarray:
    """The Mahalanobis distance of each row of ``z`` under the mean and Ledoit-Wolf precision of ``reference``."""
    return mahalanobis(z - reference.mean(0), ledoit_wolf_precision(reference))


def _principal_scores(points: np.ndarray, dim: int) -> np.ndarray:
    """The rows of ``points`` on their own leading ``dim`` principal components (a symmetric function of the rows)."""
    centred = points - points.mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    return u[:, :dim] * s[:dim]


def feature_distance_from_dict(record: Mapping[str, Any]) -> MahalanobisDistance:
    """The fitted distance stored by ``to_dict`` (e.g. in ``validated_range.json``); a record without one of its keys
    is refused in one line."""
    method = record.get("method")
    if method != MahalanobisDistance.method:
        raise ValueError(f"feature distance method {method!r} is not 'mahalanobis'; store it with to_dict()")
    missing = [k for k in ("max_dim", "mean", "components", "reference") if k not in record]
    if missing:
        raise ValueError(f"the stored feature distance lacks {missing}: store it with to_dict()")
    distance = MahalanobisDistance(record["max_dim"])
    distance.mean = np.asarray(record["mean"], dtype=np.float64)
    components = record["components"]
    distance.components = None if components is None else np.asarray(components, dtype=np.float64)
    width = len(distance.mean) if components is None else len(distance.components)
    distance.reference = np.asarray(record["reference"], dtype=np.float64).reshape(-1, width)
    distance._fit_reference()
    return distance
