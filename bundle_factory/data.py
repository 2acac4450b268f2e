"""The data parts of the bundle configs: the ``data`` component and the preprocessing chains, from the component class.

The chains are the component's one step list (``preprocessing_steps()``, ``calib_monai.data.preprocessing``) written
out per phase: ``train#preprocessing`` (training volumes), ``validate#preprocessing`` (validation and, in
``evaluate.json``, test volumes) and ``inference.json``'s ``preprocessing`` (unlabelled images). The validation
chain is the inference chain plus the label (``served_evaluation``): no crop or pad to ``roi_size`` that inference
does not do, so the validated range, ``evaluating`` and ``inferring`` see the same images on the same grid.

``train.json`` writes the shared steps once, as the model zoo does: ``train#deterministic_transforms`` (the
validation chain), ``train#training_transforms`` (what training adds: the crop to ``roi_size``), ``train#preprocessing``
their concatenation, and ``validate#preprocessing`` a copy of the first (``%train#deterministic_transforms``).

The chains read the data set's settings from the component (``"$@data.spacing"``), whose defaults the ``data``
section shows, so that ``--data#spacing`` still sets them, and a transform's own argument is overridden as
``--train#deterministic_transforms#<i>#<argument>`` (training and validation) or
``--train#training_transforms#<i>#<argument>``.
"""

from __future__ import annotations

import inspect
from typing import Any

from bundle_factory.specs import Dataset
from calib_monai.data.preprocessing import EVALUATION, INFERENCE, TRAINING, compose_config, phase_transforms

__all__ = ["data_component", "preprocessing", "scores_whole_volumes", "served_evaluation", "training_transforms"]


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


def _keys(step: dict[str, Any]) -> list[str]:
    keys = step.get("keys", [])
    return [keys] if isinstance(keys, str) else list(keys)


def served_evaluation(dataset: Dataset) -> dict[str, Any]:
    """The ``Compose`` config item of the validation and test volumes: the evaluation steps less those that change
    the image and that inference leaves out (the crop/pad to ``roi_size``), i.e. the inference chain plus the label's
    steps: what is validated is what is served. ``SliceInferer`` covers any in-plane size (batch size 1)."""
    steps = dataset.component_class.preprocessing_steps()
    kept = [
        step
        for step in steps
        if phase_transforms([step], EVALUATION)
        and (phase_transforms([step], INFERENCE) or "image" not in _keys(phase_transforms([step], EVALUATION)[0]))
    ]
    return compose_config(kept, EVALUATION)


def training_transforms(dataset: Dataset) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(deterministic, training_only)``: the validation chain's steps, and what the training chain adds after them.
    The evaluation-only steps of the first (the label kept as read) are off in training (``keep_input_label``)."""
    deterministic = served_evaluation(dataset)["transforms"]
    training = phase_transforms(dataset.component_class.preprocessing_steps(), TRAINING)
    shared = [step for step in deterministic if step in training]
    if training[: len(shared)] != shared:
        raise ValueError(
            f"{dataset.component}: the training chain does not start with the validation chain's steps; "
            "put the training-only steps (crops) after the shared ones in preprocessing_steps()"
        )
    return deterministic, training[len(shared) :]


def scores_whole_volumes(dataset: Dataset) -> bool:
    """True when the validation/test volumes keep their whole extent (no crop/pad to ``roi_size``) while the training
    volumes are cropped or padded to it."""
    steps = dataset.component_class.preprocessing_steps()
    targets = [step["_target_"] for step in served_evaluation(dataset)["transforms"]]
    return "ResizeWithPadOrCropd" not in targets and "ResizeWithPadOrCropd" in [
        step["_target_"] for step in phase_transforms(steps, TRAINING)
    ]
