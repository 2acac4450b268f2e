"""Preprocessing as MONAI bundle config: one transform list per data set, and the chains of its phases derived from it.

Each component states its preprocessing once, ``preprocessing_steps()``: MONAI config items that refer to the
component (``"$@data.spacing"``) and the bundle's ``"@roi_size"``, which the bundles write out and the component
composes (``compose``). A step may be limited to phases (``only``):

- ``training``: every step;
- ``evaluation``: the steps not limited to training (a window centred on the label is training-only);
- ``inference``: the evaluation steps that need no label, on the image only, and no crop/pad to ``roi_size``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from monai.bundle import ConfigParser
from monai.transforms import Compose

__all__ = [
    "EVALUATION",
    "INFERENCE",
    "PHASES",
    "TRAINING",
    "check_labels",
    "compose",
    "compose_config",
    "crop_around_label",
    "image_only",
    "INPUT_LABEL",
    "keep_input_label",
    "only",
    "pad_or_crop",
    "phase_of_subset",
    "read_as_ras",
    "phase_transforms",
    "resample",
    "resize",
    "scale_to_unit",
    "to_float32",
    "window",
]

IMAGE, LABEL = "image", "label"
# the label as read, on the input grid (keep_input_label); not "label_...": MONAI reads such keys as meta dicts
INPUT_LABEL = "input_label"
KEYS = [IMAGE, LABEL]
TRAINING, EVALUATION, INFERENCE = "training", "evaluation", "inference"
PHASES = (TRAINING, EVALUATION, INFERENCE)
# steps that read the label (checks, label mappings), and the crop/pad to roi_size (inference covers the whole image)
LABELLED = (TRAINING, EVALUATION)
_PHASES_KEY = "_phases_"  # marks a limited step in the Python list; never written to a config
# arguments given once per key (a list as long as "keys"): image_only keeps the image's entry
_PER_KEY_ARGS = ("mode", "padding_mode", "anti_aliasing", "align_corners")
# MONAI's nibabel-world axis labels, explicit (the default is deprecated)
RAS_LABELS = "$(('L', 'R'), ('P', 'A'), ('I', 'S'))"


def only(phases: Iterable[str], step: Mapping[str, Any]) -> dict[str, Any]:
    """``step`` limited to ``phases`` (a subset of ``PHASES``)."""
    phases = tuple(phases)
    unknown = sorted(set(phases) - set(PHASES))
    if unknown or not phases:
        raise ValueError(f"phases must be a non-empty subset of {PHASES}, got {phases}")
    return {**step, _PHASES_KEY: phases}


def phase_of_subset(subset: str) -> str:
    """The phase whose chain preprocesses ``subset``: training volumes train, validation and test volumes are scored."""
    phases = {"training": TRAINING, "validation": EVALUATION, "test": EVALUATION}
    if subset not in phases:
        raise ValueError(f"subset must be one of {tuple(phases)}, got {subset!r}")
    return phases[subset]


def image_only(step: Mapping[str, Any]) -> dict[str, Any]:
    """``step`` on the image alone: ``keys`` without ``"label"`` (and the per-key arguments, e.g. ``mode``, without
    the label's entry), ``label_key`` None (``LoadBUSId``). A step whose only key is the label, or that chooses a crop
    from the label, has no image-only form: limit it to labelled phases with ``only``."""
    name = step.get("_target_", "?")
    if step.get("source_key") == LABEL:
        raise ValueError(f"{name} reads the label (source_key 'label'): limit it to training with only()")
    out = dict(step)
    if "label_key" in out:
        out["label_key"] = None
    if "keys" not in step:
        return out
    keys = [step["keys"]] if isinstance(step["keys"], str) else list(step["keys"])
    kept = [i for i, key in enumerate(keys) if key != LABEL]
    if not kept:
        raise ValueError(f"{name} transforms the label only: limit it to labelled phases with only()")

    def pick(values: list):
        return values[kept[0]] if len(kept) == 1 else [values[i] for i in kept]

    out["keys"] = pick(keys)
    for arg in _PER_KEY_ARGS:
        if isinstance(step.get(arg), list) and len(step[arg]) == len(keys):
            out[arg] = pick(step[arg])
    return out


def phase_transforms(steps: Sequence[Mapping[str, Any]], phase: str) -> list[dict[str, Any]]:
    """The config items of the ``phase`` chain (``training``, ``evaluation`` or ``inference``) of a step list."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    chain = []
    for step in steps:
        if phase not in step.get(_PHASES_KEY, PHASES):
            continue
        step = {k: v for k, v in step.items() if k != _PHASES_KEY}
        chain.append(image_only(step) if phase == INFERENCE else step)
    return copy.deepcopy(chain)


def compose_config(steps: Sequence[Mapping[str, Any]], phase: str) -> dict[str, Any]:
    """The ``Compose`` config item of the ``phase`` chain, as the bundles write it."""
    return {"_target_": "Compose", "transforms": phase_transforms(steps, phase)}


def compose(steps: Sequence[Mapping[str, Any]], phase: str, component) -> Compose:
    """The ``phase`` chain of ``steps`` for ``component``, instantiated as a bundle would: ``@data`` is the component,
    ``@roi_size`` its ``roi_size``, ``@keep_input_label`` false."""
    parser = ConfigParser(
        {
            "data": component,
            "roi_size": list(component.roi_size),
            "keep_input_label": False,
            "preprocessing": compose_config(steps, phase),
        },
        globals={"calib_monai": "calib_monai"},
    )
    return parser.get_parsed_content("preprocessing")


# ---- the steps the data sets share -------------------------------------------------------------------------------
def check_labels() -> dict[str, Any]:
    """Shapes, NaN and the label values the component's files may hold (before any remapping)."""
    return only(
        LABELLED,
        {
            "_target_": "calib_monai.data.ValidateSegmentationd",
            "allowed_labels": "$@data.raw_label_values",
            "label_description": "$@data.label_description",
        },
    )


def keep_input_label() -> dict[str, Any]:
    """The label as read kept under ``INPUT_LABEL`` (``KeepInputLabeld``): the truth on the grid the delivered
    segmentation is on. Evaluation chain only, where the bundle sets ``keep_input_label`` (``evaluate.json``)."""
    step = {"_target_": "calib_monai.data.KeepInputLabeld", "keys": LABEL, "names": INPUT_LABEL}
    # as_bool: the command line's --keep_input_label false is the string "false", which is truthy
    return only(
        (EVALUATION,), {**step, "_disabled_": "$not calib_monai.bundle.as_bool(@keep_input_label, 'keep_input_label')"}
    )


def to_float32() -> dict[str, Any]:
    return {"_target_": "EnsureTyped", "keys": list(KEYS), "dtype": "$torch.float32", "track_meta": True}


def read_as_ras(label_mapping: Mapping[int, int] | None = None) -> list[dict[str, Any]]:
    """The opening every volume data set shares: read (``CheckedLoadImaged``: an image may be one file per channel),
    channels first (counted against the data set's), check the labels (then map them to the component's classes,
    when the files use other values), the label kept as read (evaluation), float32, RAS (the slices, the last axis,
    are axial)."""
    mapped = []
    if label_mapping:
        orig, target = [int(k) for k in label_mapping], [int(v) for v in label_mapping.values()]
        step = {"_target_": "MapLabelValued", "keys": LABEL, "orig_labels": orig, "target_labels": target}
        mapped = [only(LABELLED, step)]
    channel_first = {
        "_target_": "calib_monai.data.ChannelFirstd",
        "keys": list(KEYS),
        "image_channels": "$@data.channel_names",
        "source": "$@data.source",
    }
    return [
        {"_target_": "calib_monai.data.CheckedLoadImaged", "keys": list(KEYS), "image_only": True},
        channel_first,
        check_labels(),
        *mapped,
        keep_input_label(),
        to_float32(),
        {"_target_": "Orientationd", "keys": list(KEYS), "axcodes": "RAS", "labels": RAS_LABELS},
    ]


def resample() -> dict[str, Any]:
    """Resampling to the component's ``spacing`` (mm); off when it is None. float32: the default float64 takes twice
    the memory and time on CT-sized volumes."""
    return {
        "_target_": "Spacingd",
        "keys": list(KEYS),
        "pixdim": "$@data.spacing",
        "mode": ["bilinear", "nearest"],
        "dtype": "$torch.float32",
        "_disabled_": "$@data.spacing is None",
    }


def resize(spatial_size: str) -> dict[str, Any]:
    """Resize to ``spatial_size`` (``-1`` keeps an axis): linear image, anti-aliased when shrinking; nearest label."""
    return {
        "_target_": "Resized",
        "keys": list(KEYS),
        "spatial_size": spatial_size,
        "mode": ["trilinear", "nearest"],
        "anti_aliasing": [True, False],
    }


def scale_to_unit() -> dict[str, Any]:
    """Intensities to [0, 1] by the component's ``intensity`` rule (``ScaleIntensityToUnitd``)."""
    return {"_target_": "calib_monai.data.ScaleIntensityToUnitd", "keys": IMAGE, "intensity": "$@data.intensity"}


def window() -> dict[str, Any]:
    """The component's CT ``window`` (low, high) in HU scaled to [0, 1] with clipping."""
    return {
        "_target_": "ScaleIntensityRanged",
        "keys": IMAGE,
        "a_min": "$@data.window[0]",
        "a_max": "$@data.window[1]",
        "b_min": 0.0,
        "b_max": 1.0,
        "clip": True,
    }


def crop_around_label(disabled: str | None = None) -> dict[str, Any]:
    """A ``roi_size`` window centred on the label's foreground, for training only (a scored volume is never cropped
    by its label); ``disabled``: an expression that turns it off."""
    step = {
        "_target_": "calib_monai.data.CropAroundForegroundd",
        "keys": list(KEYS),
        "source_key": LABEL,
        "roi_size": "@roi_size",
    }
    return only((TRAINING,), {**step, **({"_disabled_": disabled} if disabled else {})})


def pad_or_crop(phases: Iterable[str] = LABELLED) -> dict[str, Any]:
    """Centre crop/pad to ``roi_size`` (axes with size -1 keep their extent)."""
    return only(phases, {"_target_": "ResizeWithPadOrCropd", "keys": list(KEYS), "spatial_size": "@roi_size"})
