"""The check of a bundle run's settings, before anything is built: one clear line per problem.

Every generated bundle calls :func:`check_settings` in ``initialize`` (the override keys,
:mod:`calib_monai.bundle.overrides`; the values; the selection rule's metrics; building ``@loss`` runs its checks)
and :func:`check_data_settings` in each step that reads data. Under ``ConfigWorkflow(**overrides)`` there is no
command line: the values are checked, the keys cannot be.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from calib_monai.checks import is_real_number, is_whole_number

from .overrides import check_override_keys, nearest, runner_arguments

__all__ = ["check_data_settings", "check_settings"]


def _problem(key: str, value: Any, what: str, fix: str = "") -> ValueError:
    return ValueError(f"{key} = {value!r} is not valid: {what}" + (f"; {fix}" if fix else ""))


def _int_at_least(key: str, value: Any, minimum: int, meaning: str) -> None:
    if not is_whole_number(value) or value < minimum:
        raise _problem(
            key, value, f"{meaning} must be a whole number >= {minimum}", f"pass e.g. --{key} {max(minimum, 2)}"
        )


def _check_roi_size(value: Any) -> None:
    fix = 'pass three sizes, e.g. --roi_size "[96,96,-1]" (-1 keeps an axis\'s extent)'
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise _problem("roi_size", value, "the preprocessed volume size must be a list [H, W, D]", fix)
    if not all(is_whole_number(v) and (v > 0 or v == -1) for v in value):
        raise _problem("roi_size", value, "each size must be a positive whole number or -1", fix)


def _label_count(label_names: Any) -> int | None:
    if isinstance(label_names, Mapping):
        keys = [str(k) for k in label_names]
        if keys != [str(i) for i in range(len(keys))]:
            raise _problem(
                "label_names",
                dict(label_names),
                "the classes must be named '0', '1', ... in order",
                """pass e.g. --label_names "{'0': 'background', '1': 'organ'}\"""",
            )
        return len(keys)
    if isinstance(label_names, (list, tuple)):
        return len(label_names)
    return None


def _check_value(key: str, value: Any) -> None:
    if key == "num_classes":
        _int_at_least(key, value, 2, "the number of classes including background")
    elif key == "in_channels":
        _int_at_least(key, value, 1, "the number of input channels")
    elif key in ("epochs", "batch_size", "val_interval", "loss_log_interval"):
        _int_at_least(key, value, 1, key.replace("_", " "))
    elif key == "roi_size":
        _check_roi_size(value)
    elif key == "lr":
        if not is_real_number(value) or not (math.isfinite(value) and value > 0):
            raise _problem(key, value, "the learning rate must be a finite number > 0", "pass e.g. --lr 0.001")
    elif key == "train_fraction":
        if not is_real_number(value) or not 0 < value <= 1:
            raise _problem(
                key, value, "the share of training cases must lie in (0, 1]", "pass e.g. --train_fraction 0.5"
            )
    elif key == "selection_mode":
        if value not in ("max", "min"):
            raise _problem(key, value, "must be 'max' (higher is better: DSC) or 'min' (NLL, ECE)")
    elif key == "seed" and not is_whole_number(value):
        raise _problem(key, value, "the seed must be a whole number", "pass e.g. --seed 0")
    elif key == "device":
        _check_device(value)


def _check_device(value: Any) -> None:
    """A device torch knows and this machine has (not torch's bare ``AssertionError`` when the network moves)."""
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        raise _problem("device", value, "not a device torch knows", "pass --device cpu or --device cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise _problem("device", value, "this machine has no CUDA GPU that torch can use", "pass --device cpu")


def _check_selection(selection_metric: Any, selection_bounds: Any, metrics: Sequence[str]) -> None:
    metrics = list(metrics)
    if selection_metric is not None and selection_metric not in metrics:
        raise _problem(
            "selection_metric",
            selection_metric,
            f"the validation computes {metrics}",
            f"pass --selection_metric <one of them>{nearest(str(selection_metric), metrics, '')}",
        )
    if selection_bounds is None:
        return
    if not isinstance(selection_bounds, Mapping):
        raise _problem(
            "selection_bounds",
            selection_bounds,
            "must be {metric: upper bound}",
            """pass e.g. --selection_bounds '{"val_ece": 0.05}'""",
        )
    for name, bound in selection_bounds.items():
        if name not in metrics:
            raise _problem(
                "selection_bounds",
                dict(selection_bounds),
                f"{name!r} is not a metric of the validation, "
                f"which computes {metrics}{nearest(str(name), metrics, '')}",
            )
        if not is_real_number(bound) or not math.isfinite(bound):
            raise _problem("selection_bounds", dict(selection_bounds), f"the bound of {name!r} must be a finite number")


def check_settings(
    metrics: Mapping[str, Any] | Sequence[str] | None = None,
    loss: Any = None,
    argv: Sequence[str] | None = None,
    **settings: Any,
) -> bool:
    """Check a bundle run's settings; a ValueError naming the key, the value and the fix. Returns True.

    Args:
        metrics: the validation's metrics (names or dicts), which ``selection_metric`` and ``selection_bounds`` name.
        loss: the built loss (``@loss``: its constructor's checks run now); recorded by class, not inspected.
        argv: the command line (default ``sys.argv``); its overrides are checked when it runs ``monai.bundle run``.
        settings: config values by key (``num_classes``, ``roi_size``, ``lr``, ``selection_mode``, ``device``...);
            unknown keys are not checked. They are recorded for ``TrainingCheckpoint`` (``record_run_settings``).
    """
    from .runtime import record_run_settings

    arguments = runner_arguments(argv)
    parser = check_override_keys(arguments) if arguments is not None else None
    for key, value in settings.items():
        _check_value(key, value)
    record_run_settings(settings, loss, arguments, parser)
    count = _label_count(settings.get("label_names"))
    classes = settings.get("num_classes")
    if count is not None and is_whole_number(classes) and count != classes:
        raise _problem(
            "num_classes",
            classes,
            f"label_names names {count} classes ({settings['label_names']})",
            "pass --num_classes and --label_names that agree",
        )
    if metrics is not None:
        names = [
            name
            for group in ([metrics] if isinstance(metrics, Mapping) else metrics)
            for name in (group if isinstance(group, (Mapping, list, tuple)) else [group])
            if group
        ]
        _check_selection(settings.get("selection_metric"), settings.get("selection_bounds"), names)
    return True


def _data_description(data: Any) -> str:
    root = data._dataset_root() if hasattr(data, "_dataset_root") else None
    if root and (Path(root) / "dataset.json").is_file():
        return str(Path(root) / "dataset.json")
    name = f"{type(data).__name__} ({getattr(data, 'source', '')})"
    return f"{name} in {root}" if root else name


def check_data_settings(data: Any, num_classes: Any = None, in_channels: Any = None, label_names: Any = None) -> bool:
    """``num_classes``, ``in_channels`` and ``label_names`` against the data component's; a ValueError else."""
    where = _data_description(data)
    names = {str(k): str(v) for k, v in dict(data.label_names).items()}
    if num_classes is not None and num_classes != len(names):
        raise _problem(
            "num_classes",
            num_classes,
            f"{where} describes {len(names)} classes ({names})",
            f"pass --num_classes {len(names)} (and --label_names naming those classes)",
        )
    channels = getattr(data, "channel_names", None)
    if in_channels is not None and channels is not None and in_channels != len(channels):
        raise _problem(
            "in_channels",
            in_channels,
            f"{where} describes {len(channels)} input channel(s) ({', '.join(channels)})",
            f"pass --in_channels {len(channels)}",
        )
    if label_names is not None:
        given = dict(label_names) if isinstance(label_names, Mapping) else dict(enumerate(label_names))
        given = {str(k): str(v) for k, v in given.items()}
        if {k: v.lower() for k, v in given.items()} != {k: v.lower() for k, v in names.items()}:
            json_names = "{" + ", ".join(f'"{k}": "{v}"' for k, v in names.items()) + "}"
            raise _problem(
                "label_names",
                given,
                f"{where} names its classes {names}",
                f"pass --label_names '{json_names}' (the names label the report columns and segments)",
            )
    return True
