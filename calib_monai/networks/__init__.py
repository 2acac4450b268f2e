"""Segmentation backbones by name (config components)."""

from __future__ import annotations

from .backbones import BACKBONES, backbone
