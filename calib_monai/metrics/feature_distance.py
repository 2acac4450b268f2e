"""How far a case's network features lie from the validation cases': the shift a case score cannot see.

Two parts:

* :class:`BottleneckFeatures` (:mod:`calib_monai.metrics.network_features`, re-exported here) captures the
  deepest encoder features of a bundle's 2D network while it runs, pooled to one vector per case.
* :class:`MahalanobisDistance` and :class:`KNNDistance` are fitted on the validation cases' vectors and give a new
  case its distance and a conformal threshold from the validation cases' leave-one-out distances, or its
  full-conformal p-value (:meth:`~MahalanobisDistance.conformal_p_value`). Mahalanobis distance of pooled features
  follows Lee et al. (NeurIPS 2018, "A simple unified framework for detecting out-of-distribution samples and
  adversarial attacks") as applied to segmentation by González et al. (MedIA 2022, "Distance-based detection of
  out-of-distribution silent failures for Covid-19 lung lesion segmentation"), with the covariance shrunk as Ledoit
  & Wolf (J. Multivariate Anal. 2004, "A well-conditioned estimator for large-dimensional covariance matrices"); the
  k-th nearest neighbour distance of L2-normalised features follows Sun et al. (ICML 2022, "Out-of-distribution
  detection with deep nearest neighbors"). Features of more than ``max_dim`` dimensions are first projected on the
  validation vectors' leading principal components (fitted on validation, stored), so the stored model stays small;
  a shift only along directions the validation vectors do not span is then not seen (the residual of the projection
  is not scored).

The threshold: with ``n`` validation distances ``d_1..d_n``, each computed by a model fitted without that case, a
case is flagged when its distance exceeds the ``k``-th smallest, ``k = ceil((1 - alpha)(n + 1))``. For a score
computed the same way as the calibration scores and exchangeable with them this flags with probability at most
``alpha`` (and at least ``alpha - 1 / (n + 1)`` without ties; split conformal, Vovk et al. 2005, "Algorithmic
Learning in a Random World"). The new case's distance comes from the model fitted on all ``n`` cases, those of the
validation cases from ``n - 1``: the jackknife, whose rate is ``alpha`` when leaving one case out changes the fit
little, with no worst-case guarantee (Barber et al., Ann. Statist. 2021, "Predictive inference with the
jackknife+": the jackknife+, which would judge the new case under every leave-one-out fit, keeps ``2 alpha``).
When ``k > n`` (``n < 1 / alpha - 1``) the threshold is infinite: too few validation cases to flag at that ``alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from calib_monai.metrics.network_features import BottleneckFeatures, PooledFeatures, bottleneck_module_name

__all__ = [
    "BottleneckFeatures",
    "KNNDistance",
    "MahalanobisDistance",
    "PooledFeatures",
    "bottleneck_module_name",
    "conformal_rank",
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


def conformal_rank(n: int, alpha: float) -> int:
    """``k = ceil((1 - alpha)(n + 1))`` (may exceed ``n``: no finite threshold), rounding-safe."""
    return math.ceil((1 - alpha) * (n + 1) - 1e-9)


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


class _Distance:
    """Shared by both distances: the optional normalisation and PCA, leave-one-out distances, threshold, JSON."""

    method = ""
    normalize = False

    def __init__(self, alpha: float = 0.05, max_dim: int = 16) -> None:
        if not 0 < float(alpha) < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}; e.g. 0.05 flags about 5% of in-range cases")
        if int(max_dim) < 1:
            raise ValueError(f"max_dim must be >= 1, got {max_dim}; e.g. 16")
        self.alpha, self.max_dim = float(alpha), int(max_dim)
        self.mean: np.ndarray | None = None
        self.components: np.ndarray | None = None  # (d, p), None: no projection
        self.reference: np.ndarray | None = None  # projected validation vectors (n, d)
        self.loo_distances: list[float] = []

    def _prepare(self, x: np.ndarray) -> np.ndarray:
        if self.normalize:
            x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
        return x

    def _project(self, x: np.ndarray) -> np.ndarray:
        return self._project_raw(self._prepare(x))

    def _fit_model(self, x: np.ndarray) -> None:
        x = self._prepare(x)
        self.mean = x.mean(0)
        d = min(self.max_dim, x.shape[0] - 1)
        if x.shape[1] > self.max_dim:  # max_dim >= the features' length: stored whole (conformal_distances is exact)
            _, _, vt = np.linalg.svd(x - self.mean, full_matrices=False)
            vt = vt[:d]
            vt *= np.where(vt[np.arange(d), np.abs(vt).argmax(1)] < 0, -1.0, 1.0)[:, None]  # a fixed sign
            self.components = vt
        else:
            self.components = None
        self.reference = self._project_raw(x)
        self._fit_reference()

    def _project_raw(self, prepared: np.ndarray) -> np.ndarray:
        x = prepared - self.mean
        return x if self.components is None else x @ self.components.T

    def _fit_reference(self) -> None:
        pass

    def _distances(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def fit(self, features: Any) -> _Distance:
        """Fit on the validation cases' pooled vectors ``(n, p)`` (n >= 3) and their leave-one-out distances."""
        x = _checked(features, "features")
        loo = []
        for i in range(len(x)):
            self._fit_model(np.delete(x, i, axis=0))
            loo.append(float(self._distances(self._project(x[i : i + 1]))[0]))
        self._fit_model(x)
        self.loo_distances = loo
        return self

    def _fitted(self) -> None:
        if self.reference is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(validation_features) or from_dict(...)")

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
            out[ok] = self._distances(self._project(rows[ok]))
        return float(out[0]) if x.ndim == 1 else out

    @property
    def rank(self) -> int:
        return conformal_rank(len(self.loo_distances), self.alpha)

    @property
    def threshold(self) -> float:
        """The ``k``-th smallest leave-one-out validation distance (``inf`` when ``k > n``)."""
        self._fitted()
        k, ordered = self.rank, sorted(self.loo_distances)
        return float(ordered[k - 1]) if k <= len(ordered) else math.inf

    def judge(self, features: Any) -> dict[str, Any]:
        """The verdict of one case's vector: ``{"distance", "threshold", "flag", "reason"}``; ``flag`` None (cannot
        judge) for NaN/infinite features, with the reason."""
        threshold = self.threshold
        vector = np.asarray(features, dtype=np.float64).reshape(-1)
        if not np.isfinite(vector).all():
            reason = f"cannot judge: {int((~np.isfinite(vector)).sum())} of {vector.size} features are NaN or infinite"
            return {"distance": math.nan, "threshold": threshold, "flag": None, "reason": reason}
        distance = float(self.distance(vector))
        flag = distance > threshold
        n = len(self.loo_distances)
        reason = (
            f"network features lie further from the validation cases' ({self.method} distance {distance:.3g}) than "
            f"all but {n - self.rank} of {n} validation cases ({threshold:.3g})"
            if flag
            else ""
        )
        return {"distance": distance, "threshold": threshold, "flag": bool(flag), "reason": reason}

    def conformal_distances(self, features: Any, conformal_dim: int | None = None) -> np.ndarray:
        """The distance of each of the ``n`` validation cases and of one case's ``features`` (last) from the other
        ``n``, in the stored projection: the new case and the validation cases treated alike (full conformal; exact
        without a stored projection, else up to the projection fitted on the validation cases alone).

        ``conformal_dim``: first project the ``n + 1`` vectors on their own leading ``conformal_dim`` principal
        components (at most ``n - 1``), fitted on all ``n + 1``: the distances stay a symmetric function of the
        ``n + 1`` vectors (exchangeable cases keep the full-conformal guarantee exactly), and a new case's shift
        along a direction the validation cases do not span is among the directions kept. Store the distance without
        a projection (``max_dim`` >= the features' length) for this."""
        self._fitted()
        vector = np.asarray(features, dtype=np.float64).reshape(1, -1)
        if vector.shape[1] != len(self.mean) or not np.isfinite(vector).all():
            raise ValueError(
                f"features: expected {len(self.mean)} finite features, got {vector.shape[1]} of which "
                f"{int((~np.isfinite(vector)).sum())} NaN or infinite; judge() reports such a case as cannot judge"
            )
        points = np.concatenate([self.reference, self._project(vector)])
        if conformal_dim is not None and points.shape[1] > min(int(conformal_dim), len(points) - 2):
            points = _principal_scores(points, min(int(conformal_dim), len(points) - 2))
        return np.array([self._distances_to(np.delete(points, i, 0), points[i : i + 1])[0] for i in range(len(points))])

    def conformal_p_value(self, features: Any) -> float:
        """``#{j <= n + 1: d_j >= d_new} / (n + 1)`` of :meth:`conformal_distances`: flagging when it is ``<= alpha``
        flags an exchangeable case with probability at most ``alpha`` (``n + 1`` LW or k-NN fits of ``n`` vectors)."""
        distances = self.conformal_distances(features)
        return float((distances >= distances[-1]).sum() / len(distances))

    def _distances_to(self, reference: np.ndarray, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: what :func:`feature_distance_from_dict` reads back."""
        self._fitted()
        return {
            "method": self.method,
            "alpha": self.alpha,
            "max_dim": self.max_dim,
            **self._settings(),
            "mean": self.mean.tolist(),
            "components": None if self.components is None else self.components.tolist(),
            "reference": self.reference.tolist(),
            "loo_distances": list(self.loo_distances),
        }

    def _settings(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> _Distance:
        settings = {k: record[k] for k in ("alpha", "max_dim", *cls._setting_names) if k in record}
        self = cls(**settings)
        self.mean = np.asarray(record["mean"], dtype=np.float64)
        self.components = None if record["components"] is None else np.asarray(record["components"], dtype=np.float64)
        self.reference = np.asarray(record["reference"], dtype=np.float64).reshape(
            -1, len(self.mean) if self.components is None else len(self.components)
        )
        self.loo_distances = [float(v) for v in record["loo_distances"]]
        self._fit_reference()
        return self

    _setting_names: Sequence[str] = ()


class MahalanobisDistance(_Distance):
    """``sqrt((z - mu)^T C^-1 (z - mu))`` of the (projected) vector ``z``, with ``mu`` and the Ledoit-Wolf
    covariance ``C`` of the (projected) validation vectors."""

    method = "mahalanobis"

    def _fit_reference(self) -> None:
        self.center = self.reference.mean(0)
        self.covariance, self.shrinkage = ledoit_wolf_covariance(self.reference)
        self.precision = np.linalg.pinv(self.covariance, hermitian=True)

    def _distances(self, z: np.ndarray) -> np.ndarray:
        return mahalanobis(z - self.center, self.precision)

    def _distances_to(self, reference: np.ndarray, z: np.ndarray) -> np.ndarray:
        return mahalanobis(z - reference.mean(0), ledoit_wolf_precision(reference))


class KNNDistance(_Distance):
    """The Euclidean distance of the L2-normalised (projected) vector to its ``k``-th nearest validation vector."""

    method = "knn"
    normalize = True
    _setting_names = ("k",)

    def __init__(self, alpha: float = 0.05, max_dim: int = 16, k: int = 1) -> None:
        super().__init__(alpha, max_dim)
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}; e.g. 1 (the nearest validation case)")
        self.k = int(k)

    def _settings(self) -> dict[str, Any]:
        return {"k": self.k}

    def _distances(self, z: np.ndarray) -> np.ndarray:
        return self._distances_to(self.reference, z)

    def _distances_to(self, reference: np.ndarray, z: np.ndarray) -> np.ndarray:
        if self.k > len(reference):
            raise ValueError(
                f"k: {self.k} neighbours asked, {len(reference)} validation cases fitted; use k <= {len(reference) - 1}"
            )
        d = np.sqrt(((z[:, None, :] - reference[None]) ** 2).sum(-1))
        return np.sort(d, axis=1)[:, self.k - 1]


def _principal_scores(points: np.ndarray, dim: int) -> np.ndarray:
    """The rows of ``points`` on their own leading ``dim`` principal components (a symmetric function of the rows:
    permuting them permutes the scores; the components' signs do not change any distance)."""
    centred = points - points.mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    return u[:, :dim] * s[:dim]


def feature_distance_from_dict(record: Mapping[str, Any]) -> MahalanobisDistance | KNNDistance:
    """The fitted distance stored by ``to_dict`` (e.g. in ``validated_range.json``)."""
    classes = {"mahalanobis": MahalanobisDistance, "knn": KNNDistance}
    method = record.get("method")
    if method not in classes:
        raise ValueError(f"feature distance method {method!r} is not one of {sorted(classes)}; store it with to_dict()")
    return classes[method].from_dict(record)
