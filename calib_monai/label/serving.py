"""One served bundle: its ``configs/inference.json`` run on one uploaded image (no MONAI Label import).

``ServedBundle`` wraps ``TrainedBundle``: it checks the upload (``InputError``: a 4xx), summarises the confidence per
label and keeps the last prediction, so the tasks of one image cost one inference.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch
from monai.data import MetaTensor

from calib_monai.bundle import TrainedBundle
from calib_monai.bundle.errors import error_chain
from calib_monai.bundle.manifest import MANIFEST_FILE, ArtifactSetError, file_sha256
from calib_monai.data.transforms import unwrap_case_error
from calib_monai.defaults import LOW_CONFIDENCE
from calib_monai.label.labels import bundle_label, value_map
from calib_monai.label.margins import margins_label_map
from calib_monai.metrics.network_features import BottleneckFeatures
from calib_monai.review.site_labels import delivered_dice, record_site_label
from calib_monai.review.site_monitor import SITE_FILE, SiteStateError, read_state, summarise

__all__ = [
    "CONFIDENCE_THRESHOLDS",
    "InputError",
    "SITE_FOLDER",
    "Served",
    "ServedBundle",
    "confidence_summary",
    "find_bundles",
    "review_label_map",
    "review_label_names",
]

logger = logging.getLogger("calib_monai.label")

CONFIDENCE_THRESHOLDS = (0.5, LOW_CONFIDENCE)  # the review map's thresholds a client may ask for
#: The folder, in the datastore's, of each served bundle's site monitor: ``<studies>/calib_monai_site/<bundle>/``.
SITE_FOLDER = "calib_monai_site"
#: The folder, in the temporary one, of the result files the server answers with (each removed once sent).
RESULTS_FOLDER = "calib_monai_results"
NIFTI_SUFFIXES = (".nii", ".nii.gz")


class InputError(ValueError):
    """The uploaded image cannot be segmented by this bundle; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Served:
    """The prediction for one image: both outputs as ``TrainedBundle.predict`` returns them, and the summaries."""

    segmentation: MetaTensor  # uint8 label values
    confidence: MetaTensor  # float32 max softmax probability
    summary: dict = field(default_factory=dict)
    confidence_range: tuple[float, float, float] = (0.0, 0.0, 0.0)  # min, mean, max
    quality: dict | None = None  # case quality and review flag (calib_monai.review.CaseQualityd)
    source: dict | None = None  # weights, recalibration and validated range it came from (SHA-256s)
    features: np.ndarray | None = None  # the network's pooled bottleneck features (None: a network without hooks)
    contours: dict | None = None  # {"inner", "outer"}: (C - 1, *spatial) uint8 (Prediction.contours), or None


def find_bundles(model_dir: str | os.PathLike) -> dict[str, Path]:
    """``{name: folder}`` of the bundles in ``model_dir``: sub-folders (or links) with ``configs/inference.json``."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return {}
    found = (p for p in sorted(model_dir.iterdir()) if (p / "configs" / "inference.json").is_file())
    return {p.name: p for p in found if not p.name.startswith(".")}


def review_label_names(label_names: dict[int, str]) -> dict[str, int]:
    """The review map's ``{name: value}``: background 0, then per structure k its confident part ``2k - 1`` and its
    uncertain part ``2k`` (``"<name> (uncertain)"``): every value named (Slicer names segments by position)."""
    names = {"background": 0}
    for value, name in sorted(label_names.items()):
        if value > 0:
            names[name] = 2 * value - 1
            names[f"{name} (uncertain)"] = 2 * value
    return names


def review_label_map(segmentation: np.ndarray, confidence: np.ndarray, threshold: float) -> np.ndarray:
    """``2k - 1`` where the structure k is predicted with confidence >= ``threshold``, ``2k`` where it is predicted
    below it, 0 for the background (uint8)."""
    segmentation = np.asarray(segmentation)
    uncertain = np.asarray(confidence, dtype=np.float32) < np.float32(threshold)
    review = np.where(segmentation > 0, 2 * segmentation.astype(np.int32) - 1 + uncertain, 0)
    if review.max(initial=0) > np.iinfo(np.uint8).max:
        raise ValueError(
            f"{int(segmentation.max())} structures need review values up to {int(review.max())}: more "
            "than a uint8 label map holds"
        )
    return review.astype(np.uint8)


def confidence_summary(
    segmentation: np.ndarray, confidence: np.ndarray, label_names: dict[int, str], thresholds=CONFIDENCE_THRESHOLDS
) -> dict[str, dict]:
    """``{name: {"label": value, "voxels": n, "mean_confidence": m, "fraction_below_0.5": f, ...}}`` per label, in
    float64; the statistics are ``None`` for a label with no voxel."""
    segmentation, confidence = np.asarray(segmentation), np.asarray(confidence, dtype=np.float64)
    if segmentation.shape != confidence.shape:
        raise ValueError(f"segmentation {segmentation.shape} and confidence {confidence.shape} differ in shape")
    summary = {}
    for value, name in sorted(label_names.items()):
        values = confidence[segmentation == value]
        entry = {
            "label": int(value),
            "voxels": int(values.size),
            "mean_confidence": float(values.mean()) if values.size else None,
        }
        for t in thresholds:
            entry[f"fraction_below_{t:g}"] = float((values < t).mean()) if values.size else None
        summary[name] = entry
    return summary


class ServedBundle:
    """A bundle folder served for inference: ``configs/inference.json`` plus ``models/model.pt`` (or ``model.ts``).

    Outputs go to the temporary folder, never into the bundle; the network is loaded on the first request. The last
    prediction is kept, keyed by the image's content, so the next task on the same image runs no inference.

    Args:
        bundle_dir: the bundle folder (holding ``configs/inference.json``); its name names the served model.
        device: ``"cpu"``, ``"cuda"``...; defaults to the config's ``device`` (CUDA when available).
        site_dir: the folder of this deployment's site monitor (``site.json``): every served case feeds it, and after
            its alarm every answer carries it (``quality["site"]``, the review flag); None: no monitor.
    """

    def __init__(
        self, bundle_dir: str | os.PathLike, device: str | None = None, site_dir: str | os.PathLike | None = None
    ):
        # not the temporary folder itself: MONAI Label's client downloads a result to <tempdir>/<its file name>, so
        # on the server's machine (Slicer beside it) the client's copy would be this file, deleted after the answer
        self._output_dir = os.path.join(tempfile.gettempdir(), RESULTS_FOLDER)
        os.makedirs(self._output_dir, exist_ok=True)
        self._device = device
        self.site_dir = os.fspath(site_dir) if site_dir else ""  # "": no site monitor
        self.bundle_dir = Path(bundle_dir)
        self.bundle = self._load()
        self.name = self.bundle_dir.name
        self.label_names = self.bundle.label_names
        self.in_channels = self.bundle.in_channels
        self._lock = threading.Lock()  # one inference at a time per bundle; also guards the lazy build and the cache
        self._last: tuple[tuple, Served] | None = None  # (image content key, its prediction)

    def _load(self) -> TrainedBundle:
        """The bundle as its files are now; its set is checked when the network is built (the first request)."""
        self._stamp = self.files_stamp()
        overrides = {"output_dir": self._output_dir, "site_dir": self.site_dir}
        return TrainedBundle(self.bundle_dir, ("inference.json",), overrides, device=self._device)

    def files_stamp(self) -> tuple:
        """(name, size, mtime) of the files that decide the output: new ones are served from the next request on."""
        models = self.bundle_dir / "models"
        names = ("model.pt", "model.ts", "calibration.pt", "validated_range.json", MANIFEST_FILE)
        return tuple((n, st.st_size, st.st_mtime_ns) for n in names if (st := _stat(models / n)) is not None)

    def _refresh(self) -> None:
        """Rebuild the bundle when its files changed; a new set that does not check out is not served: the one built
        before goes on serving, with a warning."""
        if self.files_stamp() != self._stamp:
            stamp, bundle = self._stamp, self._load()
            try:
                bundle.artifacts  # noqa: B018 - checked before it replaces the one being served
            except ArtifactSetError as err:
                self._stamp = stamp
                if not all(k in vars(self.bundle) for k in ("network", "_postprocessing_parts")):
                    raise
                logger.warning(f"{self.name}: the new files are not served ({err}); serving the set loaded before")
                return
            self.bundle = bundle
            self._last = None
            logger.info(f"{self.name}: new weights or calibration in {self.bundle_dir / 'models'}: serving them")

    def site_status(self) -> dict:
        """The site monitor's state (``review.site_monitor.summarise``; an unusable state: its error line)."""
        if not self.site_dir:
            return {"monitored": False, "why": "no site folder"}
        path = Path(self.site_dir) / SITE_FILE
        try:
            return {"monitored": True, **summarise(read_state(path), path)}
        except SiteStateError as err:
            return {"monitored": True, "error": str(err)}

    @property
    def weights(self) -> Path | None:
        """The weights file served (``TrainedBundle.weights``)."""
        return self.bundle.weights

    def missing_weights_message(self) -> str:
        return (
            f"model {self.name!r} has no weights: neither {self.bundle_dir / 'models' / 'model.pt'} nor "
            f"model.ts there; train the bundle (python -m monai.bundle run training --config_file "
            f"{self.bundle_dir}/configs/train.json --output_dir {self.bundle_dir}/models) or copy its model.pt "
            "there, then restart the server"
        )

    def check_upload(self, path: str) -> None:
        """Reject an upload that is not a readable image of the bundle's dimensionality (``InputError``)."""
        if not str(path):  # MONAI Label's datastore gives "" for an image id it does not hold
            raise InputError(
                "no such image in the datastore: name one of its images (GET /datastore/?output=all lists them), "
                "or upload the file",
                status=404,
            )
        path = Path(path)
        if not path.is_file() or path.stat().st_size == 0:
            raise InputError(f"the uploaded image is empty or missing ({path.name})")
        if not path.name.endswith(NIFTI_SUFFIXES):
            return  # other formats (PNG, NRRD, MHD) are checked by the bundle's loader and the shape check below
        try:
            shape = tuple(int(s) for s in nib.load(str(path)).shape)
        except Exception as err:  # nibabel raises ImageFileError, gzip/EOF/zlib errors for corrupt files
            raise InputError(f"cannot read the uploaded image as NIfTI ({type(err).__name__}: {err})") from err
        core = list(shape)
        while len(core) > 3 and core[-1] == 1:  # (H, W, D, 1): a singleton channel/time axis is fine
            core.pop()
        if not ((len(core) == 3 and self.in_channels == 1) or (len(core) == 4 and core[3] == self.in_channels)):
            wanted = "(H, W, D)" if self.in_channels == 1 else f"(H, W, D, {self.in_channels}) (channels last)"
            raise InputError(
                f"model {self.name!r} segments 3D volumes {wanted}; the uploaded NIfTI has "
                f"{len(shape)} dimensions, shape {shape}",
                status=422,
            )

    def _preprocess(self, path: str) -> dict:
        try:
            item = self.bundle.preprocess(path)
        except Exception as err:  # a reader or transform failure caused by the file: the client's to fix
            cause = unwrap_case_error(err) if isinstance(err, RuntimeError) else None
            raise InputError(f"cannot preprocess the uploaded image for {self.name!r}: {cause or err}") from err
        image = item["image"]
        if image.ndim != 4 or image.shape[0] != self.in_channels:
            raise InputError(
                f"model {self.name!r} takes {self.in_channels} channel(s) of a 3D volume; the uploaded "
                f"image preprocesses to shape {tuple(image.shape)} (channels, spatial...)",
                status=422,
            )
        bad = int((~torch.isfinite(image)).sum())
        if bad:
            raise InputError(f"the uploaded image has {bad} NaN/Inf voxel(s)", status=422)
        return item

    def predict(self, path: str) -> Served:
        """The prediction for the image file ``path``: computed, or the last one when ``path`` has its content."""
        self.check_upload(path)
        key = _content_key(path)
        with self._lock:
            self._refresh()
            if self._last is not None and self._last[0] == key:
                logger.info(f"{self.name}: {Path(path).name} is the image of the last request: its prediction reused")
                return self._last[1]
            if self.bundle.weights is None:
                raise FileNotFoundError(self.missing_weights_message())
            item = self._preprocess(path)
            self._last = None  # the last volumes are freed before the next inference needs the memory
            with _pooled_features(self.bundle.network) as pooled:
                try:
                    prediction = self.bundle.predict_item(item)
                except RuntimeError as err:  # MONAI wraps a transform's error: a site state the admin must clear
                    site_error = next((e for e in error_chain(err) if isinstance(e, SiteStateError)), None)
                    if site_error is None:
                        raise
                    raise InputError(str(site_error), status=503) from err
            segmentation, confidence, quality = prediction
            seg_array, conf_array = segmentation[0].numpy(), confidence[0].numpy()
            summary = confidence_summary(seg_array, conf_array, self.label_names)
            stats = (float(conf_array.min()), float(conf_array.mean(dtype=np.float64)), float(conf_array.max()))
            source = (quality or {}).get("source") or self.bundle.source
            features = pooled.get("vector")
            served = Served(segmentation, confidence, summary, stats, quality, source, features, prediction.contours)
            self._last = (key, served)
            logger.info(f"{self.name}: segmented {Path(path).name} with {self.bundle.weights} on {self.bundle.device}")
            return served

    def add_site_label(self, case: str, image: str, label: str, label_info: Any = None) -> dict:
        """Record a submitted final label as a site label; the site's state. A ValueError without a site folder or
        for an image the served weights were fine-tuned on."""
        if not self.site_dir:
            raise ValueError(f"{self.name} has no site folder: the label cannot re-anchor its case score")
        run = self.bundle_dir / "runs" / "label_training" / "models"  # FineTune's: the served weights' own run?
        fine_tuned = self.weights is not None and (run / "model.pt").is_file() and (run / "datalist.json").is_file()
        if fine_tuned and file_sha256(run / "model.pt") == file_sha256(self.weights):
            images = {item.get("image") for item in json.loads((run / "datalist.json").read_text()).get("training", [])}
            if str(Path(image).resolve()) in images:
                raise ValueError(f"{case} trained the served weights of {self.name}: its label cannot re-anchor them")
        served = self.predict(image)
        values = bundle_label(label, value_map(label_info, self.label_names, case), case, image)
        truth = delivered_dice(served.segmentation[0].numpy(), values, len(self.label_names))
        return record_site_label(self.site_dir, case, served.quality or {}, truth)

    def label_map(self, served: Served, key: str, threshold: float = LOW_CONFIDENCE) -> MetaTensor:
        """The ``"review"`` (:func:`review_label_map` at ``threshold``) or ``"margins"`` label map
        (:func:`~calib_monai.label.margins.margins_label_map`) of a prediction on the input's grid, uint8; an
        ``InputError`` (409) saying why when the bundle has no contours for the margins."""
        segmentation = served.segmentation[0].numpy()
        if key == "review":
            values = review_label_map(segmentation, served.confidence[0].numpy(), threshold)
        elif served.contours is None:
            why = ((served.quality or {}).get("contours") or {}).get("reason") or "the bundle made no contours"
            raise InputError(f"model {self.name!r} has no contours for this image: {why}", status=409)
        else:
            values = margins_label_map(segmentation, *(served.contours[kind].numpy() for kind in ("inner", "outer")))
        meta = dict(served.segmentation.meta)
        return MetaTensor(torch.from_numpy(values)[None], affine=served.segmentation.affine, meta=meta)

    def save(self, served: Served, key: str, threshold: float = LOW_CONFIDENCE) -> str:
        """Write ``served.<key>`` ("segmentation", "confidence") or its ``"review"``/``"margins"`` map as ``inferring``
        does, under a name of its own in ``<tempdir>/calib_monai_results``; the caller owns (and removes) it."""
        case = f"calib_monai_{self.name}_{uuid.uuid4().hex}"  # unique per request: two tasks never share a file
        if key in ("review", "margins"):
            value, writer = self.label_map(served, key, threshold), "segmentation"
        else:
            value, writer = getattr(served, key), key
        with self._lock:  # the bundle's writers are not thread-safe
            written = self.bundle.write(**{writer: value}, output_dir=self._output_dir, case=case)
        return str(getattr(written, writer))


@contextlib.contextmanager
def _pooled_features(network: torch.nn.Module):
    """``{"vector": the pooled bottleneck features}`` of the forward pass inside the block (empty when the network
    takes no hook, e.g. TorchScript): what Next Sample compares images by."""
    pooled: dict = {}
    try:
        hook = BottleneckFeatures(network)
    except ValueError:
        yield pooled
        return
    with hook:
        yield pooled
    try:
        features = hook.pop()
    except RuntimeError:
        return
    if features.finite:
        pooled["vector"] = features.vector


def _stat(path: Path):
    try:
        return path.stat()
    except OSError:
        return None


def _content_key(path: str) -> tuple[int, str]:
    """(size, BLAKE2b digest) of the file: the same image whatever its name (each upload is a new temporary file)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return os.path.getsize(path), digest.hexdigest()
