"""Reliability-diagram data (per-bin confidence, accuracy, count) and a PNG writer (matplotlib, optional extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from calib_monai.checks import check_positive_int
from calib_monai.defaults import NUM_BINS

from ._inputs import check_foreground
from .calibration_error import pooled_accumulator

__all__ = ["plot_reliability", "reliability_diagram_data", "save_reliability_diagram"]


def reliability_diagram_data(
    probs: Any, labels: Any, num_bins: int = NUM_BINS, foreground: str = "gt", classwise: bool = False
) -> dict[str, np.ndarray]:
    """Per-bin statistics of a reliability diagram (Niculescu-Mizil & Caruana, ICML 2005), pooled over volumes.

    Top-label (``classwise=False``): bins of ``max_k p_k``, accuracy = fraction with ``argmax == y``; the ECE is
    ``sum(count * |accuracy - confidence|) / sum(count)``. Classwise: one row per class k, bins of ``p_k``,
    accuracy = fraction labelled k (the CECE's bins). Bins are ``(e_b, e_{b+1}]`` as in ``ece``, with ``e_b = b / M``
    rounded to the probabilities' dtype (``calibration_numpy.equal_width_bin_index``).

    ``monai.metrics.calibration_binning`` computes the classwise rows for one-hot labels, but on every voxel, with
    ``[lo, hi)`` (or ``right=True``) float32 edges and float32 counts; this function selects voxels first and counts
    in int64 (the tests check both agree on small inputs). Torch tensors are binned on their device (only the bins
    come to the host), NumPy arrays as CPU tensors.

    Returns:
        dict with ``"edges"`` ``(M + 1,)``, ``"confidence"`` and ``"accuracy"`` (NaN for empty bins) and ``"count"``
        (int64), each ``(M,)`` or ``(C, M)`` for ``classwise=True``.

    >>> import numpy as np
    >>> probs = np.array([[0.2, 0.2, 0.7, 0.9], [0.8, 0.8, 0.3, 0.1]])  # (C, *spatial): 2 classes, 4 voxels
    >>> data = reliability_diagram_data(probs, np.array([1, 0, 0, 0]), num_bins=5, foreground="all")
    >>> data["count"].tolist(), data["accuracy"][3:].round(4).tolist()  # confidences 0.8, 0.8, 0.7 | 0.9
    ([0, 0, 0, 3, 1], [0.6667, 1.0])
    """
    num_bins = check_positive_int("num_bins", num_bins)
    foreground = check_foreground(foreground)
    name = "cece" if classwise else "ece"
    acc = pooled_accumulator(probs, labels, (name,), num_bins, foreground)
    stats = acc.statistics(name)
    shape = (acc.num_classes, num_bins, 3) if classwise else (num_bins, 3)
    stats = np.zeros(shape) if stats is None else stats.cpu().numpy()
    count = stats[..., 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.where(count > 0, stats[..., 1] / count, np.nan)
        accuracy = np.where(count > 0, stats[..., 2] / count, np.nan)
    return {
        "edges": np.linspace(0.0, 1.0, num_bins + 1),
        "confidence": confidence,
        "accuracy": accuracy,
        "count": count.astype(np.int64),
    }


def save_reliability_diagram(
    data: dict[str, np.ndarray], path: str | Path, title: str | None = None, ece_label: str = "ECE"
) -> Path:
    """Write a top-label reliability diagram (accuracy bars per bin, the diagonal, ECE in the legend) as PNG.

    ``data`` is the output of ``reliability_diagram_data(..., classwise=False)``. matplotlib is imported here with
    the Agg backend (install the ``plots`` extra); the figure is closed after saving.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("save_reliability_diagram needs matplotlib: pip install 'calib-monai[plots]'.") from e
    if np.ndim(data["count"]) != 1:  # before a figure is opened
        shape = np.shape(data["count"])
        raise ValueError(f"data must be top-label reliability data with 1-D bins, got count shape {shape}.")
    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=100)
    plot_reliability(ax, data, title, ece_label)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", bbox_inches="tight")
    plt.close(fig)
    return path


def plot_reliability(ax: Any, data: dict[str, np.ndarray], title: str | None = None, ece_label: str = "ECE") -> float:
    """Draw a top-label reliability diagram of ``data`` on the matplotlib axes ``ax``; returns its ECE (of the bins
    drawn, shown in the legend as ``<ece_label> = ...``: "pooled ECE" for bins pooled over volumes)."""
    if np.ndim(data["count"]) != 1:
        shape = np.shape(data["count"])
        raise ValueError(f"data must be top-label reliability data with 1-D bins, got count shape {shape}.")
    edges, count = np.asarray(data["edges"]), np.asarray(data["count"])
    accuracy, confidence = np.nan_to_num(data["accuracy"]), np.nan_to_num(data["confidence"])
    total = count.sum()
    ece_value = float((count * np.abs(accuracy - confidence)).sum() / total) if total else float("nan")
    width = np.diff(edges)
    ax.bar(edges[:-1], accuracy, width=width, align="edge", edgecolor="black", color="tab:blue", label="accuracy")
    # the gap between accuracy and mean confidence, over- (confidence above) or under-confident (below)
    ax.bar(
        edges[:-1],
        np.abs(confidence - accuracy),
        bottom=np.minimum(accuracy, confidence),
        width=width,
        align="edge",
        facecolor="none",
        edgecolor="tab:red",
        hatch="//",
        label="gap to confidence",
    )
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", title=title or "Reliability diagram")
    ax.legend(loc="upper left", title=f"{ece_label} = {ece_value:.4f}")
    return ece_value
