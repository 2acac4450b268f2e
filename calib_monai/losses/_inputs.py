"""Input checks shared by every loss of :mod:`calib_monai.losses`.

:func:`prepare_inputs` takes logits ``(B, C, H, W[, D])`` and integer labels ``(B, 1, H, W[, D])`` or ``(B, H, W[,
D])`` (float holding integers, or ``MetaTensor``) and returns plain tensors: logits unchanged and labels ``int64 (B,
H, W[, D])``; bad input is a ``ValueError`` naming what was seen and expected. Shapes are checked on every call. The
*value* checks (finite logits, labels in ``[0, C)``) read a reduction back to the host, a GPU stall, so they run

* always for CPU tensors;
* on the first call of each loss instance on an accelerator (``set_value_checks("always")`` or
  ``CALIB_MONAI_VALUE_CHECKS=always``: every call; ``"never"``: not at all);
* never for ``meta`` tensors (they have no values).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from calib_monai.checks import check_option

__all__ = [
    "VALUE_CHECK_MODES",
    "check_reduction",
    "plain_tensor",
    "prepare_inputs",
    "reduce_per_voxel",
    "set_value_checks",
    "value_checks_due",
]

#: ``"first"`` (default: first call per loss on an accelerator, every call on CPU), ``"always"``, ``"never"``.
VALUE_CHECK_MODES = ("first", "always", "never")
_value_checks = os.environ.get("CALIB_MONAI_VALUE_CHECKS", "first")


def plain_tensor(x: torch.Tensor) -> torch.Tensor:
    """View a tensor subclass (e.g. MONAI's ``MetaTensor``) as a plain ``torch.Tensor``: no copy, autograd kept.

    Losses only need the values; dropping the subclass avoids MetaTensor's per-operation metadata bookkeeping.
    (The metrics' :func:`calib_monai.metrics.calibration.detached_plain_tensor` also leaves the autograd graph.)
    """
    return x if type(x) is torch.Tensor else x.as_subclass(torch.Tensor)


def set_value_checks(mode: str) -> str:
    """Set when the losses check input *values* (see the module docstring); returns the previous mode."""
    global _value_checks
    previous, _value_checks = _value_checks, check_option("value checks mode", mode, VALUE_CHECK_MODES)
    return previous


def value_checks_due(owner: object | None, device: torch.device) -> bool:
    """Whether the loss ``owner`` checks values of tensors on ``device`` in this call (and records that it did)."""
    mode = check_option("CALIB_MONAI_VALUE_CHECKS", _value_checks, VALUE_CHECK_MODES)
    if device.type == "meta" or mode == "never":
        return False
    if mode == "always" or device.type == "cpu" or owner is None:
        return True
    checked = getattr(owner, "_calib_monai_values_checked", set())
    if device in checked:
        return False
    # plain attribute, not a buffer: it must not enter state_dicts or checkpoints
    object.__setattr__(owner, "_calib_monai_values_checked", checked | {device})
    return True


def check_reduction(reduction: str, options: Sequence[str] = ("mean", "sum", "none")) -> str:
    """``reduction`` if it is one of ``options``, else ``"reduction must be one of ..."`` (a ValueError)."""
    return check_option("reduction", str(reduction), options)


def _check_logits(
    logits: torch.Tensor, num_classes: int | None, spatial_dims: int | None, check_values: bool
) -> torch.Tensor:
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"logits must be a torch.Tensor of shape (B, C, H, W[, D]), got {type(logits).__name__}.")
    logits = plain_tensor(logits)
    if logits.ndim not in (4, 5):
        raise ValueError(
            f"logits must have shape (B, C, H, W) or (B, C, H, W, D) (4 or 5 dims), got shape {tuple(logits.shape)}."
        )
    if spatial_dims is not None and logits.ndim - 2 != spatial_dims:
        raise ValueError(
            f"logits must have {spatial_dims} spatial dims (shape with {spatial_dims + 2} dims), "
            f"got shape {tuple(logits.shape)} ({logits.ndim - 2} spatial dims)."
        )
    if logits.numel() == 0:
        raise ValueError(
            f"logits are empty (shape {tuple(logits.shape)}): a batch without samples or a spatial size of 0; the loss "
            "needs at least one voxel (check the data loader: an empty training subset or a crop of size 0)."
        )
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating point tensor, got dtype {logits.dtype}.")
    n_channels = logits.shape[1]
    if num_classes is not None and n_channels != num_classes:
        raise ValueError(
            f"logits must have {num_classes} channels (one per class), got {n_channels} channels "
            f"in shape {tuple(logits.shape)}."
        )
    if n_channels < 2:
        raise ValueError(
            f"logits must have at least 2 channels (softmax over classes), got shape {tuple(logits.shape)}."
        )
    if not check_values:
        return logits
    with torch.no_grad():
        # a sum is non-finite whenever an element is (and, rarely, on overflow): check elements only then
        if not bool(torch.isfinite(logits.sum())) and not bool(torch.isfinite(logits).all()):
            bad = logits[~torch.isfinite(logits)]
            raise ValueError(
                f"logits must be finite, got {bad.numel()} non-finite value(s) (first: {bad[0].item()}) "
                f"in shape {tuple(logits.shape)}."
            )
    return logits


def _check_labels(labels: torch.Tensor, logits: torch.Tensor, check_values: bool) -> torch.Tensor:
    if not isinstance(labels, torch.Tensor):
        labels = torch.as_tensor(labels)
    labels = plain_tensor(labels).detach()
    batch, n_classes, *spatial = logits.shape
    expected = f"(B, 1, *spatial) = {(batch, 1, *spatial)} or (B, *spatial) = {(batch, *spatial)}"
    if labels.ndim == logits.ndim and labels.shape[0] == batch and labels.shape[1] == 1:
        labels = labels[:, 0]
    elif labels.ndim == logits.ndim and labels.shape[1] != 1:
        raise ValueError(
            f"labels must be class indices of shape {expected}, got shape {tuple(labels.shape)} "
            f"(channel dim {labels.shape[1]}, expected 1; one-hot labels are not accepted)."
        )
    if tuple(labels.shape) != (batch, *spatial):
        raise ValueError(
            f"labels must have shape {expected} to match logits {tuple(logits.shape)}, got shape {tuple(labels.shape)}."
        )
    if labels.dtype == torch.bool:
        labels = labels.long()
    elif labels.is_floating_point() and check_values:
        # MONAI loaders often hand labels over as float tensors holding integers (NaN fails this test too)
        not_integer = labels != torch.round(labels)
        if bool(not_integer.any()):
            bad = labels[not_integer]
            raise ValueError(
                f"labels must hold integer class indices, got {bad.numel()} non-integer value(s) "
                f"(first: {bad[0].item()}) with dtype {labels.dtype}."
            )
        labels = labels.long()
    else:
        labels = labels.long()
    if labels.device != logits.device:
        labels = labels.to(logits.device)
    if not check_values:
        return labels
    lowest, highest = torch.aminmax(labels)
    lowest_v, highest_v = int(lowest), int(highest)
    if lowest_v < 0 or highest_v >= n_classes:
        raise ValueError(
            f"label values must lie in [0, {n_classes}) for logits with {n_classes} channels, "
            f"got values in [{lowest_v}, {highest_v}]."
        )
    return labels


def prepare_inputs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int | None = None,
    spatial_dims: int | None = None,
    owner: object | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check logits and labels and return them as plain tensors.

    Args:
        logits: ``(B, C, H, W)`` or ``(B, C, H, W, D)`` floating point, finite.
        labels: class indices in ``[0, C)``, shape ``(B, 1, *spatial)`` or ``(B, *spatial)``; any integer, bool or
            integer-valued float dtype; a ``MetaTensor`` is accepted.
        num_classes: if given, the number of channels the logits must have.
        spatial_dims: if given (2 or 3), the number of spatial dims the logits must have.
        owner: the loss calling; on an accelerator its values are checked on its first call only
            (:func:`value_checks_due`). None: values are checked whenever they can be.

    Returns:
        ``(logits, labels)``: logits as a plain tensor in the autograd graph; labels as ``int64`` ``(B, *spatial)``
        on the logits' device.

    Raises:
        ValueError: wrong rank, channel count or shape mismatch, non-integer or out-of-range labels, non-finite
            logits. The message names the shape or value seen and the one expected.
    """
    device = logits.device if isinstance(logits, torch.Tensor) else torch.device("cpu")
    check_values = value_checks_due(owner, device)
    logits = _check_logits(logits, num_classes, spatial_dims, check_values)
    return logits, _check_labels(labels, logits, check_values)


def reduce_per_voxel(per_voxel: torch.Tensor, reduction: str) -> torch.Tensor:
    """Reduce a ``(B, 1, *spatial)`` per-voxel loss map: ``"mean"`` over voxels, ``"sum"``, or ``"none"`` (the map)."""
    if reduction == "mean":
        return per_voxel.mean()
    if reduction == "sum":
        return per_voxel.sum()
    return per_voxel
