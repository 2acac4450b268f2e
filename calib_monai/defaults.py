"""The package's defaults, each written once.

Functions, handlers, the CLI, the bundle templates and MONAI Label read a default from here, so that changing one
value here changes it everywhere. ``tests/test_defaults.py`` fails when one of these literals is written again as a
default elsewhere in the package.
"""

from __future__ import annotations

__all__ = ["NUM_BINS"]

# Equal-width confidence bins of ECE, classwise ECE, TACE and the reliability diagram (Guo et al. 2017 use 15).
NUM_BINS = 15
