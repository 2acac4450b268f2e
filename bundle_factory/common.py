"""Config pieces that every bundle config shares."""

from __future__ import annotations

__all__ = ["FLOAT_PRED", "IMPORTS", "SLICE_INFERER"]

IMPORTS = [
    "$import os",
    "$import torch",
    "$import monai",
    "$import calib_monai",
    "$import calib_monai.bundle",
    "$import calib_monai.recalibration",
    "$import calib_monai.data",
    "$import calib_monai.export",
    "$import calib_monai.handlers",
    "$import calib_monai.losses",
    "$import calib_monai.networks",
]

# logits of an amp (fp16) forward back to float32 before softmax and metrics; a no-op in fp32
FLOAT_PRED = {"_target_": "CastToTyped", "keys": "pred", "dtype": "$torch.float32"}

# a 2D network on 3D volumes: axial slices (the last axis), each through the network in one window of roi_size[:2]
SLICE_INFERER = {
    "_target_": "SliceInferer",
    "roi_size": "$@roi_size[:2]",
    "sw_batch_size": "@batch_size",
    "spatial_dim": 2,
    "progress": False,
}
