"""One served bundle: its ``configs/inference.json`` run on one uploaded image, without MONAI Label.

``ServedBundle`` is what the MONAI Label tasks of ``calib_monai.label.infer`` call. It builds, from the bundle's own
inference config, the ``preprocessing``, the ``inferer`` and the ``postprocessing`` (softmax -> argmax and max
probability -> ``Invertd`` back to the input's grid -> ``<case>_seg.nii.gz`` uint8 and ``<case>_conf.nii.gz``
float32), so a served image gets exactly what ``python -m monai.bundle run inferring`` writes for it. The network is
the config's ``network_def`` with ``models/model.pt`` or, without it, the TorchScript ``models/model.ts``.

Nothing here imports MONAI Label: it runs (and is tested) in the main environment too.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
from monai.bundle import ConfigParser
from monai.data import MetaTensor, decollate_batch, list_data_collate

from calib_monai.bundle import load_network_weights
from calib_monai.data.transforms import unwrap_case_error

__all__ = ["CONFIDENCE_THRESHOLDS", "InputError", "Served", "ServedBundle", "confidence_summary", "find_bundles"]

logger = logging.getLogger("calib_monai.label")

CONFIDENCE_THRESHOLDS = (0.5, 0.8)
WEIGHT_FILES = ("model.pt", "model.ts")  # in this order of preference, under <bundle>/models/
NIFTI_SUFFIXES = (".nii", ".nii.gz")


class InputError(ValueError):
    """The uploaded image cannot be segmented by this bundle; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Served:
    """The outputs of one request: both files on the input's grid, and the confidence summary per label."""

    segmentation: str  # <case>_seg.nii.gz, uint8 label values
    confidence: str  # <case>_conf.nii.gz, float32 max softmax probability
    summary: dict = field(default_factory=dict)
    confidence_range: tuple[float, float, float] = (0.0, 0.0, 0.0)  # min, mean, max


def find_bundles(model_dir: str | os.PathLike) -> dict[str, Path]:
    """``{name: folder}`` of the bundles in ``model_dir``: sub-folders (or links) with ``configs/inference.json``."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return {}
    found = {p.name: p for p in sorted(model_dir.iterdir()) if (p / "configs" / "inference.json").is_file()}
    return {name: path for name, path in found.items() if not name.startswith(".")}


def confidence_summary(segmentation: np.ndarray, confidence: np.ndarray, label_names: dict[int, str],
                       thresholds=CONFIDENCE_THRESHOLDS) -> dict[str, dict]:  # fmt: skip
    """Per label: its voxel count, the mean confidence of its voxels and the fraction of them below each threshold.

    ``{name: {"label": value, "voxels": n, "mean_confidence": m, "fraction_below_0.5": f, ...}}``; the statistics are
    ``None`` for a label with no voxel (JSON ``null``). Computed in float64 over the voxels of the output grid.
    """
    segmentation, confidence = np.asarray(segmentation), np.asarray(confidence, dtype=np.float64)
    if segmentation.shape != confidence.shape:
        raise ValueError(f"segmentation {segmentation.shape} and confidence {confidence.shape} differ in shape")
    summary = {}
    for value, name in sorted(label_names.items()):
        values = confidence[segmentation == value]
        entry = {"label": int(value), "voxels": int(values.size),
                 "mean_confidence": float(values.mean()) if values.size else None}  # fmt: skip
        for t in thresholds:
            entry[f"fraction_below_{t:g}"] = float((values < t).mean()) if values.size else None
        summary[name] = entry
    return summary


class ServedBundle:
    """A bundle folder served for inference: ``configs/inference.json`` plus ``models/model.pt`` (or ``model.ts``).

    The config is parsed once with ``bundle_root`` set to ``bundle_dir`` and ``output_dir`` set to the temporary
    folder (``TMPDIR``), so serving never writes into the bundle. The network is loaded on the first request.

    Args:
        bundle_dir: the bundle folder (holding ``configs/inference.json``); its name names the served model.
        device: ``"cpu"``, ``"cuda"``...; defaults to the config's ``device`` (CUDA when available).
    """

    def __init__(self, bundle_dir: str | os.PathLike, device: str | None = None):
        self.bundle_dir = Path(bundle_dir)
        self.name = self.bundle_dir.name
        self.config = json.loads((self.bundle_dir / "configs" / "inference.json").read_text())
        names = self.config.get("label_names") or {}
        self.label_names = {int(k): str(v) for k, v in names.items()}
        self.in_channels = int(self.config.get("in_channels", 1))
        self._device = device
        self._lock = threading.Lock()
        self._parts = None  # (preprocessing, inferer, postprocessing, network, device), built on first use
        # outputs go straight into the temporary folder, under names unique to each request, so nothing is left
        # behind once MONAI Label has removed the file it sent (a folder of ours would outlive the server: uvicorn
        # ends on the re-raised SIGTERM, without atexit)
        self._output_dir = tempfile.gettempdir()

    @property
    def weights(self) -> Path | None:
        """The weight file that will be served (``models/model.pt``, else ``models/model.ts``), or None."""
        return next((p for p in (self.bundle_dir / "models" / f for f in WEIGHT_FILES) if p.is_file()), None)

    def missing_weights_message(self) -> str:
        return (f"model {self.name!r} has no weights: neither {self.bundle_dir / 'models' / 'model.pt'} nor "
                f"model.ts there; train the bundle (python -m monai.bundle run training --config_file "
                f"{self.bundle_dir}/configs/train.json --output_dir {self.bundle_dir}/models) or copy its model.pt "
                "there, then restart the server")  # fmt: skip

    def _build(self):
        weights = self.weights
        if weights is None:
            raise FileNotFoundError(self.missing_weights_message())
        parser = ConfigParser()
        parser.read_config(str(self.bundle_dir / "configs" / "inference.json"))
        # literal values replace locate_bundle(...) and <bundle>/inference: nothing is looked up or written there
        parser["bundle_root"] = str(self.bundle_dir)
        parser["output_dir"] = self._output_dir
        device = torch.device(self._device or parser.get_parsed_content("device"))
        if weights.suffix == ".pt":
            network = parser.get_parsed_content("network_def")
            # a plain state_dict, a module.-prefixed one (older multi-GPU runs) or a training checkpoint {"model": ...}
            load_network_weights(network, weights)
        else:
            network = _TorchScriptNetwork(torch.jit.load(str(weights), map_location="cpu"))
        network = network.to(device).eval()
        parts = (parser.get_parsed_content("preprocessing"), parser.get_parsed_content("inferer"),
                 parser.get_parsed_content("postprocessing"), network, device)  # fmt: skip
        logger.info(f"{self.name}: serving {weights} on {device}")
        return parts

    def check_upload(self, path: str) -> None:
        """Reject an upload that is not a readable image of the bundle's dimensionality (``InputError``)."""
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
            raise InputError(f"model {self.name!r} segments 3D volumes {wanted}; the uploaded NIfTI has "
                             f"{len(shape)} dimensions, shape {shape}", status=422)  # fmt: skip

    def _preprocess(self, preprocessing, path: str, case: str) -> dict:
        try:
            item = preprocessing({"image": path, "case": case})
        except Exception as err:  # a reader or transform failure caused by the file: the client's to fix
            cause = unwrap_case_error(err) if isinstance(err, RuntimeError) else None
            raise InputError(f"cannot preprocess the uploaded image for {self.name!r}: {cause or err}") from err
        image = item["image"]
        if image.ndim != 4 or image.shape[0] != self.in_channels:
            raise InputError(f"model {self.name!r} takes {self.in_channels} channel(s) of a 3D volume; the uploaded "
                             f"image preprocesses to shape {tuple(image.shape)} (channels, spatial...)",
                             status=422)  # fmt: skip
        bad = int((~torch.isfinite(image)).sum())
        if bad:
            raise InputError(f"the uploaded image has {bad} NaN/Inf voxel(s)", status=422)
        return item

    def segment(self, path: str) -> Served:
        """Segment the image file ``path``; the caller owns (and removes) the two files it returns."""
        self.check_upload(path)
        with self._lock:  # one inference at a time per bundle; also guards the lazy build
            if self._parts is None:
                self._parts = self._build()
            preprocessing, inferer, postprocessing, network, device = self._parts
            case = f"calib_monai_{self.name}_{uuid.uuid4().hex}"  # names the output files; unique per request
            item = self._preprocess(preprocessing, path, case)
            batch = list_data_collate([item])  # as the bundle's DataLoader and evaluator see it
            with torch.no_grad():
                batch["pred"] = inferer(batch["image"].to(device), network)
            for decollated in decollate_batch(batch):
                postprocessing(decollated)
        out = Path(self._output_dir)
        seg, conf = out / f"{case}_seg.nii.gz", out / f"{case}_conf.nii.gz"
        seg_array = np.asarray(nib.load(str(seg)).dataobj)
        conf_array = np.asarray(nib.load(str(conf)).dataobj, dtype=np.float32)
        summary = confidence_summary(seg_array, conf_array, self.label_names)
        stats = (float(conf_array.min()), float(conf_array.mean(dtype=np.float64)), float(conf_array.max()))
        return Served(str(seg), str(conf), summary, stats)


class _TorchScriptNetwork:
    """A TorchScript ``model.ts`` (2D slices -> logits) called like the ``nn.Module`` it was exported from."""

    def __init__(self, module):
        self.module = module

    def __call__(self, x):
        return self.module(x.as_tensor() if isinstance(x, MetaTensor) else x)

    def to(self, device):
        self.module = self.module.to(device)
        return self

    def eval(self):
        self.module.eval()
        return self
