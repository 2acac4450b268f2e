"""Test-time agreement: how much a network's segmentation of a case changes when the image is flipped.

On an image like its training images a network's segmentation changes little when the image is flipped (and the
output flipped back); on an unfamiliar one the passes disagree more. The score is the agreement of test-time
augmentation (Wang et al., Neurocomputing 2019), the mean pairwise Dice of the passes' segmentations, and the share
of voxels two passes label differently. One forward pass per flip (4 by default, the identity included). Unlike
MONAI's ``TestTimeAugmentation`` (random augmentations inverted with ``Invertd``), the flips are a fixed set, each its
own inverse, applied to any ``probs(image)`` callable.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["FlipAgreement", "IN_PLANE_FLIPS", "flip_agreement", "pairwise_dice"]

IN_PLANE_FLIPS: tuple[tuple[int, ...], ...] = ((), (0,), (1,), (0, 1))  # spatial axes of (C, H, W[, D]) to flip


@dataclass(frozen=True)
class FlipAgreement:
    """``dice``: per foreground class, the mean pairwise DSC of the passes' segmentations (NaN when the class is
    absent from every pass); ``mean_dice``: their mean over classes with a value (NaN if none); ``disagreement``:
    the mean over pairs of passes of the fraction of voxels labelled differently; ``passes``: forward passes run."""

    dice: tuple[float, ...]
    mean_dice: float
    disagreement: float
    passes: int


def pairwise_dice(labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per foreground class the mean DSC ``2|A and B| / (|A| + |B|)`` over the pairs of the label maps ``labels``
    ``(P, *spatial)`` (pairs where both are empty excluded; NaN when every pair is), and the mean fraction of voxels
    two maps label differently. Computed where ``labels`` are, counts in int64."""
    if labels.shape[0] < 2:
        raise ValueError(f"labels: need at least 2 label maps to compare, got {labels.shape[0]}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels: expected integer label maps, got {labels.dtype}; pass argmax(0) of the outputs")
    flat = labels.reshape(labels.shape[0], -1).long()
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=labels.device)
    dice, disagreement = [], []
    for i, j in itertools.combinations(range(flat.shape[0]), 2):
        # the pair's confusion matrix: the diagonal is the overlap, rows and columns the two maps' class sizes
        confusion = torch.bincount(flat[i] * num_classes + flat[j], minlength=num_classes**2)
        confusion = confusion.reshape(num_classes, num_classes).double()
        overlap, total = confusion.diagonal(), confusion.sum(0) + confusion.sum(1)
        dice.append(torch.where(total > 0, 2 * overlap / total.clamp_min(1), nan)[1:])
        disagreement.append(1 - overlap.sum() / flat.shape[1])
    return torch.stack(dice).nanmean(0), torch.stack(disagreement).mean()


def flip_agreement(
    probs: Callable[[torch.Tensor], torch.Tensor],
    image: torch.Tensor,
    flips: Sequence[Sequence[int]] = IN_PLANE_FLIPS,
) -> FlipAgreement:
    """The agreement of ``probs`` (``(C_in, *spatial) -> (C, *spatial)``: probabilities or logits) on ``image``
    under ``flips`` (each a tuple of spatial axes of ``image`` to flip; ``()`` is the image itself): each output is
    flipped back, segmented by argmax over classes and compared by :func:`pairwise_dice`.

    The default flips are the in-plane axes of the bundles' 2D networks (spatial axes 0 and 1; ``SliceInferer``
    slices along the last). ``len(flips)`` forward passes; ``image`` is flipped with ``torch.flip`` on its device.
    """
    flips = [tuple(int(a) for a in f) for f in flips]
    if len(flips) < 2:
        raise ValueError(f"flips: need at least 2 (e.g. IN_PLANE_FLIPS), got {flips}")
    spatial = image.ndim - 1
    for f in flips:
        if any(not 0 <= a < spatial for a in f):
            raise ValueError(
                f"flips: axes {f} are not spatial axes 0..{spatial - 1} of an image of shape {tuple(image.shape)}"
            )
    labels, num_classes = [], None
    for f in flips:
        dims = [a + 1 for a in f]
        x = torch.flip(image, dims) if dims else image
        out = probs(x)
        out = out.as_tensor() if hasattr(out, "as_tensor") else out  # a MetaTensor: its plain values
        if tuple(out.shape[1:]) != tuple(image.shape[1:]):
            raise ValueError(
                f"probs: returned shape {tuple(out.shape)} for an image of shape {tuple(image.shape)}; it must "
                "return (C, *spatial) on the image's grid"
            )
        out = torch.flip(out, dims) if dims else out
        num_classes = out.shape[0]
        labels.append(out.argmax(0))
    dice, disagreement = pairwise_dice(torch.stack(labels), num_classes)
    dice = [float(v) for v in dice.cpu()]
    valid = [v for v in dice if v == v]
    mean = sum(valid) / len(valid) if valid else float("nan")
    return FlipAgreement(tuple(dice), mean, float(disagreement), len(flips))
