"""Calibration losses, one per module (see each class docstring for its paper and formula)."""
