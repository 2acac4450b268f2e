"""Ignite handlers that attach calib_monai metrics and updates to MONAI engines."""
