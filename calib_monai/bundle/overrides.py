"""The command line of a bundle run, as MONAI's runner reads it, and the check of its override keys.

``python -m monai.bundle run`` adds any ``--key`` to the config silently: :func:`runner_arguments` re-reads
``sys.argv`` as the runner parses it (python-fire's values, plus its ``args_file``) and :func:`check_override_keys`
refuses a key that names no config id and no argument of a component (``--loss#alpha``), naming the nearest key.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "COMPONENT_EXAMPLE",
    "OWN_KEYS",
    "RUN_ARGUMENTS",
    "RunnerArguments",
    "check_override_keys",
    "nearest",
    "runner_arguments",
]

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
#: keys of calib_monai's own that no config file holds: ``--resume_changes allow`` (``TrainingCheckpoint``)
OWN_KEYS = ("resume_changes",)
COMPONENT_EXAMPLE = "settings of a component are --<id>#<argument>, e.g. --loss#alpha 0.2"


@dataclass
class RunnerArguments:
    """What ``python -m monai.bundle run`` was given: the config files and the overrides, each with its source
    (``"the command line"`` or the ``args_file``)."""

    config_files: list[str]
    overrides: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    workflow_ids: tuple[str, ...] = ()  # the run_id, init_id and final_id asked for (an override may define them)


def is_bundle_runner(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is ``python -m monai.bundle run ...``."""
    return len(argv) > 1 and argv[1] == "run" and Path(argv[0]).parts[-3:] == ("monai", "bundle", "__main__.py")


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
    if not is_bundle_runner(argv):
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
    tails = word[shared:], candidate[shared:]
    rest = 0.0 if shared < 3 else difflib.SequenceMatcher(None, *tails).ratio() if all(tails) else 1.0
    return difflib.SequenceMatcher(None, word, candidate).ratio() + rest


def nearest(word: str, candidates: Sequence[str], prefix: str = "--") -> str:
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


def _arguments_of(target: str) -> tuple[list[str], bool, set[str]] | None:
    """A ``_target_``'s argument names, whether it takes ``**kwargs``, and those defaulting to a bool; None: unknown."""
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
    booleans = {p.name for p in parameters if isinstance(p.default, bool)}
    return names, any(p.kind == p.VAR_KEYWORD for p in parameters), booleans


def _deepest(parser: Any, key: str) -> str:
    """The longest prefix of the id ``key`` that exists in ``parser`` ("" for none)."""
    prefixes = ("#".join(key.split("#")[:end]) for end in range(key.count("#"), 0, -1))
    return next((prefix for prefix in prefixes if prefix in parser), "")


def _shown(value: Any) -> str:
    """A value as it was typed: strings as they are, the rest as JSON (else repr)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _referenced(key: str, overrides: Mapping[str, Any]) -> bool:
    return any(isinstance(v, str) and f"@{key}" in v for k, v in overrides.items() if k != key)


def check_override_keys(arguments: RunnerArguments) -> Any:
    """A ValueError for the first override that names no id of the config files and no argument of a component, or
    that passes ``false`` to a component's boolean argument (python-fire hands it over as the string "false", which
    counts as true); returns the config files as read (a ``ConfigParser``)."""
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
    for raw_key, value in arguments.overrides.items():
        key = raw_key.replace("::", "#")
        where = f"--{raw_key} {_shown(value)} ({arguments.sources[raw_key]})"
        parent, _, last = key.rpartition("#")
        owner = merged[parent] if parent and parent in merged else None
        target = owner["_target_"] if isinstance(owner, Mapping) and "_target_" in owner else None
        if target and isinstance(value, str) and value.strip().lower() == "false":
            signature = _arguments_of(target)
            if (signature is not None and last in signature[2]) or (key in base and isinstance(base[key], bool)):
                raise ValueError(
                    f"{where}: {target}'s {last} is a boolean, and python -m monai.bundle run hands {value} over as "
                    f"the string {value!r}, which counts as true; write --{raw_key} False"
                )
        defined = key in base or key in arguments.workflow_ids or key in OWN_KEYS
        if raw_key not in unplaced and (defined or _referenced(key, arguments.overrides)):
            continue
        if isinstance(owner, list) or raw_key in unplaced:
            deepest = _deepest(merged, key)
            items = merged[deepest] if deepest else None
            if isinstance(items, list):
                raise ValueError(f"{where}: {deepest} has {len(items)} items (indices 0 to {len(items) - 1})")
        if target:
            signature = _arguments_of(target)
            if signature is None or signature[1] or last in signature[0]:
                continue  # an argument of the component (or one it may take)
            raise ValueError(
                f"{where}: {target} has no argument {last!r}{nearest(last, signature[0], f'--{parent}#')} (its "
                f"arguments: {', '.join(signature[0])})"
            )
        raise ValueError(
            f"{where} is not a setting of {names}{nearest(key, known)}; check the spelling "
            f"({COMPONENT_EXAMPLE}; python -m monai.bundle run adds unknown keys without a word)"
        )
    return base
