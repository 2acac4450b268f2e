"""The review rule's input signal: how far an image's statistics
(:func:`~calib_monai.metrics.image_statistics.input_statistics`) lie from the training images' or, without them, from
the other validation images'."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calib_monai.metrics.feature_distance import mahalanobis
from calib_monai.metrics.image_statistics import is_geometry, statistic_floor, statistic_group

__all__ = ["InputSignal"]

_NO_GEOMETRY = (
    "image geometry left out: the image carries no original_affine (a PNG, or an array MONAI's reader did not load)"
)
_NO_VALIDATION_GEOMETRY = "image geometry left out: the validation images carry none (PNGs or arrays)"


@dataclass
class InputSignal:
    """The validation images' statistics (``inputs``, one row each), their ``names`` and the training images'
    ``reference`` (``{"mean", "std"}`` per statistic, or None); what does not depend on the case is derived once."""

    inputs: Sequence[Sequence[float]]
    names: Sequence[str]
    reference: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        rows = np.asarray(self.inputs, dtype=np.float64)
        self.rows = rows if len(self.inputs) else np.zeros((0, len(self.names)))
        width = self.rows.shape[1]
        self.named = list(self.names) if len(self.names) == width else []
        groups = [statistic_group(n) for n in self.named] or ["intensity"] * width
        self.geometry = np.array([g == "geometry" for g in groups], dtype=bool)
        self._geometry_known = bool(np.isfinite(self.rows[:, self.geometry]).all())
        intensity, shading = (np.array([g == kind for g in groups], dtype=bool) for kind in ("intensity", "shading"))
        #: the training images' precision of the standardised intensity statistics (None: none stored, as when a
        #: statistic is not finite on them: each statistic alone)
        self.precision = self._precision("precision", intensity)
        #: the statistics counted together: (their columns, the precision, what they are called in a reason); the
        #: shading group without its own precision counts one by one, as the geometry
        self.joint = [(intensity, self.precision, "intensity statistics")]
        shading_precision = self._precision("shading_precision", shading) if self.precision is not None else None
        if shading_precision is not None:
            self.joint.append((shading, shading_precision, "shading statistics"))
        self.alone = self.geometry | (shading if shading_precision is None else False)

    def _precision(self, key: str, columns: np.ndarray) -> np.ndarray | None:
        """The reference's precision ``key`` of the statistics ``columns``, checked against their number."""
        stored = (self.reference or {}).get(key)
        if stored is None:
            return None
        precision = np.asarray(stored, dtype=np.float64)
        if precision.shape != (int(columns.sum()),) * 2:
            group = "intensity" if key == "precision" else "shading"
            raise ValueError(
                f"validated range input_reference {key} has shape {precision.shape} for {int(columns.sum())} "
                f"{group} statistics: run calibrate again"
            )
        return precision

    def intensities_finite(self) -> bool:
        """Whether every validation image has all its intensity statistics (a geometry may be unknown)."""
        return bool(np.isfinite(self.rows[:, ~self.geometry]).all())

    def comparable(self, stats: Sequence[float]) -> tuple[list[float], str, str]:
        """The case's statistics as the validation images' were measured, why they cannot be compared ("" when they
        can), and a note on a part left out: a geometry the case lacks (NaN: no ``original_affine``) is left out."""
        stats, width = [float(v) for v in stats], self.rows.shape[1]
        if len(stats) != width:
            problem = f"cannot judge: the case has {len(stats)} image statistics and the validated range {width}"
            return stats, f"{problem} (measured by another calib_monai version?): run calibrate again", ""
        if any(not (g or math.isfinite(v)) for v, g in zip(stats, self.geometry)):
            return stats, f"cannot judge: the image statistics {stats} are not all finite", ""
        if self.geometry.any() and not self._geometry_known:
            return stats, "", _NO_VALIDATION_GEOMETRY  # those columns are left out for all n + 1
        lacking = any(g and not math.isfinite(v) for v, g in zip(stats, self.geometry))
        return stats, "", (_NO_GEOMETRY if lacking else "")

    def distances(self, stats: Sequence[float]) -> tuple[np.ndarray, str]:
        """The distance of each of the ``n`` validation images and of the case (``stats``, last), in spreads
        (standard deviations, at least :func:`statistic_floor`) from the training images' (one fixed function, so
        the ``n + 1`` stay exchangeable), else from the other ``n``; and what lies farthest for the case. With the
        training images' precisions the intensity statistics count together (Mahalanobis), the shading statistics
        together and each geometry statistic alone, the largest counting; otherwise the largest single statistic."""
        points = np.vstack([self.rows, np.asarray(stats, dtype=np.float64)[None]])
        names = self.named
        floor = np.maximum([statistic_floor(n) for n in names] or [0.0] * points.shape[1], np.finfo(np.float64).eps)
        if self.reference:  # one fixed reference: every point at once
            mean, std = (np.asarray(self.reference[k], np.float64) for k in ("mean", "std"))
            signed = (points - mean) / np.maximum(std, floor)
        else:  # each point against the other n
            signed = np.empty_like(points)
            for i in range(len(points)):
                others = np.delete(points, i, axis=0)
                signed[i] = (points[i] - others.mean(0)) / np.maximum(others.std(0), floor)
        z = np.abs(signed)
        measured = np.flatnonzero(np.isfinite(z).all(0))  # the statistics every image (and the reference) has
        labels = names or [f"image statistic {i}" for i in range(points.shape[1])]
        farthest = int(measured[np.argmax(z[-1, measured])])
        name = labels[farthest]
        if self.precision is not None:
            single = np.intersect1d(measured, np.flatnonzero(self.alone))
            distance, best = np.zeros(len(points)), -np.inf
            if single.size:
                distance = z[:, single].max(1)
                farthest = int(single[np.argmax(z[-1, single])])
                name, best = labels[farthest], distance[-1]
            for columns, precision, group in self.joint:
                d = signed[:, columns]
                joint = mahalanobis(d, precision)
                if joint[-1] >= best:  # the case's distance is this group's: name its largest share
                    share = d[-1] * (precision @ d[-1])
                    farthest = int(np.flatnonzero(columns)[int(np.argmax(share))])
                    name = f"{labels[farthest]} with the other {group}"
                    best = joint[-1]
                distance = np.maximum(distance, joint)
        else:
            distance = z[:, measured].max(1)
        if is_geometry(name):  # in mm, as a user checks it: the case's and the typical image's
            typical = self.reference["mean"][farthest] if self.reference else points[:-1, farthest].mean()
            name += f" {math.exp(points[-1, farthest]):.3g} mm, typically {math.exp(typical):.3g} mm"
        return distance, name
