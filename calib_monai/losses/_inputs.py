"""Input checks shared by every loss of :mod:`calib_monai.losses` (:func:`prepare_inputs`), and the base class of the
per-voxel losses. Shapes are checked on every call; the *value* checks read a reduction back to the host, a GPU stall,
so they run on every call for CPU tensors, on the first call of each loss instance on an accelerator, never on
``meta`` tensors."""

from __future__ import annotations

import torch
from torch.nn.modules.loss import _Loss

from calib_monai.checks import check_option
from calib_monai.tensors import plain_tensor

__all__ = ["PerVoxelLoss", "prepare_inputs", "value_checks_due"]


def value_checks_due(owner: object | None, device: torch.device) -> bool:
    """Whether the loss ``owner`` checks values of tensors on ``device`` in this call (and records that it did)."""
    if device.type == "meta":
        return False
    if device.type == "cpu" or owner is None:
        return True
    checked = getattr(owner, "_calib_monai_values_checked", set())
    if device in checked:
        return False
    # plain attribute, not a buffer: it must not enter state_dicts or checkpoints
    object.__setattr__(owner, "_calib_monai_values_checked", checked | {device})
    return True


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
    labels = plain_tensor(torch.as_tensor(labels)).detach()
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
    if labels.is_floating_point() and check_values:
        # MONAI loaders often hand labels over as float tensors holding integers (NaN fails this test too)
        not_integer = labels != torch.round(labels)
        if bool(not_integer.any()):
            bad = labels[not_integer]
            raise ValueError(
                f"labels must hold integer class indices, got {bad.numel()} non-integer value(s) "
                f"(first: {bad[0].item()}) with dtype {labels.dtype}."
            )
    labels = labels.long().to(logits.device)
    if not check_values:
        return labels
    lowest, highest = (int(v) for v in torch.aminmax(labels))
    if lowest < 0 or highest >= n_classes:
        raise ValueError(
            f"label values must lie in [0, {n_classes}) for logits with {n_classes} channels, "
            f"got values in [{lowest}, {highest}]."
        )
    return labels


def prepare_inputs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int | None = None,
    spatial_dims: int | None = None,
    owner: object | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check logits and labels; return the logits as a plain tensor in the autograd graph and the labels as ``int64``
    ``(B, *spatial)`` on the logits' device.

    Args:
        logits: ``(B, C, H, W)`` or ``(B, C, H, W, D)`` floating point, finite.
        labels: class indices in ``[0, C)``, shape ``(B, 1, *spatial)`` or ``(B, *spatial)``; any integer, bool or
            integer-valued float dtype; a ``MetaTensor`` is accepted.
        num_classes, spatial_dims: if given, the channels and spatial dims the logits must have.
        owner: the loss calling (:func:`value_checks_due`); None: values are checked whenever they can be.

    Raises:
        ValueError: naming the shape or value seen and the one expected.
    """
    device = logits.device if isinstance(logits, torch.Tensor) else torch.device("cpu")
    check_values = value_checks_due(owner, device)
    logits = _check_logits(logits, num_classes, spatial_dims, check_values)
    return logits, _check_labels(labels, logits, check_values)


class PerVoxelLoss(_Loss):
    """A loss defined per voxel (:meth:`per_voxel`, ``(B, 1, *spatial)``) of checked logits and labels, reduced by
    ``reduction``: ``"mean"`` over voxels, ``"sum"``, or ``"none"`` for the map. ``classes`` and ``dim``, when a
    subclass sets them, are the channels and spatial dims the logits must have."""

    classes: int | None = None
    dim: int | None = None

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__(reduction=check_option("reduction", str(reduction), ("mean", "sum", "none")))

    def per_voxel(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The ``(B, 1, *spatial)`` loss map of plain logits and ``int64`` labels ``(B, *spatial)``."""
        raise NotImplementedError

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """
        Args:
            input: logits ``(B, C, H, W[, D])``.
            target: class indices ``(B, 1, H, W[, D])`` or ``(B, H, W[, D])``.
        """
        per_voxel = self.per_voxel(*prepare_inputs(input, target, self.classes, self.dim, owner=self))
        if self.reduction == "mean":
            return per_voxel.mean()
        return per_voxel.sum() if self.reduction == "sum" else per_voxel
