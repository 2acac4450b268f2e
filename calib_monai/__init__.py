"""calib-monai: calibrated medical image segmentation as MONAI components."""

__version__ = "0.1.0"
