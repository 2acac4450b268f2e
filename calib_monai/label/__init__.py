"""Serve the bundles with MONAI Label: this folder is a MONAI Label app (``main.py``, ``docs/site.md``). MONAI Label
lives in its own environment (``scripts/setup_label_env.sh``); ``serving`` needs only the main one.
"""

from __future__ import annotations

from .serving import CONFIDENCE_THRESHOLDS, InputError, Served, ServedBundle, confidence_summary, find_bundles

__all__ = ["CONFIDENCE_THRESHOLDS", "InputError", "Served", "ServedBundle", "confidence_summary", "find_bundles"]
