"""Bundles at run time: the helpers their configs call (``runtime``), the settings check (``settings``), the one-line
error report (``errors``), weights (``weights``), the artifact set (``manifest``), output names (``outputs``) and
``TrainedBundle``, the one reader of a trained bundle folder (``trained``).
"""

from __future__ import annotations

from .errors import error_line, report_errors
from .outputs import OutputFiles, output_paths, quality_path
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
from .trained import TrainedBundle, bundle_config_paths, read_bundle_config
from .weights import WeightsFileError, load_network_weights, read_weights_file, unwrap_network, weights_state_dict

__all__ = [
    "WeightsFileError",
    "OutputFiles",
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
    "output_paths",
    "pin_memory",
    "quality_path",
    "read_bundle_config",
    "read_weights_file",
    "report_errors",
    "unwrap_network",
    "validation_sampler",
    "weights_state_dict",
]
