"""Deterministic synthetic abdominal CT phantoms (HU, int16) in the FLARE22 layout and label convention.

An elliptic abdomen with fat/bowel texture, spine, vessels, gallbladder and the four FLARE organs as smooth, randomly
deformed shapes. Calibration is a real question on them:

- partial volume: each structure has a soft occupancy ``o(x) = sigmoid(-d(x) / w)`` (``d`` the approximate signed
  distance to its surface in mm, ``w`` a boundary width); HU values mix by occupancy, then blur and noise;
- ambiguous boundary labels: a voxel is labelled when ``o(x) > t(x) = clip(0.5 + 0.15 b(x) + 0.05 n(x), 0.2, 0.8)``
  (``b`` a smooth random field, rater bias; ``n`` per-voxel jitter);
- low contrast: pancreas (about 90 HU) in bowel-like soft tissue (about 35 HU).

Case ``i`` of seed ``s`` depends only on ``(s, i)``. The axes are RAS, centred on the origin; the anatomy is defined
in mm and sampled by ``shape`` voxels of ``spacing`` (default ``PHANTOM_FOV_MM / shape``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

from calib_monai.atomic import save_atomically, write_json_atomically

__all__ = [
    "PHANTOM_FOV_MM",
    "PHANTOM_VERSION",
    "default_cache_dir",
    "generate_phantom",
    "phantom_shape",
    "phantom_spacing",
    "write_phantom_dataset",
]

logger = logging.getLogger("calib_monai.data")

PHANTOM_VERSION = 1  # bump when the generator changes so stale caches are not reused
PHANTOM_FOV_MM = (384.0, 384.0, 240.0)

# FLARE22 label values of the structures the phantom draws (the others of FLARE22 are absent)
_FLARE22_LABELS = {
    "0": "background",
    "1": "liver",
    "2": "right kidney",
    "3": "spleen",
    "4": "pancreas",
    "5": "aorta",
    "6": "inferior vena cava",
    "7": "right adrenal gland",
    "8": "left adrenal gland",
    "9": "gallbladder",
    "10": "esophagus",
    "11": "stomach",
    "12": "duodenum",
    "13": "left kidney",
}


def default_cache_dir() -> Path:
    """``$CALIB_MONAI_CACHE`` if set, else ``~/.cache/calib_monai``: where generated phantoms are kept."""
    return Path(os.environ.get("CALIB_MONAI_CACHE", Path.home() / ".cache" / "calib_monai")).expanduser()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class _Canvas:
    """Physical coordinates of a RAS grid centred on the origin, plus the image/label being painted."""

    def __init__(self, shape: Sequence[int], spacing: Sequence[float], rng: np.random.Generator):
        self.shape = tuple(int(s) for s in shape)
        self.spacing = np.asarray(spacing, dtype=np.float64)
        self.axes = [(np.arange(n, dtype=np.float32) - (n - 1) / 2.0) * sp for n, sp in zip(self.shape, self.spacing)]
        self.rng = rng
        self.image = np.full(self.shape, -1000.0, dtype=np.float32)
        self.label = np.zeros(self.shape, dtype=np.uint8)
        # smooth annotator-bias field and per-voxel jitter that make boundary labels ambiguous
        bias = smooth_field(rng, self.shape, coarse=(5, 5, 4))
        jitter = rng.standard_normal(self.shape, dtype=np.float32)
        self.threshold = np.clip(0.5 + 0.15 * bias + 0.05 * jitter, 0.2, 0.8)
        self.width = 0.5 * float(self.spacing.mean())  # partial-volume boundary width (mm)

    def box(self, centre: Sequence[float], half_extent: Sequence[float]) -> tuple[slice, ...]:
        """Index box covering ``centre +- half_extent`` (mm), clipped to the grid."""
        out = []
        for ax, c, h in zip(self.axes, centre, half_extent):
            lo, hi = np.searchsorted(ax, [c - h, c + h])
            out.append(slice(int(lo), int(max(hi, lo + 1))))
        return tuple(out)

    def grid(self, box: tuple[slice, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x, y, z = (ax[b] for ax, b in zip(self.axes, box))
        return x[:, None, None], y[None, :, None], z[None, None, :]

    def paint(
        self,
        box: tuple[slice, ...],
        signed_mm: np.ndarray,
        hu: np.ndarray | float,
        label: int | None,
        width: float | None = None,
    ) -> None:
        """Composite a structure by its occupancy ``sigmoid(-d / w)``; label it where occupancy beats the threshold."""
        occupancy = _sigmoid(-signed_mm / (width or self.width))
        self.image[box] = self.image[box] * (1.0 - occupancy) + hu * occupancy
        if label is not None:
            self.label[box] = np.where(occupancy > self.threshold[box], np.uint8(label), self.label[box])


def smooth_field(rng: np.random.Generator, shape: Sequence[int], coarse: Sequence[int] = (4, 4, 3)) -> np.ndarray:
    """A smooth random field of unit standard deviation: Gaussian radial-basis interpolation of a coarse random grid.

    ``f(x) = sum_ijk g_ijk phi_i(x_1) phi_j(x_2) phi_k(x_3)`` with ``g ~ N(0, 1)`` on a ``coarse`` grid and Gaussian
    bumps ``phi`` one coarse cell wide; separable, so it costs three small matrix products (no 3D resampling).
    """
    field = rng.standard_normal(tuple(coarse)).astype(np.float32)
    for axis, (n, c) in enumerate(zip(shape, coarse)):
        pos, centres = np.linspace(0.0, 1.0, n)[:, None], np.linspace(0.0, 1.0, c)[None, :]
        basis = np.exp(-0.5 * ((pos - centres) * (c - 1)) ** 2).astype(np.float32)  # (n, c)
        field = np.moveaxis(np.tensordot(basis, np.moveaxis(field, axis, 0), axes=(1, 0)), 0, axis)
    field -= field.mean()
    return field / max(float(field.std()), 1e-6)


def _wobble(rng: np.random.Generator, q: Sequence[np.ndarray], amplitude: float) -> np.ndarray:
    """Low-frequency shape deformation in normalised coordinates: a sum of three random plane waves."""
    out = 0.0
    for _ in range(3):
        direction = rng.standard_normal(3)
        direction *= rng.uniform(1.5, 3.0) / np.linalg.norm(direction)
        phase = rng.uniform(0, 2 * np.pi)
        wave = np.sin(q[0] * direction[0] + q[1] * direction[1] + q[2] * direction[2] + phase)
        out = out + rng.uniform(0.3, 1.0) * amplitude * wave
    return out


def _ellipsoid(
    canvas: _Canvas, centre, radii, angle: float = 0.0, wobble: float = 0.06, taper: float = 0.0, extruded: bool = False
):
    """Approximate signed distance (mm) to a randomly deformed ellipsoid rotated by ``angle`` about z.

    ``d = (|q| - 1 - wobble(q)) * mean(radii)`` with ``q = R^T (x - c) / r``; ``taper`` thins the shape along +x
    (used for the liver's wedge). ``extruded``: an elliptic cylinder along z (body, spine, vessels), computed on one
    axial plane and broadcast, shape ``(nx, ny, 1)``.
    """
    radii = np.asarray(radii, dtype=np.float32)
    box = canvas.box(centre, radii * 1.35)
    x, y, z = canvas.grid(box)
    if extruded:
        box, z = (box[0], box[1], slice(None)), np.full((1, 1, 1), centre[2], dtype=np.float32)
    dx, dy, dz = x - centre[0], y - centre[1], z - centre[2]
    cos, sin = np.cos(angle), np.sin(angle)
    qx = (cos * dx + sin * dy) / radii[0]
    qy = (-sin * dx + cos * dy) / radii[1]
    qz = dz / radii[2]
    if taper:
        qy = qy / (1.0 - taper * _sigmoid(3.0 * qx))
    qx, qy, qz = np.broadcast_arrays(qx, qy, qz)
    level = np.sqrt(qx**2 + qy**2 + qz**2) - 1.0 - _wobble(canvas.rng, (qx, qy, qz), wobble)
    return box, level * float(radii.mean())


def _tube(canvas: _Canvas, points: np.ndarray, radius_start: float, radius_end: float, wobble_mm: float = 2.0):
    """Approximate signed distance (mm) to a tube of linearly varying radius along a polyline of sample points."""
    lo, hi = points.min(0) - radius_start * 1.5, points.max(0) + radius_start * 1.5
    box = canvas.box((lo + hi) / 2, (hi - lo) / 2)
    x, y, z = canvas.grid(box)
    best = np.full(np.broadcast_shapes(x.shape, y.shape, z.shape), np.inf, dtype=np.float32)
    radii = np.linspace(radius_start, radius_end, len(points))
    for p, r in zip(points, radii):
        best = np.minimum(best, np.sqrt((x - p[0]) ** 2 + (y - p[1]) ** 2 + (z - p[2]) ** 2) - r)
    scale = float(np.linalg.norm(hi - lo)) / 2
    q = np.broadcast_arrays((x - lo[0]) / scale, (y - lo[1]) / scale, (z - lo[2]) / scale)
    return box, best - wobble_mm * _wobble(canvas.rng, q, 1.0)


def phantom_spacing(shape: Sequence[int]) -> tuple[float, float, float]:
    """Voxel spacing (mm) at which ``shape`` voxels cover the phantom field of view ``PHANTOM_FOV_MM``."""
    return tuple(f / int(s) for f, s in zip(PHANTOM_FOV_MM, shape))


def phantom_shape(spacing: Sequence[float]) -> tuple[int, int, int]:
    """Grid size that covers the phantom field of view ``PHANTOM_FOV_MM`` at ``spacing`` (mm)."""
    return tuple(int(np.ceil(f / float(s) - 1e-6)) for f, s in zip(PHANTOM_FOV_MM, spacing))


def generate_phantom(
    seed: int, index: int, shape: Sequence[int] = (128, 128, 48), spacing: Sequence[float] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Phantom ``index`` of ``seed``: ``(image_hu int16, label uint8 in FLARE22 values, affine 4x4)``; ``spacing``
    (mm) defaults to ``phantom_spacing(shape)`` (a smaller grid shows the centre of the abdomen)."""
    if len(shape) != 3 or min(shape) < 8:
        raise ValueError(f"phantom_shape must be three sizes >= 8, got {tuple(shape)}")
    spacing = phantom_spacing(shape) if spacing is None else tuple(float(s) for s in spacing)
    if len(spacing) != 3 or min(spacing) <= 0:
        raise ValueError(f"phantom spacing must be three positive sizes in mm, got {spacing}")
    rng = np.random.default_rng([int(seed), int(index)])
    cv = _Canvas(shape, spacing, rng)
    u = rng.uniform
    shift = np.array([u(-10, 10), u(-10, 10), u(-12, 12)], dtype=np.float32)  # patient position in the scanner

    # body: elliptic abdomen, subcutaneous fat rim, visceral fat / bowel texture
    body_r = np.array([u(150, 170), u(105, 125), 100.0])
    box, d_body = _ellipsoid(cv, shift, body_r, wobble=0.04, extruded=True)
    cv.paint(box, d_body, -100.0 + u(-10, 10), None)
    texture = smooth_field(rng, cv.shape, coarse=(16, 16, 8))
    fat_hu, bowel_hu = u(-110, -80), u(25, 45)
    visceral = fat_hu + (bowel_hu - fat_hu) * _sigmoid(6.0 * (texture - u(-0.6, -0.2)))  # soft fat/bowel mix
    inner = _sigmoid(-(d_body + u(12, 20)) / cv.width)  # soft tissue inside the fat rim
    cv.image[box] = cv.image[box] * (1 - inner) + visceral[box] * inner

    # vertebral body (bone, unlabelled) and the enhanced vessels (FLARE22 labels 5 aorta, 6 IVC)
    spine_c = shift + [0.0, -body_r[1] + 40.0, 0.0]
    box, d = _ellipsoid(cv, spine_c, (u(18, 24), u(16, 22), 100.0), wobble=0.02, extruded=True)
    cv.paint(box, d, u(350, 600), None)
    aorta_hu = u(140, 260)
    aorta_c, ivc_c = shift + [u(10, 20), -body_r[1] + 72.0, 0.0], shift + [u(-28, -18), -body_r[1] + 75.0, 0.0]
    box, d = _ellipsoid(cv, aorta_c, (u(9, 13), u(9, 13), 100.0), wobble=0.01, extruded=True)
    cv.paint(box, d, aorta_hu, 5)
    box, d = _ellipsoid(cv, ivc_c, (u(10, 14), u(8, 11), 100.0), wobble=0.03, extruded=True)
    cv.paint(box, d, aorta_hu - u(30, 80), 6)

    # kidneys (FLARE22: 2 right = patient's right = -x in RAS, 13 left), cortex brighter than medulla
    kidney_hu = u(140, 200)
    for side, label in ((-1.0, 2), (1.0, 13)):
        centre = shift + [side * u(55, 68), -body_r[1] + u(60, 70), u(-30, -5)]
        radii = (u(22, 30), u(25, 32), u(45, 58))
        box, d = _ellipsoid(cv, centre, radii, angle=side * u(0.2, 0.5), wobble=0.08)
        medulla = np.where(d < -u(6, 9), kidney_hu - u(30, 60), kidney_hu)
        cv.paint(box, d, medulla, label)

    # liver (1): large tapered shape on the patient's right, superior; gallbladder (9) at its inferior edge
    liver_c = shift + [u(-75, -60), u(0, 20), u(35, 55)]
    liver_hu = u(70, 120)
    box, d = _ellipsoid(cv, liver_c, (u(80, 92), u(68, 80), u(65, 78)), angle=u(-0.15, 0.15), wobble=0.07, taper=0.5)
    cv.paint(box, d, liver_hu + 6.0 * smooth_field(rng, d.shape, (3, 3, 3)), 1)
    gallbladder_c = liver_c + [u(20, 35), u(35, 50), u(-55, -40)]
    box, d = _ellipsoid(cv, gallbladder_c, (u(14, 20), u(16, 22), u(22, 32)), wobble=0.05)
    cv.paint(box, d, u(0, 25), 9)

    # spleen (3): patient's left, posterior-superior
    spleen_c = shift + [u(85, 105), -body_r[1] + u(75, 95), u(40, 60)]
    box, d = _ellipsoid(cv, spleen_c, (u(22, 32), u(40, 55), u(45, 60)), angle=u(0.4, 0.8), wobble=0.08)
    cv.paint(box, d, liver_hu + u(0, 25), 3)

    # pancreas (4): tapering tube from the head near the duodenum to the tail at the splenic hilum, blurrier boundary
    head = shift + [u(-30, -15), u(-5, 10), u(-15, 0)]
    tail = spleen_c + [u(-30, -20), u(10, 20), u(-25, -15)]
    bend = (head + tail) / 2 + [0.0, u(15, 30), u(0, 10)]
    t = np.linspace(0.0, 1.0, 14)[:, None]
    points = (1 - t) ** 2 * head + 2 * t * (1 - t) * bend + t**2 * tail
    box, d = _tube(cv, points, u(14, 18), u(8, 11), wobble_mm=u(1.5, 3.0))
    cv.paint(box, d, u(80, 105), 4, width=1.5 * cv.width)

    # scanner: point-spread blur, then quantum noise; stored as int16 HU like real CT
    image = ndimage.gaussian_filter(cv.image, 0.6) + u(10, 25) * rng.standard_normal(cv.shape, dtype=np.float32)
    image = np.clip(np.rint(image), -1024, 3071).astype(np.int16)
    affine = np.diag([*cv.spacing, 1.0])
    affine[:3, 3] = [-(n - 1) / 2.0 * sp for n, sp in zip(cv.shape, cv.spacing)]
    return image, cv.label, affine


def _save_atomically(array: np.ndarray, affine: np.ndarray, path: Path) -> None:
    # a crash mid-write never leaves a truncated case that later looks cached
    save_atomically(nib.Nifti1Image(array, affine), path, write=lambda image, tmp: nib.save(image, tmp))


def write_phantom_dataset(
    root: str | os.PathLike,
    num_phantoms: int,
    seed: int = 0,
    shape: Sequence[int] = (128, 128, 48),
    spacing: Sequence[float] | None = None,
) -> Path:
    """Write phantoms ``0..num_phantoms-1`` under ``root`` in the FLARE22/MSD layout (``imagesTr/``, ``labelsTr/``,
    ``dataset.json``), reusing cases whose two files exist. Returns ``root``."""
    if int(num_phantoms) < 3:
        raise ValueError(f"num_phantoms must be >= 3 (one case each for training/validation/test), got {num_phantoms}")
    root = Path(root)
    (root / "imagesTr").mkdir(parents=True, exist_ok=True)
    (root / "labelsTr").mkdir(parents=True, exist_ok=True)
    training, created = [], 0
    for index in range(int(num_phantoms)):
        name = f"Phantom_{index:04d}"
        image_path, label_path = root / "imagesTr" / f"{name}_0000.nii.gz", root / "labelsTr" / f"{name}.nii.gz"
        if not (image_path.is_file() and label_path.is_file()):
            image, label, affine = generate_phantom(seed, index, shape, spacing)
            _save_atomically(label, affine, label_path)
            _save_atomically(image, affine, image_path)
            created += 1
        training.append({"image": f"./imagesTr/{image_path.name}", "label": f"./labelsTr/{label_path.name}"})
    description = {
        "name": "calib_monai abdominal CT phantoms",
        "description": "Synthetic CT phantoms (calib_monai.data.phantoms), FLARE22 label convention.",
        "phantom_version": PHANTOM_VERSION,
        "seed": int(seed),
        "shape": [int(s) for s in shape],
        "spacing": [float(s) for s in (phantom_spacing(shape) if spacing is None else spacing)],
        "tensorImageSize": "3D",
        "modality": {"0": "CT"},
        "labels": _FLARE22_LABELS,
        "numTraining": len(training),
        "training": training,
    }
    write_json_atomically(root / "dataset.json", description, indent=1)
    logger.info("phantoms: %d generated, %d reused from the cache in %s", created, len(training) - created, root)
    return root
