"""The data parts of the bundle configs: the ``data`` component and the preprocessing chains, from the component class.

The chains are the component's one step list (``preprocessing_steps()``, ``calib_monai.data.preprocessing``) written
out per phase: ``train#preprocessing`` (training volumes), ``validate#preprocessing`` (validation and, in
``evaluate.json``, test volumes) and ``inference.json``'s ``preprocessing`` (unlabelled images). They read the data
set's settings from the component (``"$@data.spacing"``), whose defaults the ``data`` section shows, so that
``--data#spacing`` still sets them, and a transform's own argument is overridden as
``--train#preprocessing#transforms#<i>#<argument>``.
"""

from __future__ import annotations

import inspect
from typing import Any

from calib_monai.bundle_factory.specs import Dataset
from calib_monai.data.preprocessing import EVALUATION, TRAINING, compose_config, phase_transforms

__all__ = ["data_component", "preprocessing", "scores_whole_volumes"]


def _json_value(value: Any) -> Any:
    return [_json_value(v) for v in value] if isinstance(value, (tuple, list)) else value


def data_component(dataset: Dataset, **arguments: Any) -> dict[str, Any]:
    """The ``data`` config item: ``arguments``, then the constructor arguments the preprocessing reads with their
    defaults (taken from the component's signature), then the data set's extra ``args``."""
    cls = dataset.component_class
    signature = inspect.signature(cls.__init__).parameters
    missing = [name for name in cls.preprocessing_args if name not in signature]
    if missing:
        raise ValueError(f"{dataset.component}.preprocessing_args names {missing}, which its __init__ does not take")
    defaults = {name: _json_value(signature[name].default) for name in cls.preprocessing_args}
    return {"_target_": dataset.component, **arguments, **defaults, **dataset.args}


def preprocessing(dataset: Dataset, phase: str) -> dict[str, Any]:
    """The ``Compose`` config item of ``phase`` (``training``, ``evaluation`` or ``inference``)."""
    return compose_config(dataset.component_class.preprocessing_steps(), phase)


def scores_whole_volumes(dataset: Dataset) -> bool:
    """True when the validation/test volumes keep their whole extent (no crop/pad to ``roi_size``: FLARE)."""
    steps = dataset.component_class.preprocessing_steps()
    targets = [step["_target_"] for step in phase_transforms(steps, EVALUATION)]
    return "ResizeWithPadOrCropd" not in targets and "ResizeWithPadOrCropd" in [
        step["_target_"] for step in phase_transforms(steps, TRAINING)
    ]
