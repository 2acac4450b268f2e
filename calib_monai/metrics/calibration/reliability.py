"""Reliability diagrams of ``reliability_diagram_data``'s bins: drawn on matplotlib axes or written as PNG
(matplotlib, the optional ``plots`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_reliability", "save_reliability_diagram"]


def save_reliability_diagram(
    data: dict[str, np.ndarray], path: str | Path, title: str | None = None, ece_label: str = "ECE"
) -> Path:
    """Write :func:`plot_reliability` of ``reliability_diagram_data(..., classwise=False)`` as PNG (matplotlib, the
    ``plots`` extra, with the Agg backend)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("save_reliability_diagram needs matplotlib: pip install 'calib-monai[plots]'.") from e
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
