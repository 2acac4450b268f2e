"""PNG figures of the studies (matplotlib, Agg backend; the ``plots`` extra)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calib_monai.metrics import plot_reliability

__all__ = [
    "contour_slices",
    "coverage_curves",
    "grouped_bars",
    "line_plot",
    "logit_histograms",
    "qualitative_figure",
    "radar_plot",
    "reliability_grid",
    "scatter_panels",
]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the study figures need matplotlib: pip install 'calib-monai[plots]'") from e
    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", bbox_inches="tight")
    fig.clf()
    _pyplot().close(fig)
    return path


def radar_plot(
    scores: Mapping[str, Mapping[str, float]], axes: Sequence[tuple[str, str, bool]], path: str | Path, title: str = ""
) -> Path:
    """One polygon per method over ``axes`` = ``(column, label, higher_is_better)``.

    Each axis is scaled over the methods' values (worst at the centre ring 0.1, best at 1), so "further out is
    better" on every axis (the NACL journal's Fig. 5 style, DSC against calibration errors)."""
    plt = _pyplot()
    methods = list(scores)
    angles = np.linspace(0, 2 * np.pi, len(axes), endpoint=False)
    fig = plt.figure(figsize=(6, 6), dpi=100)
    ax = fig.add_subplot(111, polar=True)
    for name in methods:
        values = []
        for column, _, higher in axes:
            column_values = np.array([scores[m][column] for m in methods], dtype=float)
            lo, hi = np.nanmin(column_values), np.nanmax(column_values)
            v = (scores[name][column] - lo) / (hi - lo) if hi > lo else 1.0
            values.append(0.1 + 0.9 * (v if higher else 1.0 - v))
        closed = np.append(values, values[0])
        ax.plot(np.append(angles, angles[0]), closed, linewidth=1.5, label=name)
        ax.fill(np.append(angles, angles[0]), closed, alpha=0.05)
    ax.set_xticks(angles)
    ax.set_xticklabels([label for _, label, _ in axes])
    ax.set_yticks([0.1, 0.55, 1.0])
    ax.set_yticklabels(["worst", "", "best"], fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_title(title, pad=20)
    ax.legend(loc="upper right", bbox_to_anchor=(1.35, 1.1), fontsize=8)
    return _save(fig, path)


def reliability_grid(data: Mapping[str, dict[str, np.ndarray]], path: str | Path, title: str = "") -> Path:
    """Top-label reliability diagrams, one panel per method (pooled ground-truth foreground voxels)."""
    plt = _pyplot()
    names = list(data)
    cols = min(4, len(names))
    rows = int(np.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.6 * rows), dpi=100, squeeze=False)
    for ax, name in zip(axes.ravel(), names):
        plot_reliability(ax, data[name], name)
        ax.legend(loc="upper left", fontsize=7, title=ax.get_legend().get_title().get_text(), title_fontsize=8)
    for ax in axes.ravel()[len(names) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def qualitative_figure(
    image: np.ndarray,
    label: np.ndarray,
    predictions: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: str | Path,
    num_classes: int,
    title: str = "",
) -> Path:
    """Image, ground truth, then per method its prediction (top row) and confidence map (bottom row), one slice.

    ``image`` and ``label`` are 2D ``(H, W)``; ``predictions`` maps a method to ``(label map, confidence)`` 2D."""
    plt = _pyplot()
    cols = 1 + len(predictions)
    fig, axes = plt.subplots(2, cols, figsize=(2.4 * cols, 5.0), dpi=100, squeeze=False)
    segment = dict(cmap="viridis", vmin=0, vmax=max(num_classes - 1, 1), interpolation="nearest")
    axes[0, 0].imshow(image.T, cmap="gray", origin="lower")
    axes[0, 0].set_title("image", fontsize=9)
    axes[1, 0].imshow(label.T, origin="lower", **segment)
    axes[1, 0].set_title("ground truth", fontsize=9)
    shown = None
    for c, (name, (pred, conf)) in enumerate(predictions.items(), start=1):
        axes[0, c].imshow(pred.T, origin="lower", **segment)
        axes[0, c].set_title(name, fontsize=9)
        shown = axes[1, c].imshow(conf.T, cmap="magma", vmin=0.3, vmax=1.0, origin="lower")
        axes[1, c].set_title("confidence", fontsize=8)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    if shown is not None:
        fig.colorbar(shown, ax=axes[1, :].tolist(), fraction=0.02, pad=0.01, label="max softmax")
    fig.suptitle(title)
    return _save(fig, path)


def line_plot(
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    path: str | Path,
    xlabel: str,
    ylabel: str,
    title: str = "",
) -> Path:
    """One line per method (e.g. ECE against the test-noise sigma); beyond four lines the legend goes to the right
    of the axes, where it hides none of them, and line styles repeat less often than the ten default colours."""
    plt = _pyplot()
    many = len(series) > 4
    fig, ax = plt.subplots(figsize=(7.5 if many else 5, 3.6), dpi=100)
    for i, (name, values) in enumerate(series.items()):
        ax.plot(list(x), list(values), marker="os^D"[i // 10 % 4], linestyle=("-", "--")[i // 10 % 2], label=name)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    if many:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(fontsize=8)
    return _save(fig, path)


def grouped_bars(
    groups: Sequence[str], series: Mapping[str, Sequence[float]], path: str | Path, ylabel: str, title: str = ""
) -> Path:
    """One group of bars per entry of ``groups`` (e.g. methods), one bar per series (e.g. selection rule and
    temperature); the legend sits right of the axes."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) + 3), 3.8), dpi=100)
    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(
            x + (i - (len(series) - 1) / 2) * width,
            list(values),
            width,
            label=name,
            hatch="//" if name.endswith("+ T") else None,
        )
    ax.set_xticks(x, list(groups), rotation=20, ha="right")
    ax.set(ylabel=ylabel, title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, path)


def logit_histograms(
    histograms: Mapping[str, np.ndarray], edges: np.ndarray, path: str | Path, title: str = ""
) -> Path:
    """Normalised histograms of the max logit, one line per key (method, or epoch of one method)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=100)
    centres = 0.5 * (edges[1:] + edges[:-1])
    for name, counts in histograms.items():
        counts = np.asarray(counts, dtype=float)
        ax.plot(centres, counts / max(counts.sum(), 1.0), label=str(name))
    filled = np.flatnonzero(np.sum([np.asarray(c) for c in histograms.values()], axis=0)) if histograms else []
    if len(filled):  # zoom on the occupied bins (the edges are fixed so that volumes and runs add up)
        ax.set_xlim(edges[max(filled[0] - 1, 0)], edges[min(filled[-1] + 2, len(edges) - 1)])
    ax.set(xlabel="max logit", ylabel="fraction of voxels", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def scatter_panels(
    points: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str | Path, xlabel: str, ylabel: str, title: str = ""
) -> Path:
    """One panel per series of ``(x, y)`` points with the diagonal ``y = x`` (an estimate against the truth)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(points), figsize=(3.2 * len(points), 3.4), squeeze=False, sharey=True)
    values = [v for x, y in points.values() for v in (*x, *y) if np.isfinite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    pad = 0.03 * (hi - lo or 1.0)
    for ax, (name, (x, y)) in zip(axes[0], points.items()):
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", lw=1, ls="--")
        ax.scatter(x, y, s=10, alpha=0.7)
        ok = np.isfinite(x) & np.isfinite(y)
        mae = float(np.mean(np.abs(x[ok] - y[ok]))) if ok.any() else float("nan")
        ax.set_title(f"{name} (MAE {mae:.3f})", fontsize=9)
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlabel(xlabel)
    axes[0][0].set_ylabel(ylabel)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def coverage_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], alpha_served: float, path: str | Path) -> Path:
    """``curves``: ``{label: [{"alpha", "kind" ("outer"/"inner"), "covered", "cases", "low", "high"}, ...]}``, the
    share of cases whose contour holds and its interval, against the line 1 - alpha; ``alpha_served`` marked."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, kind in zip(axes, ("outer", "inner")):
        alphas = sorted({p["alpha"] for c in curves.values() for p in c})
        ax.plot(alphas, [1 - a for a in alphas], "k--", lw=1, label="1 - alpha (the guarantee)")
        for label, points in curves.items():
            pts = [p for p in points if p["kind"] == kind and p["cases"]]
            x = np.array([p["alpha"] for p in pts])
            y = np.array([p["covered"] / p["cases"] for p in pts])
            band = np.array([(p["low"], p["high"]) for p in pts])
            ax.plot(x, y, marker="o", ms=3, label=label)
            ax.fill_between(x, band[:, 0], band[:, 1], alpha=0.12)
        ax.axvline(alpha_served, color="grey", lw=0.8, ls=":")
        word = "holds 1 - eps of the truth" if kind == "outer" else "lies 1 - eps inside the truth"
        ax.set_title(f"{kind} contour {word}")
        ax.set_xlabel("alpha")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of test cases (band: 95% interval)")
    axes[0].legend(fontsize=7, loc="lower left")
    return _save(fig, path)


def contour_slices(
    img: np.ndarray,
    label: np.ndarray,
    seg: np.ndarray,
    inner: np.ndarray,
    outer: np.ndarray,
    names: Sequence[str],
    title: str,
    path: str | Path,
    axis: int = 2,
) -> Path:
    """One case's slice with the most truth (3D arrays on one grid; ``inner``/``outer`` with a last axis per
    structure): the image, and per structure the truth (white), the prediction (yellow), the inner (green) and
    outer (red) contour lines."""
    index = int(np.argmax(np.moveaxis(label > 0, axis, 0).reshape(label.shape[axis], -1).sum(1)))

    def cut(a: np.ndarray) -> np.ndarray:
        return np.take(a, index, axis=axis).T  # rows: the second axis, as a radiological view

    fig, axes = _pyplot().subplots(1, len(names), figsize=(4.2 * len(names), 4.4), squeeze=False)
    for c, (ax, name) in enumerate(zip(axes[0], names), start=1):
        ax.imshow(cut(img), cmap="gray", origin="lower", interpolation="nearest")
        layers = (
            (label == c, "white", "truth"),
            (seg == c, "yellow", "prediction"),
            (inner[..., c - 1] > 0, "lime", "inner"),
            (outer[..., c - 1] > 0, "red", "outer"),
        )
        for mask, colour, what in layers:
            m = cut(mask.astype(np.float32))
            if m.any():
                ax.contour(m, levels=[0.5], colors=colour, linewidths=1.2)
            ax.plot([], [], color=colour, label=f"{what}: {int(m.sum())} px here, {int(mask.sum())} in 3D")
        ax.set_title(f"{name}", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", framealpha=0.6)
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)
