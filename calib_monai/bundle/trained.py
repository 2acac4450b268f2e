"""A trained bundle as one object: its configs and weights in; the network, the transforms and predictions out.

The weights are read as a member of their folder's artifact set (``calib_monai.bundle.manifest``): a calibration or
range that does not belong with them is an ``ArtifactSetError`` naming the files and the fix.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import torch
from monai.bundle import ConfigParser
from monai.data import MetaTensor, decollate_batch, list_data_collate
from monai.transforms import Compose, SaveImaged
from monai.utils import get_equivalent_dtype

from calib_monai.atomic import ensure_folder, write_concurrently

from .manifest import ArtifactSet, is_raw_request, read_artifact_set
from .outputs import (
    CONTOUR_POSTFIXES,
    OUTPUT_KEYS,
    OutputFiles,
    OutputWriter,
    Prediction,
    output_case,
    output_path,
    write_case_quality,
)
from .runtime import as_bool
from .weights import WeightsFileError, load_network_weights, read_weights_file, torchscript_allowed

__all__ = ["WEIGHT_FILES", "TorchScriptNetwork", "TrainedBundle", "bundle_config_paths", "read_bundle_config"]

WEIGHT_FILES = ("model.pt", "model.ts")  # under <bundle>/models/, in this order of preference
ConfigFiles = str | os.PathLike | Sequence[str | os.PathLike]


def bundle_config_paths(bundle_dir: str | os.PathLike, config_files: ConfigFiles) -> list[Path]:
    """The config files of ``bundle_dir`` as paths (names under ``<bundle>/configs/``, absolute paths as they are);
    a ``FileNotFoundError`` names what is missing and what to pass instead."""
    bundle_dir = Path(bundle_dir)
    names = [config_files] if isinstance(config_files, (str, os.PathLike)) else list(config_files)
    if not (bundle_dir / "configs").is_dir():
        raise FileNotFoundError(
            f"{bundle_dir} is not a bundle folder: it has no configs/ folder. Pass the folder that holds configs/ and "
            "models/ (e.g. bundles/nacl_flare; python scripts/make_bundles.py writes the bundles)"
        )
    paths = [Path(name) if Path(name).is_absolute() else bundle_dir / "configs" / name for name in names]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        found = sorted(path.name for path in (bundle_dir / "configs").glob("*.json"))
        raise FileNotFoundError(f"bundle {bundle_dir} has no {missing}; its configs/ holds {found}: pass those names")
    return paths


def read_bundle_config(
    bundle_dir: str | os.PathLike,
    config_files: ConfigFiles = ("inference.json",),
    overrides: Mapping[str, Any] | None = None,
    set_bundle_root: bool = True,
) -> ConfigParser:
    """A ``ConfigParser`` of the bundle's ``config_files`` (later ones override earlier keys, as ``monai.bundle run``
    does), then ``bundle_root`` set to ``bundle_dir`` (nothing looked up), then ``overrides``."""
    parser = ConfigParser()
    parser.read_config([str(path) for path in bundle_config_paths(bundle_dir, config_files)])
    if set_bundle_root:
        parser["bundle_root"] = os.path.abspath(bundle_dir)
    parser.update(dict(overrides or {}))
    return parser


class TorchScriptNetwork(torch.nn.Module):
    """A TorchScript ``model.ts`` called like its network (a MetaTensor goes in as a plain tensor)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.as_tensor() if isinstance(x, MetaTensor) else x)


class TrainedBundle:
    """A bundle folder with trained weights, ready for inference. The configs are parsed once; the network, weights
    and transforms are built on first use, so a bundle without weights can still be listed and its labels read.

    Args:
        bundle_dir: the bundle folder (holding ``configs/`` and ``models/``).
        config_files: config names under ``configs/`` (or paths), read in order: ``("inference.json",)`` to predict,
            ``("train.json", "demo.json")`` for the network and inferer of a training run.
        overrides: config ids and values set after ``bundle_root``; ``site_dir`` defaults to ``""`` (no site
            monitor: ``predict`` writes nothing).
        device: where the network runs; defaults to the config's ``device``, else the CPU.
        weights: the weights file; defaults to ``models/model.pt``, else ``models/model.ts`` (TorchScript); a state
            dict as :func:`calib_monai.bundle.load_network_weights` reads it.
        key_in_ckpt: key of the weights in a nested checkpoint; ``""`` reads the layouts above as they are.
        network_id: the config id of the network.

    Example::

        bundle = TrainedBundle("bundles/nacl_flare")
        prediction = bundle.predict("case_0000.nii.gz")  # MetaTensors on the input's grid, and the case quality
        bundle.write(*prediction, output_dir="out", contours=prediction.contours)  # out/case_seg.nii.gz, ...
    """

    def __init__(
        self,
        bundle_dir: str | os.PathLike,
        config_files: ConfigFiles = ("inference.json",),
        overrides: Mapping[str, Any] | None = None,
        device: str | torch.device | None = None,
        weights: str | os.PathLike | None = None,
        key_in_ckpt: str = "",
        network_id: str = "network_def",
    ) -> None:
        self.bundle_dir = Path(os.path.abspath(bundle_dir))
        self.config_paths = bundle_config_paths(self.bundle_dir, config_files)
        overrides = dict(overrides or {})
        if device is not None:  # the config's own users of @device (evaluators, data) follow it too
            overrides["device"] = str(device)
        if weights is not None:  # inference.json's calibration sits next to, and is checked against, model_path
            overrides.setdefault("model_path", os.fspath(weights))
        if "site_dir" not in overrides:  # predict is in memory: no site monitor unless a deployment names its folder
            overrides["site_dir"] = ""
        self.parser = read_bundle_config(self.bundle_dir, self.config_paths, overrides)
        self._weights = Path(weights) if weights is not None else None
        self.key_in_ckpt = key_in_ckpt
        self.network_id = network_id

    def __repr__(self) -> str:
        configs = [path.name for path in self.config_paths]
        return f"TrainedBundle({str(self.bundle_dir)!r}, {configs}, weights={str(self.weights)!r})"

    def get(self, id: str, default: Any = None) -> Any:
        """The config item ``id`` instantiated (once: the parser's cache), or ``default`` when it is not defined."""
        return self.parser.get_parsed_content(id) if id in self.parser else default

    @cached_property
    def device(self) -> torch.device:
        return torch.device(self.get("device", "cpu"))

    @cached_property
    def label_names(self) -> dict[int, str]:
        """``{label value: name}`` from the config's ``label_names`` (``{}`` when it has none)."""
        names = self.get("label_names") or {}
        return {int(v): str(name) for v, name in (names.items() if isinstance(names, Mapping) else enumerate(names))}

    @property
    def num_classes(self) -> int:
        return int(self.get("num_classes", len(self.label_names)))

    @property
    def in_channels(self) -> int:
        return int(self.get("in_channels", 1))

    @property
    def weights(self) -> Path | None:
        """The weights file: the one given, else ``models/model.pt``, else ``models/model.ts``, else None."""
        if self._weights is not None:
            return self._weights
        return next((p for p in (self.bundle_dir / "models" / f for f in WEIGHT_FILES) if p.is_file()), None)

    @property
    def raw(self) -> bool:
        """Whether the network's own probabilities were asked for (``calibration_path`` ``none``)."""
        return "calibration_path" in self.parser and is_raw_request(self.get("calibration_path"))

    @cached_property
    def artifacts(self) -> ArtifactSet | None:
        """The checked set of the weights' folder (``read_artifact_set``); None without weights or for ``model.ts``."""
        weights = self.weights
        if weights is None or not weights.is_file() or weights.suffix == ".ts":
            return None
        return read_artifact_set(weights.parent, weights, raw=self.raw)

    @property
    def source(self) -> dict[str, Any] | None:
        """What the outputs come from (SHA-256s), as ``CalibrateLogitsd`` records it, else from the checked set."""
        post = self._postprocessing_parts[0] if "postprocessing" in self.parser else None
        for transform in post.transforms if post is not None else ():
            if getattr(transform, "source", None):
                return dict(transform.source)
        return self.artifacts.source() if self.artifacts is not None else None

    @cached_property
    def network(self) -> torch.nn.Module:
        """The network with its trained weights, on ``device``, in eval mode (the weights' set checked first)."""
        weights = self.weights
        self.artifacts  # noqa: B018 - a set that does not belong together is refused before anything is built
        if weights is None:
            raise FileNotFoundError(
                f"bundle {self.bundle_dir} has no weights: neither models/model.pt nor models/model.ts there. Train "
                f"it (python -m monai.bundle run training --config_file {self.bundle_dir}/configs/train.json "
                f"--output_dir {self.bundle_dir}/models) or pass weights=/path/to/model.pt"
            )
        if not weights.is_file():
            raise FileNotFoundError(
                f"checkpoint {weights} not found: train the bundle or pass weights=... (a "
                "model.pt state_dict or a model.ts)"
            )
        if weights.suffix == ".ts":
            with torchscript_allowed():
                try:
                    network = TorchScriptNetwork(torch.jit.load(str(weights), map_location="cpu"))
                except Exception as err:
                    raise WeightsFileError(
                        f"{weights} cannot be read as a TorchScript model ({type(err).__name__}): "
                        "export the bundle again (calib-monai export <bundle>)"
                    ) from err
        else:
            if self.network_id not in self.parser:
                raise KeyError(f"{[str(p) for p in self.config_paths]} define no {self.network_id!r} (network_id)")
            network = self.get(self.network_id)
            source = read_weights_file(weights)
            if self.key_in_ckpt:
                if not isinstance(source, Mapping) or self.key_in_ckpt not in source:
                    keys = sorted(source) if isinstance(source, Mapping) else type(source).__name__
                    raise KeyError(f"{weights} has no {self.key_in_ckpt!r} (key_in_ckpt); it holds {keys}")
                source = source[self.key_in_ckpt]
            load_network_weights(network, source, name=str(weights))
        return network.to(self.device).eval()

    @property
    def preprocessing(self):
        return self.get("preprocessing")

    @property
    def inferer(self):
        """The config's ``inferer`` (``inference.json``), else ``validate#inferer`` (``train.json``)."""
        for id in ("inferer", "validate#inferer"):
            if id in self.parser:
                return self.get(id)
        raise KeyError(f"{[str(p) for p in self.config_paths]} define neither 'inferer' nor 'validate#inferer'")

    @property
    def postprocessing(self):
        return self.get("postprocessing")

    @cached_property
    def _postprocessing_parts(self) -> tuple[Compose, dict[str, SaveImaged]]:
        """The postprocessing without its file writers, and those writers by output key (``write`` uses them)."""
        post = self.postprocessing
        transforms = post.flatten().transforms if isinstance(post, Compose) else [post]
        savers = {t.keys[0]: t for t in transforms if isinstance(t, SaveImaged) and len(t.keys) == 1}
        for t in transforms:  # inferring's SaveImagesd: one SaveImaged per key, written side by side
            savers.update(getattr(t, "savers", {}))
        return Compose([t for t in transforms if not isinstance(t, (SaveImaged, OutputWriter))]), savers

    def _autocast(self):
        # as MONAI's SupervisedEvaluator: autocast for CUDA when the config's amp switch is on
        if as_bool(self.get("amp", False)) and self.device.type == "cuda":
            return torch.autocast("cuda")
        return contextlib.nullcontext()

    def preprocess(self, image: Any, case: str | None = None) -> dict:
        """The preprocessed item of ``image`` (a path, a case's paths, or an item dict); ``case`` names its outputs."""
        item = dict(image) if isinstance(image, Mapping) else {"image": image}
        if isinstance(item["image"], os.PathLike):
            item["image"] = os.fspath(item["image"])
        if case is not None:
            item["case"] = case
        return self.preprocessing(item)

    def predict_item(self, item: Mapping) -> Prediction:
        """``(segmentation, confidence, quality)`` of one preprocessed item (``preprocess``); see ``predict``."""
        batch = list_data_collate([dict(item)])  # as the bundle's DataLoader hands it to the evaluator
        network = self.network
        postprocessing = self._postprocessing_parts[0]  # built first: CaseQualityd's feature hook sees this forward
        with torch.no_grad(), self._autocast():
            batch["pred"] = self.inferer(batch["image"].to(self.device), network)
        (decollated,) = decollate_batch(batch, detach=True)
        outputs = postprocessing(decollated)
        missing = [key for key in OUTPUT_KEYS if key not in outputs]
        if missing:
            raise KeyError(
                f"the postprocessing of {[str(p) for p in self.config_paths]} makes no {missing}: predict "
                "needs calib_monai.data.segmentation_and_confidence in it"
            )
        savers = self._postprocessing_parts[1]
        for key in OUTPUT_KEYS:  # in the dtype the bundle's writer saves
            dtype = savers[key].saver.init_kwargs.get("output_dtype") if key in savers else None
            if dtype is not None:
                outputs[key] = outputs[key].to(get_equivalent_dtype(dtype, torch.Tensor))
        contours = None
        if all(key in outputs for key in CONTOUR_POSTFIXES):  # ContourMarginsd made them: a contour set applies
            contours = {postfix: outputs[key].cpu() for key, postfix in CONTOUR_POSTFIXES.items()}
        return Prediction(outputs["segmentation"].cpu(), outputs["confidence"].cpu(), outputs.get("quality"), contours)

    def predict(self, image: Any, case: str | None = None) -> Prediction:
        """Segment ``image`` in memory: ``(segmentation, confidence, quality)``, uint8 labels and float32 max softmax
        probability, each ``(1, *spatial)`` on the CPU on the input's grid, and the case quality with its review flag
        (None without ``CaseQualityd``): what ``inferring`` writes. ``.contours``: see :class:`Prediction`."""
        return self.predict_item(self.preprocess(image, case))

    def write(
        self,
        segmentation: MetaTensor | None = None,
        confidence: MetaTensor | None = None,
        quality: dict | None = None,
        output_dir: str | os.PathLike | None = None,
        case: str | None = None,
        contours: Mapping[str, MetaTensor] | None = None,
    ) -> OutputFiles:
        """Write the outputs of ``predict`` as the ``inferring`` run does (the bundle's own writers: NIfTI with the
        input's affine, uint8 and float32) to ``<output_dir>/<case>_seg.nii.gz`` and ``<case>_conf.nii.gz``, the
        quality to ``<case>_quality.json`` and a row of ``quality.csv`` (``calib_monai.bundle.outputs``), and the
        ``contours`` (``Prediction.contours``) to ``<case>_inner.nii.gz`` and ``<case>_outer.nii.gz``;
        ``output_dir`` defaults to the config's ``output_dir``, ``case`` to the one the outputs carry. Any output may
        be left out; returns the paths written."""
        savers = self._postprocessing_parts[1]
        folder = Path(output_dir if output_dir is not None else self.get("output_dir"))
        written: dict[str, Path | None] = {}
        writes = []
        images = {"segmentation": segmentation, "confidence": confidence}
        images.update({key: (contours or {}).get(postfix) for key, postfix in CONTOUR_POSTFIXES.items()})
        for key, value in images.items():
            written[CONTOUR_POSTFIXES.get(key, key)] = None
            if value is None:
                continue
            if key not in savers:
                raise KeyError(
                    f"the postprocessing of {[str(p) for p in self.config_paths]} has no SaveImaged of "
                    f"{key!r} to write it with"
                )
            saver = savers[key].saver
            meta = value.meta if isinstance(value, MetaTensor) else {}
            path = output_path(folder, case or output_case(meta), key, ext=saver.output_ext)
            # SaveImage appends the extension
            writes.append(partial(saver, value, filename=str(path)[: -len(saver.output_ext)]))
            written[CONTOUR_POSTFIXES.get(key, key)] = path
        if writes:  # before MONAI's writers: a file in the folder's way is one line, not "no suitable writer"
            ensure_folder(folder)
        write_concurrently(writes)
        if quality is not None:
            given = [v for v in images.values() if isinstance(v, MetaTensor)]
            name = case or (output_case(given[0].meta) if given else None)
            if name is None:
                raise ValueError("write(quality=...) without an image output needs case=...")
            written["quality"] = write_case_quality(folder, name, quality)
        return OutputFiles(**written)
