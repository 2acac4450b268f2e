"""Calibration and segmentation metrics."""
