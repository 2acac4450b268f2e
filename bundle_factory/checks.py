"""The steps every bundle config runs first: the one-line error report and the check of the run's settings.

``initialize`` starts with ``calib_monai.bundle.report_errors()`` (errors end in one clear line and exit code 1;
``CALIB_MONAI_TRACEBACK=1`` adds the traceback) and ``calib_monai.bundle.check_settings(...)`` (unknown command-line
keys, the values of the settings, the selection rule's metrics; ``@loss`` is built so that its argument checks run
before anything else). ``initialize`` builds no data component, so ``run export`` needs no data set; the steps that
read data (``run``/``training``, ``evaluating``, ``calibrate``, ``inferring``) start with
``calib_monai.bundle.check_data_settings(@data, ...)``: classes, channels and label names against the data set.
"""

from __future__ import annotations

__all__ = ["DATA_CHECK", "REPORT_ERRORS", "check_settings"]

REPORT_ERRORS = "$calib_monai.bundle.report_errors()"
DATA_CHECK = (
    "$calib_monai.bundle.check_data_settings(@data, num_classes=@num_classes, in_channels=@in_channels, "
    "label_names=@label_names)"
)

_NETWORK = ("num_classes", "in_channels", "label_names", "roi_size", "batch_size", "device")
_TRAINING = (
    "epochs",
    "lr",
    "val_interval",
    "train_fraction",
    "seed",
    "selection_metric",
    "selection_mode",
    "selection_bounds",
)


def check_settings(training: bool = False) -> str:
    """The ``check_settings`` expression of a config: the network's settings; with ``training``, also the
    training's, the loss (built, so its constructor checks its arguments) and the selection rule's metrics."""
    keys = _NETWORK + (_TRAINING if training else ())
    arguments = [f"{key}=@{key}" for key in keys]
    if training:
        arguments = ["metrics=[@validate#key_metric, @validate#additional_metrics]", "loss=@loss", *arguments]
    return f"$calib_monai.bundle.check_settings({', '.join(arguments)})"
