"""Per-volume DSC, HD95 and ASD of the foreground classes through MONAI's ``DiceMetric``,
``HausdorffDistanceMetric(percentile=95)`` and ``SurfaceDistanceMetric`` (symmetric), distances in mm when the
spacing is known. A class absent from the ground truth gets NaN (``empty_class="nan"``) or, as the papers
(``docs/notes/metrics.md``), HD95 = ASD = 0 and DSC = 1 if also absent from the prediction, else 0 (``"papers"``).
A class present but not predicted gets DSC = 0 and HD95 = ASD = inf.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from monai.metrics import DiceMetric, HausdorffDistanceMetric, SurfaceDistanceMetric
from monai.networks.utils import one_hot

from calib_monai.checks import check_option
from calib_monai.defaults import EMPTY_CLASS

__all__ = ["EMPTY_CLASS_CONVENTIONS", "label_map_dice", "segmentation_metrics_per_volume"]

EMPTY_CLASS_CONVENTIONS = ("nan", "papers")


def _to_label_map(x: Any, name: str, num_classes: int | None) -> torch.Tensor:
    """Label map ``(B, 1, *spatial)`` on the CPU; the argmax of a multi-channel input is taken on its device first,
    so only one channel crosses to the host."""
    t = torch.as_tensor(x.as_tensor() if hasattr(x, "as_tensor") else x).detach()
    if t.ndim < 3:
        raise ValueError(f"{name} must have shape (B, C, *spatial) or (B, 1, *spatial), got {tuple(t.shape)}.")
    if t.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(t.shape)}): a batch without volumes or a volume without "
            "voxels; DSC, HD95 and ASD need at least one voxel (check the data loader or the crop)."
        )
    if t.shape[1] > 1:  # probabilities or one-hot: take the argmax class
        return t.argmax(dim=1, keepdim=True).cpu()
    if t.is_floating_point() and not torch.equal(t, t.round()):
        raise ValueError(f"{name} with one channel must hold integer labels, got non-integral values.")
    return t.long().cpu()


def segmentation_metrics_per_volume(
    pred: Any,
    labels: Any,
    num_classes: int | None = None,
    spacing: float | Sequence[float] | Sequence[Sequence[float]] | None = None,
    empty_class: str = EMPTY_CLASS,
    surface_distances: bool = True,
) -> dict[str, np.ndarray]:
    """DSC, HD95 and ASD per volume and foreground class.

    Args:
        pred: probabilities / one-hot ``(B, C, *spatial)`` (argmax taken) or a label map ``(B, 1, *spatial)``.
        labels: label map ``(B, 1, *spatial)`` or one-hot ``(B, C, *spatial)``.
        num_classes: C including background; needed when both inputs are label maps (else read from the channels).
        spacing: voxel size (one value, one per spatial axis, or one sequence per volume); None: voxels.
        empty_class: ``"nan"`` or ``"papers"`` (see the module docstring).
        surface_distances: False leaves out HD95 and ASD (their distance transforms dominate the time).

    Returns:
        ``{"dice", "hd95", "asd"}`` (``{"dice"}`` without surface distances): float64 arrays ``(B, C - 1)``.

    >>> import torch
    >>> pred = torch.tensor([[[0, 1, 1, 0]]])  # label maps (B, 1, *spatial): class 1 at voxels 1, 2
    >>> labels = torch.tensor([[[0, 1, 0, 0]]])  # class 1 at voxel 1
    >>> out = segmentation_metrics_per_volume(pred, labels, num_classes=2, surface_distances=False)
    >>> out["dice"].round(4).tolist()  # 2 * 1 / (2 + 1)
    [[0.6667]]
    """
    check_option("empty_class", empty_class, EMPTY_CLASS_CONVENTIONS)
    channels = [int(torch.as_tensor(x).shape[1]) for x in (pred, labels) if torch.as_tensor(x).ndim >= 3]
    if num_classes is None:
        num_classes = max(channels) if channels and max(channels) > 1 else None
    if num_classes is None or num_classes < 2:
        raise ValueError(f"num_classes must be given (>= 2) when pred and labels are label maps, got {num_classes}.")
    pred_map, label_map = _to_label_map(pred, "pred", num_classes), _to_label_map(labels, "labels", num_classes)
    if pred_map.shape != label_map.shape:
        raise ValueError(
            f"pred and labels describe different volumes: {tuple(pred_map.shape)} vs {tuple(label_map.shape)}."
        )
    for name, m in (("pred", pred_map), ("labels", label_map)):
        if m.numel() and (int(m.min()) < 0 or int(m.max()) >= num_classes):
            raise ValueError(f"{name} labels must lie in [0, {num_classes - 1}], got [{int(m.min())}, {int(m.max())}].")
    p1h, y1h = one_hot(pred_map, num_classes), one_hot(label_map, num_classes)
    kwargs = {} if spacing is None else {"spacing": spacing}
    with warnings.catch_warnings():  # MONAI warns for every empty class; the convention below handles them
        warnings.simplefilter("ignore")
        metrics = {"dice": DiceMetric(include_background=False, reduction="none", ignore_empty=False)(p1h, y1h)}
        if surface_distances:
            hd95 = HausdorffDistanceMetric(include_background=False, percentile=95, reduction="none")
            asd = SurfaceDistanceMetric(include_background=False, symmetric=True, reduction="none")
            metrics.update(hd95=hd95(p1h, y1h, **kwargs), asd=asd(p1h, y1h, **kwargs))
    dims = tuple(range(2, y1h.ndim))
    gt_absent = (y1h.sum(dim=dims) == 0)[:, 1:].numpy()
    pred_absent = (p1h.sum(dim=dims) == 0)[:, 1:].numpy()
    out = {k: v.double().cpu().numpy() for k, v in metrics.items()}
    missed = ~gt_absent & pred_absent
    distances = [k for k in ("hd95", "asd") if k in out]
    for k in distances:
        out[k][missed] = np.inf
    out["dice"][missed] = 0.0
    if empty_class == "nan":
        for k in out:
            out[k][gt_absent] = np.nan
    else:
        out["dice"][gt_absent] = np.where(pred_absent[gt_absent], 1.0, 0.0)
        for k in distances:
            out[k][gt_absent] = 0.0
    return out


def label_map_dice(prediction: torch.Tensor, label: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The DSC of each foreground class ``1..C-1`` of a label map ``prediction`` against ``label``, float64 on their
    device, from their confusion matrix (no one-hot copies); NaN for a class absent from the label.

    >>> dice = label_map_dice(torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, 0, 0]), num_classes=3)
    >>> [round(v, 4) for v in dice.tolist()]  # class 1: 2 * 1 / (2 + 1); class 2 in no label: NaN
    [0.6667, nan]
    """
    pred, true = prediction.reshape(-1).long(), label.reshape(-1).to(prediction.device).long()
    joint = torch.bincount(true * num_classes + pred, minlength=num_classes * num_classes)
    joint = joint.reshape(num_classes, num_classes)
    overlap, in_pred, in_true = joint.diagonal(), joint.sum(0), joint.sum(1)
    dice = 2 * overlap.double() / (in_pred + in_true).double()
    return torch.where(in_true > 0, dice, torch.nan)[1:]
