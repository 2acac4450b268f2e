"""The check of a bundle run's settings, before anything is built: one clear line per problem.

``python -m monai.bundle run <id> --config_file ... --key value`` adds any ``--key`` to the config silently, so
``--epoch 1`` (for ``--epochs``) used to train the default 40 epochs. Every generated bundle therefore calls, in its
``initialize``:

* :func:`check_settings`: the command-line overrides (``sys.argv`` as MONAI's runner parses it with python-fire, and
  the ``args_file`` it reads) name ids of the config files, or arguments of a component (``--loss#alpha``: an
  argument of the loss's ``_target_``); an unknown key is an error naming the nearest known one. Then the values of
  the run's settings (``num_classes``, ``roi_size``, ``epochs``...) and the selection rule's metric names, against
  the validation's metrics; building ``@loss`` for the check runs the loss constructor's value checks;

and its ``run`` (the steps that read data) calls :func:`check_data_settings`: ``num_classes``, ``in_channels`` and
``label_names`` against the data set's own description (``dataset.json``, or the component's facts).

Built through ``ConfigWorkflow(..., **overrides)`` in Python there is no command line: the values are still checked,
the keys cannot be (the workflow does not keep which ones were overridden).
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RunnerArguments", "check_data_settings", "check_override_keys", "check_settings", "runner_arguments"]

#: ``monai.bundle.scripts.run``'s own arguments (and those it passes on to ``create_workflow``): not config ids.
RUN_ARGUMENTS = (
    "run_id",
    "init_id",
    "final_id",
    "meta_file",
    "config_file",
    "logging_file",
    "tracking",
    "args_file",
    "workflow_name",
    "workflow_type",
    "properties_path",
)
COMPONENT_EXAMPLE = "settings of a component are --<id>#<argument>, e.g. --loss#alpha 0.2"


@dataclass
class RunnerArguments:
    """What ``python -m monai.bundle run`` was given: the config files and the overrides, each with where it came
    from (``"the command line"`` or the ``args_file``)."""

    config_files: list[str]
    overrides: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    workflow_ids: tuple[str, ...] = ()  # the run_id, init_id and final_id asked for (an override may define them)


def _is_bundle_runner(argv: Sequence[str]) -> bool:
    main = Path(argv[0]) if argv else Path()
    return (
        main.name == "__main__.py"
        and main.parent.name == "bundle"
        and main.parent.parent.name == "monai"
        and (len(argv) > 1 and argv[1] == "run")
    )


def _parse(args: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
    """Positional arguments and ``--key value`` / ``--key=value`` pairs, values parsed as python-fire does."""
    from fire.parser import DefaultParseValue

    positional, named, i = [], {}, 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and len(arg) > 2:
            key, equals, value = arg[2:].partition("=")
            if not equals:
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    value, i = args[i + 1], i + 1
                else:
                    value = "True"  # a bare flag
            named[key.replace("-", "_")] = DefaultParseValue(value)
        else:
            positional.append(DefaultParseValue(arg))
        i += 1
    return positional, named


def _config_file_list(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    value = str(value)
    return value.split(",") if "," in value and not Path(value).is_file() else [value]


def runner_arguments(argv: Sequence[str] | None = None) -> RunnerArguments | None:
    """The config files and overrides of this process when it is ``python -m monai.bundle run ...`` (``argv``:
    ``sys.argv`` by default), else None. Overrides from ``--args_file`` come first, the command line wins."""
    argv = list(sys.argv if argv is None else argv)
    if not _is_bundle_runner(argv):
        return None
    positional, named = _parse(argv[2:])
    run_args = dict(zip(RUN_ARGUMENTS, positional))  # `run training ...`: run_id = "training"
    run_args.update({k: v for k, v in named.items() if k in RUN_ARGUMENTS})
    overrides = {k: v for k, v in named.items() if k not in RUN_ARGUMENTS}
    sources = dict.fromkeys(overrides, "the command line")
    if run_args.get("args_file"):
        from monai.bundle import ConfigParser

        path = str(run_args["args_file"])
        from_file = ConfigParser.load_config_file(path)
        for key, value in from_file.items():
            if key in RUN_ARGUMENTS:
                run_args.setdefault(key, value)
            elif key not in overrides:
                overrides[key], sources[key] = value, f"args_file {path}"
    files = _config_file_list(run_args["config_file"]) if run_args.get("config_file") is not None else []
    workflow_ids = tuple(str(run_args[k]) for k in ("run_id", "init_id", "final_id") if run_args.get(k))
    return RunnerArguments(files, overrides, sources, workflow_ids)


def _likeness(word: str, candidate: str) -> float:
    """How alike two keys are: the whole keys, plus what follows their common prefix (``val_dic`` is nearer
    ``val_mean_dice`` than ``val_ece``)."""
    shared = len(os.path.commonprefix([word, candidate]))
    rest = difflib.SequenceMatcher(None, word[shared:], candidate[shared:]).ratio() if shared >= 3 else 0.0
    return difflib.SequenceMatcher(None, word, candidate).ratio() + rest


def _nearest(word: str, candidates: Sequence[str], prefix: str = "--") -> str:
    close = difflib.get_close_matches(word, list(candidates), n=5, cutoff=0.6)
    return f"; did you mean {prefix}{max(close, key=lambda c: _likeness(word, c))}?" if close else ""


def _ids(config: Any, prefix: str = "") -> list[str]:
    """Every dict key of ``config`` as an id (``"loss#alpha"``), lists not entered (their items are indices)."""
    out = []
    if isinstance(config, Mapping):
        for key, value in config.items():
            out.append(f"{prefix}{key}")
            out += _ids(value, f"{prefix}{key}#")
    return out


def _arguments_of(target: str) -> tuple[list[str], bool] | None:
    """The constructor argument names of a ``_target_`` and whether it takes ``**kwargs``; None if not importable."""
    from monai.utils import optional_import

    module, _, name = str(target).rpartition(".")
    obj = None
    if module:
        obj, found = optional_import(module, name=name)
        obj = obj if found else None
    if obj is None:  # a short MONAI name ("Compose", "SupervisedTrainer")
        from monai.bundle.config_item import ComponentLocator

        locations = ComponentLocator().get_component_module_name(str(target))
        if isinstance(locations, str):
            obj, _ = optional_import(locations, name=str(target))
    if obj is None or not callable(obj):
        return None
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return None
    names = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return names, any(p.kind == p.VAR_KEYWORD for p in parameters)


def _deepest(parser: Any, key: str) -> str:
    """The longest prefix of the id ``key`` that exists in ``parser`` ("" for none)."""
    parts = key.split("#")
    for end in range(len(parts) - 1, 0, -1):
        if "#".join(parts[:end]) in parser:
            return "#".join(parts[:end])
    return ""


def _shown(value: Any) -> str:
    """A value as it was typed: strings as they are, the rest as JSON (repr where JSON has no form)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _referenced(key: str, overrides: Mapping[str, Any]) -> bool:
    return any(isinstance(v, str) and f"@{key}" in v for k, v in overrides.items() if k != key)


def check_override_keys(arguments: RunnerArguments) -> None:
    """A ValueError for the first override that names no id of the config files and no argument of a component."""
    from monai.bundle import ConfigParser

    base = ConfigParser()
    base.read_config(arguments.config_files)
    merged = ConfigParser(copy.deepcopy(base.get()))
    unplaced = set()  # overrides that cannot even be set (an index past the end of a list)
    for key, value in arguments.overrides.items():
        try:
            merged[key.replace("::", "#")] = value
        except (KeyError, IndexError, TypeError, ValueError):
            unplaced.add(key)
    names = ", ".join(Path(f).name for f in arguments.config_files)
    known = _ids(base.get())
    for raw_key in arguments.overrides:
        key = raw_key.replace("::", "#")
        defined = key in base or key in arguments.workflow_ids or _referenced(key, arguments.overrides)
        if raw_key not in unplaced and defined:
            continue
        value = arguments.overrides[raw_key]
        where = f"--{raw_key} {_shown(value)} ({arguments.sources[raw_key]})"
        parent, _, last = key.rpartition("#")
        owner = merged[parent] if parent and parent in merged else None
        if isinstance(owner, list) or raw_key in unplaced:
            deepest = _deepest(merged, key)
            items = merged[deepest] if deepest else None
            if isinstance(items, list):
                raise ValueError(f"{where}: {deepest} has {len(items)} items (indices 0 to {len(items) - 1})")
        if isinstance(owner, Mapping) and "_target_" in owner:
            signature = _arguments_of(owner["_target_"])
            if signature is None or signature[1] or last in signature[0]:
                continue  # an argument of the component (or one it may take)
            raise ValueError(
                f"{where}: {owner['_target_']} has no argument {last!r}"
                f"{_nearest(last, signature[0], f'--{parent}#')} (its arguments: "
                f"{', '.join(signature[0])})"
            )
        raise ValueError(
            f"{where} is not a setting of {names}{_nearest(key, known)}; check the spelling "
            f"({COMPONENT_EXAMPLE}; python -m monai.bundle run adds unknown keys without a word)"
        )


# ---------------------------------------------------------------------------------------------------- values


def _problem(key: str, value: Any, what: str, fix: str = "") -> ValueError:
    return ValueError(f"{key} = {value!r} is not valid: {what}" + (f"; {fix}" if fix else ""))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_at_least(key: str, value: Any, minimum: int, meaning: str) -> None:
    if not _is_int(value) or value < minimum:
        raise _problem(
            key, value, f"{meaning} must be a whole number >= {minimum}", f"pass e.g. --{key} {max(minimum, 2)}"
        )


def _check_roi_size(value: Any) -> None:
    fix = 'pass three sizes, e.g. --roi_size "[96,96,-1]" (-1 keeps an axis\'s extent)'
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise _problem("roi_size", value, "the preprocessed volume size must be a list [H, W, D]", fix)
    if not all(_is_int(v) and (v > 0 or v == -1) for v in value):
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
    if key in ("num_classes",):
        _int_at_least(key, value, 2, "the number of classes including background")
    elif key in ("in_channels",):
        _int_at_least(key, value, 1, "the number of input channels")
    elif key in ("epochs", "batch_size", "val_interval", "loss_log_interval"):
        _int_at_least(key, value, 1, key.replace("_", " "))
    elif key == "roi_size":
        _check_roi_size(value)
    elif key == "lr":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise _problem(key, value, "the learning rate must be a finite number > 0", "pass e.g. --lr 0.001")
    elif key == "train_fraction":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise _problem(
                key, value, "the share of training cases must lie in (0, 1]", "pass e.g. --train_fraction 0.5"
            )
    elif key == "selection_mode":
        if value not in ("max", "min"):
            raise _problem(key, value, "must be 'max' (higher is better: DSC) or 'min' (NLL, ECE)")
    elif key == "seed" and not _is_int(value):
        raise _problem(key, value, "the seed must be a whole number", "pass e.g. --seed 0")


def _check_selection(selection_metric: Any, selection_bounds: Any, metrics: Sequence[str]) -> None:
    metrics = list(metrics)
    if selection_metric is not None and selection_metric not in metrics:
        raise _problem(
            "selection_metric",
            selection_metric,
            f"the validation computes {metrics}",
            f"pass --selection_metric <one of them>{_nearest(str(selection_metric), metrics, '')}",
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
                f"which computes {metrics}{_nearest(str(name), metrics, '')}",
            )
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound):
            raise _problem("selection_bounds", dict(selection_bounds), f"the bound of {name!r} must be a finite number")


def check_settings(
    metrics: Mapping[str, Any] | Sequence[str] | None = None,
    loss: Any = None,
    argv: Sequence[str] | None = None,
    **settings: Any,
) -> bool:
    """Check a bundle run's settings before anything is built; a ValueError naming the key, the value and the fix.

    Args:
        metrics: the validation's metrics (``key_metric`` and ``additional_metrics``: names or dicts), which
            ``selection_metric`` and ``selection_bounds`` must name.
        loss: the built loss (the bundles pass ``@loss``, so its constructor's value checks run now); not inspected.
        argv: the command line (default ``sys.argv``); its overrides are checked when it runs ``monai.bundle run``.
        settings: config values by key: ``num_classes``, ``in_channels``, ``label_names``, ``roi_size``, ``epochs``,
            ``batch_size``, ``lr``, ``val_interval``, ``train_fraction``, ``seed``, ``selection_metric``,
            ``selection_mode``, ``selection_bounds``; others are not checked.

    Returns:
        True (bundle configs call it in ``initialize``).
    """
    arguments = runner_arguments(argv)
    if arguments is not None:
        check_override_keys(arguments)
    for key, value in settings.items():
        _check_value(key, value)
    count = _label_count(settings.get("label_names"))
    classes = settings.get("num_classes")
    if count is not None and _is_int(classes) and count != classes:
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
    """``num_classes``, ``in_channels`` and ``label_names`` of a bundle against its data component (the classes and
    channels its ``dataset.json`` or facts describe); a ValueError naming the key, both values and the fix."""
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
