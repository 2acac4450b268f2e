"""Bundles at run time: the helpers their configs call and the one reader of a trained bundle.

- ``runtime``: what the configs call as ``calib_monai.bundle.<name>`` (``locate_bundle``, ``as_bool``, the
  distributed set-up of ``multi_gpu_train.json``, data loading switches);
- ``weights``: every ``model.pt`` layout (plain, ``module.``-prefixed, ``{"model": ...}``) into a network;
- ``trained``: ``TrainedBundle``, a bundle folder with weights: network, transforms and in-memory predictions, used by
  the export, MONAI Label serving, the experiment harness and the Slicer command;
- ``settings``: the check of a run's settings (``check_settings`` in ``initialize``, ``check_data_settings`` before
  the data are read): unknown command-line keys, values, selection metrics, classes and channels against the data;
- ``errors``: ``report_errors``, the one-line error report of bundle runs (``CALIB_MONAI_TRACEBACK=1``: traceback too);
- ``outputs``: the naming rule of the inference outputs, ``<case>_seg.nii.gz`` and ``<case>_conf.nii.gz``.
"""

from __future__ import annotations

from .errors import error_line, report_errors
from .outputs import (
    OUTPUT_EXT,
    OUTPUT_KEYS,
    OUTPUT_POSTFIXES,
    OutputFiles,
    output_case,
    output_path,
    output_paths,
    quality_path,
    write_case_quality,
)
from .runtime import (
    as_bool,
    dataloader_workers,
    distributed_device,
    distributed_network,
    finalize_distributed,
    init_distributed,
    locate_bundle,
    log_run_start,
    pin_memory,
    validation_sampler,
)
from .settings import check_data_settings, check_settings
from .trained import WEIGHT_FILES, TorchScriptNetwork, TrainedBundle, bundle_config_paths, read_bundle_config
from .weights import WeightsFileError, load_network_weights, read_weights_file, unwrap_network, weights_state_dict

__all__ = [
    "OUTPUT_EXT",
    "OUTPUT_KEYS",
    "OUTPUT_POSTFIXES",
    "WEIGHT_FILES",
    "WeightsFileError",
    "OutputFiles",
    "TorchScriptNetwork",
    "TrainedBundle",
    "as_bool",
    "bundle_config_paths",
    "check_data_settings",
    "check_settings",
    "dataloader_workers",
    "distributed_device",
    "distributed_network",
    "error_line",
    "finalize_distributed",
    "init_distributed",
    "load_network_weights",
    "locate_bundle",
    "log_run_start",
    "output_case",
    "output_path",
    "output_paths",
    "pin_memory",
    "quality_path",
    "write_case_quality",
    "read_bundle_config",
    "read_weights_file",
    "report_errors",
    "unwrap_network",
    "validation_sampler",
    "weights_state_dict",
]
