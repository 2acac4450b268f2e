"""``SegmentationCalibrationMetric``: ECE / CECE / TACE / ACE / mL1-ACE / NLL / Brier as a MONAI
``CumulativeIterationMetric``."""

from __future__ import annotations

from typing import Any

import torch
from monai.metrics import CumulativeIterationMetric

from calib_monai.checks import check_option
from calib_monai.defaults import TACE_THRESHOLD

from .inputs import (
    POOLABLE_METRICS,
    REDUCTIONS,
    check_metric,
    detached_plain_tensor,
    metric_definition,
    selected_voxels,
)
from .statistics import selected_statistics, value_from_statistics

__all__ = ["SegmentationCalibrationMetric"]


class SegmentationCalibrationMetric(CumulativeIterationMetric):
    """Calibration error of segmentation outputs, accumulated volume by volume (one batch item = one volume).

    Each call stores, per volume, its metric value and its statistics (per-bin counts and sums for ECE / CECE /
    mL1-ACE, count and sum for NLL / Brier; see ``calib_monai.metrics.calibration_statistics``), so that ``aggregate``
    can return any of

    - ``"mean"`` (default): unweighted mean of the per-volume values, volumes without selected voxels (NaN) left out,
      as the papers report (NACL, MbLS, CRaC);
    - ``"pooled"``: the metric of all selected voxels of all volumes binned together (ECE, CECE, mL1-ACE, NLL, Brier
      only: equal-mass bins of TACE / ACE depend on all voxels at once and are not additive);
    - ``"none"``: the per-volume values, shape ``(num_volumes,)``.

    The functions ``ece``, ``cece``... of :mod:`calib_monai.metrics` *pool* the voxels of all volumes they are given
    (``"pooled"`` here); this class and the bundles' ``val_ece``/``test_ece`` average per volume (``"mean"``).

    Relation to MONAI's ``monai.metrics.CalibrationErrorMetric`` (MONAI 1.6): MONAI's metric is a classwise ECE over
    *all* voxels of each volume, averaged over channels and volumes. It equals ``metric_name="cece"``,
    ``foreground="all"``, ``reduction="mean"`` here (``include_background`` alike) up to MONAI's float32
    accumulation and bin edges: ours are ``(e_k, e_{k+1}]`` with ``e_k = k / M`` rounded to the probabilities' dtype
    (``equal_width_bin``), MONAI's are float32 ``k (1 + eps) / M``; both put a float32 value
    equal to float32(k / M) in the lower bin (MONAI's ``small_left_edge`` case, ``tests/test_metrics_vs_monai.py``).
    With ``calibration_reduction="average"`` (every non-empty bin weighted equally) MONAI's metric equals
    ``metric_name="ml1ace"`` with the same settings. Where they differ: MONAI has no top-label ECE (our ``"ece"``, the
    papers' ECE), no voxel selection (our default
    ``foreground="gt"``), no equal-mass bins (TACE/ACE) and no pooling over volumes.

    Args:
        metric_name: ``"ece"``, ``"cece"``, ``"tace"``, ``"ace"``, ``"ml1ace"``, ``"nll"``, ``"brier"``,
            ``"cece_all"`` or ``"ml1ace_gt"`` (``calib_monai.metrics.METRIC_DEFINITIONS``).
        num_bins, foreground, include_background: None (default) takes the metric's definition
            (``calib_monai.metrics.metric_definition``): ``"ml1ace"`` and ``"cece_all"`` 20 bins over every voxel
            (``"all"``), background excluded (Barfoot et al.); the others 15 bins over the ground-truth foreground
            (``"gt"``, label != 0), background included (NACL / MbLS / CRaC). ``foreground`` may also be ``"union"``
            (label or prediction foreground).
        reduction: ``"mean"``, ``"pooled"`` or ``"none"``.
        threshold: TACE: probabilities ``<= threshold`` are left out (1e-3, Nixon et al. 2019).

    Inputs of ``__call__(y_pred, y)``: ``y_pred`` softmax probabilities ``(B, C, *spatial)``; ``y`` integer labels
    ``(B, 1, *spatial)`` or one-hot ``(B, C, *spatial)`` (C > 1), or lists of channel-first tensors.
    The buffer holds ``[values (N, 1), statistics (N, S)]`` (float64, on ``y_pred``'s device); ``IgniteMetricHandler``
    saves it as metric details.

    Where: everything is computed on ``y_pred``'s device (``statistics.py``: float64 counts and sums); the
    volumes are never copied to the host, only each volume's per-bin statistics (``S`` numbers) and its value.
    Probabilities that are not softmax outputs raise ``ValueError`` (naming ``y_pred``); a volume without selected
    voxels gets NaN with a ``UserWarning`` and is left out of ``"mean"``.

    >>> import torch
    >>> probs = torch.tensor([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]]).reshape(1, 2, 2, 2)  # (B, C, H, W)
    >>> labels = torch.tensor([1, 0, 0, 0]).reshape(1, 1, 2, 2)
    >>> metric = SegmentationCalibrationMetric("ece", num_bins=10, foreground="all")
    >>> for _ in range(2):  # two volumes, one per call
    ...     _ = metric(probs, labels)
    >>> [round(v, 4) for v in metric.aggregate("none").tolist()]  # 2/4 * |0.5 - 0.8| + 1/4 * 0.3 + 1/4 * 0.1
    [0.25, 0.25]
    """

    def __init__(
        self,
        metric_name: str = "ece",
        num_bins: int | None = None,
        foreground: str | None = None,
        reduction: str = "mean",
        include_background: bool | None = None,
        threshold: float = TACE_THRESHOLD,
    ) -> None:
        super().__init__()
        self.named_metric = check_metric(metric_name, threshold, named=True)
        # metric_name: the formula the statistics compute ("ml1ace" for "ml1ace_gt"); named_metric: the name given
        self.metric_name, self.num_bins, self.foreground, self.include_background = metric_definition(
            self.named_metric, num_bins, foreground, include_background
        )
        self.reduction = self._check_reduction(reduction)
        self.threshold = threshold

    def _check_reduction(self, reduction: Any) -> str:
        check_option("reduction", reduction, REDUCTIONS)
        if reduction == "pooled" and self.metric_name not in POOLABLE_METRICS:
            raise ValueError(
                f"reduction='pooled' is available for {POOLABLE_METRICS}, not for metric_name={self.metric_name!r} "
                "(equal-mass bins are not additive over volumes); use 'mean' or 'none'."
            )
        return str(reduction)

    def _compute_tensor(  # type: ignore[override]
        self, y_pred: torch.Tensor, y: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if y is None:
            raise ValueError("SegmentationCalibrationMetric needs labels y, got None.")
        if y_pred.ndim < 3:
            raise ValueError(f"y_pred must have shape (B, C, *spatial), got {tuple(y_pred.shape)}.")
        num_classes = int(y_pred.shape[1])
        y_pred = detached_plain_tensor(y_pred)
        y = detached_plain_tensor(y) if isinstance(y, torch.Tensor) else torch.as_tensor(y, device=y_pred.device)
        if y.ndim == y_pred.ndim and y.shape[1] == num_classes and num_classes > 1:
            if not bool(((y == 0) | (y == 1)).all()):  # one reduction on the device
                raise ValueError(f"y with {num_classes} channels must be one-hot (0/1 values), got other values.")
            y = y.max(dim=1).indices[:, None]  # the first class on ties
        parts = selected_voxels(y_pred, y, self.foreground, "y_pred", pooled=False)
        settings = (self.num_bins, self.include_background, self.threshold)
        name = self.metric_name
        stats = torch.stack([selected_statistics([part], (name,), *settings)[name].reshape(-1) for part in parts])
        values = [value_from_statistics(s, name, *settings[:2]) for s in stats.cpu()]  # per-volume bins only
        return torch.tensor(values, dtype=torch.float64, device=stats.device)[:, None], stats

    def aggregate(self, reduction: str | None = None) -> torch.Tensor:  # type: ignore[override]
        """Reduce the buffer; ``reduction`` (``"mean"``, ``"pooled"``, ``"none"``) overrides the constructor's."""
        reduction = self.reduction if reduction is None else self._check_reduction(reduction)
        buffer = self.get_buffer()
        if not isinstance(buffer, list) or len(buffer) != 2:
            raise ValueError("SegmentationCalibrationMetric has no data yet: call it on (y_pred, y) first.")
        values = buffer[0][:, 0].double().cpu()
        if reduction == "none":
            return values
        if reduction == "mean":
            kept = values[~torch.isnan(values)]
            return kept.mean() if kept.numel() else torch.tensor(float("nan"), dtype=torch.float64)
        value = value_from_statistics(buffer[1].sum(dim=0), self.metric_name, self.num_bins, self.include_background)
        return torch.tensor(value, dtype=torch.float64)
