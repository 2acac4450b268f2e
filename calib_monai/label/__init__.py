"""Serve the bundles with MONAI Label: this folder is a MONAI Label app (``main.py``).

``monailabel start_server --app calib_monai/label --studies <images> --conf zoo_source local`` serves every bundle
linked into ``calib_monai/label/model/`` with two infer tasks each: ``<bundle>`` (segmentation, with a confidence
summary per label in its JSON) and ``<bundle>_confidence`` (the float32 confidence map, type ``others``). MONAI Label
lives in its own environment (``scripts/setup_label_env.sh``); ``serving`` needs only the main one.
"""

from __future__ import annotations

from .serving import CONFIDENCE_THRESHOLDS, InputError, Served, ServedBundle, confidence_summary, find_bundles

__all__ = ["CONFIDENCE_THRESHOLDS", "InputError", "Served", "ServedBundle", "confidence_summary", "find_bundles"]
