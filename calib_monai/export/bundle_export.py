"""Export a trained bundle for deployment into ``<bundle>/models/``: ``model.ts`` (the 2D network's logits, by MONAI's
``ckpt_export``), and :class:`SegmentationWithConfidence` (volumes in, ``(segmentation, confidence)`` out) as
TorchScript ``segmentation_confidence.ts`` and ``torch.export`` ``segmentation_confidence.pt2``; both need only torch.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from calib_monai.atomic import ensure_folder
from calib_monai.bundle import TrainedBundle
from calib_monai.bundle.weights import torchscript_allowed
from calib_monai.checks import check_number
from calib_monai.recalibration.stored import CALIBRATION_FILE, load_calibration

from .wrapper import SegmentationWithConfidence

__all__ = ["export_bundle"]

logger = logging.getLogger("calib_monai")


def _trained_bundle(bundle_dir, checkpoint, config_file: str, net_id: str, key_in_ckpt: str) -> TrainedBundle:
    """The bundle with its weights on the CPU: ``checkpoint``, by default ``<bundle>/models/model.pt``."""
    bundle_dir = Path(bundle_dir).resolve()
    given = checkpoint is not None
    checkpoint = Path(checkpoint) if given else bundle_dir / "models" / "model.pt"
    if not checkpoint.is_file():  # the export's own words: the command line has --checkpoint, not weights=
        how = (
            f"train it first (python -m monai.bundle run training --config_file {bundle_dir}/configs/train.json), "
            "or pass --checkpoint /path/to/model.pt"
        )
        raise FileNotFoundError(f"checkpoint {checkpoint} not found: " + ("check the path" if given else how))
    # only network_def and what it references (backbone, channels, roi_size) are parsed: no data or workflow
    return TrainedBundle(
        bundle_dir, (config_file,), device="cpu", weights=checkpoint, key_in_ckpt=key_in_ckpt, network_id=net_id
    )


def _example_shape(parser, example_shape: Sequence[int] | None) -> tuple[int, ...]:
    if example_shape is not None:
        if (
            isinstance(example_shape, (str, bytes))
            or not isinstance(example_shape, Sequence)
            or len(example_shape) != 5
        ):
            raise ValueError(
                f"example_shape must be (B, C_in, H, W, D), got {example_shape!r}: pass e.g. [2,1,96,96,2]"
            )
        return tuple(check_number("example_shape", s, 1, integer=True, hint="each size") for s in example_shape)
    roi = parser.get_parsed_content("roi_size") if "roi_size" in parser else (192, 192, 2)
    in_channels = parser.get_parsed_content("in_channels") if "in_channels" in parser else 1
    return (2, int(in_channels), int(roi[0]), int(roi[1]), 2)


def _script_or_trace(network: torch.nn.Module, example_slices: torch.Tensor) -> tuple[torch.nn.Module, bool]:
    """The network as TorchScript: scripted when it can be (shape-generic), else traced (e.g. SwinUNETR)."""
    with torchscript_allowed():
        try:
            return torch.jit.script(network), False
        except Exception as e:  # torch raises many types for unsupported Python; tracing is the fallback
            logger.warning(f"torch.jit.script failed ({type(e).__name__}); tracing the network instead")
            with torch.no_grad():
                return torch.jit.trace(network, example_slices), True


def _torch_export(wrapper: torch.nn.Module, example: torch.Tensor, in_plane_multiple: int):
    """``torch.export`` with dynamic batch and depth; dynamic H, W too where the network allows it."""
    batch, depth = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("depth", min=1, max=4096)
    # sizes 0 and 1 are specialised by torch.export, so trace with at least 2 volumes of at least 2 slices
    example = example.repeat(2 if example.shape[0] < 2 else 1, 1, 1, 1, 2 if example.shape[4] < 2 else 1)
    dynamic = {0: batch, 4: depth}
    if in_plane_multiple > 0 and all(s % in_plane_multiple == 0 for s in example.shape[2:4]):
        hw = {
            2: in_plane_multiple * torch.export.Dim("h_blocks", min=1, max=4096 // in_plane_multiple),
            3: in_plane_multiple * torch.export.Dim("w_blocks", min=1, max=4096 // in_plane_multiple),
        }
        try:
            return torch.export.export(wrapper, (example,), dynamic_shapes={"x": {**dynamic, **hw}}), "B, H, W, D"
        except Exception as e:  # e.g. UNETR's fixed patch grid: keep the in-plane size of the example
            logger.info(f"in-plane size kept static in the .pt2 ({type(e).__name__}: {str(e).splitlines()[0]})")
    return torch.export.export(wrapper, (example,), dynamic_shapes={"x": dynamic}), "B, D"


@torchscript_allowed()
def export_bundle(
    bundle_dir: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    checkpoint: str | os.PathLike | None = None,
    example_shape: Sequence[int] | None = None,
    config_file: str = "train.json",
    net_id: str = "network_def",
    key_in_ckpt: str = "",
    spatial_dim: int = 2,
    in_plane_multiple: int = 32,
) -> dict[str, str]:
    """Export a trained bundle's network (only ``network_def`` is built, with ``bundle_root`` set to ``bundle_dir``, on
    the CPU) as ``model.ts`` (raw logits) and ``segmentation_confidence.ts`` / ``.pt2``, which apply the calibration
    fitted for the checkpoint, if any.

    Args:
        bundle_dir: the bundle folder.
        output_dir: where the files go; defaults to ``<bundle>/models``.
        checkpoint: the trained state_dict; defaults to ``<bundle>/models/model.pt``.
        example_shape: a volume shape ``(B, C_in, H, W, D)`` to export with; defaults to batch 2, depth 2 and the
            training in-plane size (``roi_size[:2]``). The exported programs accept any batch and depth and, if the
            in-plane size is a multiple of ``in_plane_multiple``, any such multiple.
        config_file: the config that defines ``network_def``.
        net_id: the config id of the network.
        key_in_ckpt: key of the weights in a nested checkpoint; ``""`` for a plain state_dict.
        spatial_dim: the slice axis (``0``, ``1``, ``2`` for ``H``, ``W``, ``D``), as for ``SliceInferer``.
        in_plane_multiple: try to make ``H``, ``W`` dynamic as multiples of this (32 divides the input of every
            backbone in ``calib_monai.networks``); ``0`` keeps them static.

    Returns:
        the written paths by name: ``model.ts``, ``segmentation_confidence.ts``, ``segmentation_confidence.pt2``.

    Example (command line)::

        calib-monai export bundles/nacl_flare
    """
    from monai.bundle import ckpt_export

    check_number("spatial_dim", spatial_dim, 0, 2, integer=True, hint="the slice axis: 0, 1 or 2 for H, W, D")
    check_number("in_plane_multiple", in_plane_multiple, 0, integer=True, hint="0 keeps H and W static; e.g. 32")
    bundle = _trained_bundle(bundle_dir, checkpoint, config_file, net_id, key_in_ckpt)
    bundle_dir = bundle.bundle_dir
    output_dir = ensure_folder(output_dir if output_dir is not None else bundle_dir / "models", "output_dir")
    shape = _example_shape(bundle.parser, example_shape)
    network = bundle.network
    example = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    example_slices = example.movedim(spatial_dim + 2, 1).flatten(0, 1)
    scripted, traced = _script_or_trace(network, example_slices)
    names = ("model.ts", "segmentation_confidence.ts", "segmentation_confidence.pt2")
    paths = {name: str(output_dir / name) for name in names}

    # model.ts through MONAI's ckpt_export (the bundle's configs and metadata inside), given the weights as loaded:
    # it copies only matching keys, and the file may hold module.-prefixed ones
    with tempfile.TemporaryDirectory() as tmp:
        plain_checkpoint = os.path.join(tmp, "model.pt")
        torch.save(network.state_dict(), plain_checkpoint)
        ckpt_export(
            net_id=net_id,
            filepath=paths["model.ts"],
            ckpt_file=plain_checkpoint,
            meta_file=str(bundle_dir / "configs" / "metadata.json"),
            config_file=str(bundle.config_paths[0]),
            key_in_ckpt="",
            use_trace=traced,
            input_shape=list(example_slices.shape) if traced else None,
            bundle_root=str(bundle_dir),
        )

    info = {
        "inputs": {"image": f"float32 (B, {shape[1]}, H, W, D), slices along spatial axis {spatial_dim}"},
        "outputs": {
            "segmentation": "int64 (B, 1, H, W, D): argmax of the softmax",
            "confidence": "float32 (B, 1, H, W, D): max softmax probability, in [1/C, 1]",
        },
        "example_shape": list(shape),
        "network_traced": traced,
    }
    meta = bundle_dir / "configs" / "metadata.json"
    extra = {"metadata.json": meta.read_text() if meta.exists() else "{}"}

    # the calibrate step's calibration when it was fitted for these weights (checked with its set)
    calibration = load_calibration(bundle.weights.parent / CALIBRATION_FILE, bundle.weights)
    info["calibration"] = repr(calibration) if calibration is not None else None
    source = bundle.artifacts.source() if bundle.artifacts is not None else {}
    info["source"] = {**source, "calibration_sha256": source.get("calibration_sha256") if calibration else None}
    wrapper = SegmentationWithConfidence(network, spatial_dim, calibration).eval()
    # a traced network is wrapped as is; the wrapper's own forward is always scripted (shape-generic)
    ts = torch.jit.script(SegmentationWithConfidence(scripted, spatial_dim, calibration).eval() if traced else wrapper)
    ts_info = {**info, "dynamic": "B, H, W, D" if not traced else f"B, D (H, W fixed at {list(shape[2:4])})"}
    ts_extra = {**extra, "export.json": json.dumps(ts_info)}
    torch.jit.save(ts, paths["segmentation_confidence.ts"], _extra_files=ts_extra)

    with torch.no_grad():
        program, dynamic = _torch_export(wrapper, example, in_plane_multiple)
    pt2_info = {**info, "dynamic": dynamic, "in_plane_multiple": in_plane_multiple if "H" in dynamic else None}
    pt2_extra = {**extra, "export.json": json.dumps(pt2_info)}
    torch.export.save(program, paths["segmentation_confidence.pt2"], extra_files=pt2_extra)
    logger.info(f"exported {bundle_dir.name} to {output_dir} (.pt2 dynamic in {dynamic})")
    return paths
