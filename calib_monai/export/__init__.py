"""Deployable exports of trained bundles: volumes in, segmentation and confidence out, loadable with torch only."""

from __future__ import annotations

from .bundle_export import export_bundle, load_bundle_network
from .wrapper import SegmentationWithConfidence

__all__ = ["SegmentationWithConfidence", "export_bundle", "load_bundle_network"]
