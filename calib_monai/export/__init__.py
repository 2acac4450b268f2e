"""Deployable exports of trained bundles: volumes in, segmentation and confidence out, loadable with torch only;
and 3D Slicer review files of their outputs (``slicer``)."""

from __future__ import annotations

from .bundle_export import export_bundle
from .slicer import (
    LOW_CONFIDENCE_SEGMENT_NAME,
    SlicerFiles,
    bundle_label_names,
    lps_geometry,
    slicer_files_from_inference,
    write_slicer_files,
)
from .wrapper import SegmentationWithConfidence

__all__ = [
    "LOW_CONFIDENCE_SEGMENT_NAME",
    "SegmentationWithConfidence",
    "SlicerFiles",
    "bundle_label_names",
    "export_bundle",
    "lps_geometry",
    "slicer_files_from_inference",
    "write_slicer_files",
]
