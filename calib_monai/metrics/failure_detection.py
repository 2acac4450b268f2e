"""Failure detection at case level: does a per-case confidence (e.g. the estimated DSC) rank the failures?

A case's *risk* is its loss (``1 - DSC``), its *confidence* the score a user sorts by. As in selective
classification (Geifman & El-Yaniv, NeurIPS 2017) and FD-Shifts (Jaeger et al., ICLR 2023; Traub et al., NeurIPS
2024), used for segmentation by Zenk et al. (MedIA 2025):

* **risk-coverage curve**: accept the cases with confidence at least a threshold, for every distinct threshold
  (equal confidences enter together); coverage = accepted / N, selective risk = mean risk of the accepted;
* **AURC** / **AUGRC**: trapezoid areas under it / under the generalized risk (accepted risks summed over N);
* **random** AURC = the mean risk; **oracle**: sorted by the true risk; ``aurc_gap_closed = (random - AURC) /
  (random - oracle)``.

Cases where either value is NaN are left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "aurc",
    "augrc",
    "failure_detection_summary",
    "quality_agreement",
    "risk_coverage_curve",
    "save_risk_coverage_plot",
]


def _pairs(confidence: Any, risk: Any) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(confidence, dtype=np.float64).reshape(-1)
    r = np.asarray(risk, dtype=np.float64).reshape(-1)
    if c.shape != r.shape:
        raise ValueError(f"confidence and risk need one value per case, got {c.size} and {r.size}")
    keep = np.isfinite(c) & np.isfinite(r)
    return c[keep], r[keep]


def risk_coverage_curve(confidence: Any, risk: Any, generalized: bool = False) -> dict[str, np.ndarray]:
    """``{"coverage", "risk", "threshold"}``, coverage descending from 1 to 0, whose last point repeats the last risk
    (0 when ``generalized``: the accepted risk over all N cases).

    >>> curve = risk_coverage_curve([0.9, 0.8, 0.3], [0.0, 1.0, 1.0])  # confidence, risk (1: a failure)
    >>> curve["coverage"].round(4).tolist(), curve["risk"].round(4).tolist()
    ([1.0, 0.6667, 0.3333, 0.0], [0.6667, 0.5, 0.0, 0.0])
    """
    c, r = _pairs(confidence, risk)
    n = c.size
    if n == 0:
        return {"coverage": np.zeros(0), "risk": np.zeros(0), "threshold": np.zeros(0)}
    order = np.argsort(-c, kind="stable")  # most confident first
    c, r = c[order], r[order]
    last_of_tie = np.append(c[1:] != c[:-1], True)  # a threshold accepts every case with that confidence
    accepted = np.arange(1, n + 1)[last_of_tie]
    risk_sum = np.cumsum(r)[last_of_tie]
    coverage = accepted / n
    curve = risk_sum / (n if generalized else accepted)
    threshold = c[last_of_tie]
    coverage, curve, threshold = coverage[::-1], curve[::-1], threshold[::-1]  # descending coverage
    end = 0.0 if generalized else curve[-1]
    return {"coverage": np.append(coverage, 0.0), "risk": np.append(curve, end), "threshold": threshold}


def _area(curve: dict[str, np.ndarray]) -> float:
    cov, risk = curve["coverage"], curve["risk"]
    if cov.size == 0:
        return float("nan")
    return float(np.sum((cov[:-1] - cov[1:]) * (risk[:-1] + risk[1:]) / 2))


def aurc(confidence: Any, risk: Any) -> float:
    """Area under the risk-coverage curve (NaN without cases).

    >>> # trapezoids of the curve above: 1/3 * (2/3 + 1/2) / 2 + 1/3 * (1/2 + 0) / 2 + 0
    >>> round(aurc([0.9, 0.8, 0.3], [0.0, 1.0, 1.0]), 4)
    0.2778
    """
    return _area(risk_coverage_curve(confidence, risk))


def augrc(confidence: Any, risk: Any) -> float:
    """Area under the generalized risk-coverage curve (NaN without cases).

    >>> # risks of the accepted cases over all 3: (2/3, 1/3, 0, 0); trapezoids 1/3 * (1/2 + 1/6 + 0)
    >>> round(augrc([0.9, 0.8, 0.3], [0.0, 1.0, 1.0]), 4)
    0.2222
    """
    return _area(risk_coverage_curve(confidence, risk, generalized=True))


def quality_agreement(estimated: Any, true: Any) -> dict[str, float]:
    """``{"spearman", "pearson", "mae", "bias", "cases"}`` of an estimate against the true values (``bias``: mean of
    estimated - true); correlations are NaN with fewer than 3 cases or a constant side.

    >>> agreement = quality_agreement([0.9, 0.8, 0.3], [0.85, 0.7, 0.4])
    >>> agreement["spearman"], round(agreement["mae"], 4), round(agreement["bias"], 4)  # same order; 0.25 / 3
    (1.0, 0.0833, 0.0167)
    """
    from scipy.stats import pearsonr, spearmanr

    e, t = _pairs(estimated, true)
    out = {
        "cases": int(e.size),
        "mae": float(np.abs(e - t).mean()) if e.size else float("nan"),
        "bias": float((e - t).mean()) if e.size else float("nan"),
    }
    constant = e.size < 3 or np.ptp(e) == 0 or np.ptp(t) == 0
    out["spearman"] = float("nan") if constant else float(spearmanr(e, t).statistic)
    out["pearson"] = float("nan") if constant else float(pearsonr(e, t).statistic)
    return out


def failure_detection_summary(confidence: Any, risk: Any) -> dict[str, float]:
    """AURC, AUGRC, the random and oracle AURC and the share of the gap between them that ``confidence`` closes.

    >>> summary = failure_detection_summary([0.9, 0.8, 0.3], [0.0, 1.0, 1.0])  # the failures least confident
    >>> round(summary["aurc"], 4), round(summary["aurc_random"], 4), summary["aurc_gap_closed"]
    (0.2778, 0.6667, 1.0)
    """
    c, r = _pairs(confidence, risk)
    out = {"cases": int(c.size), "aurc": aurc(c, r), "augrc": augrc(c, r)}
    out["aurc_random"] = float(r.mean()) if r.size else float("nan")
    out["aurc_oracle"] = aurc(-np.arange(r.size, dtype=np.float64), np.sort(r)) if r.size else float("nan")
    gap = out["aurc_random"] - out["aurc_oracle"]
    out["aurc_gap_closed"] = float((out["aurc_random"] - out["aurc"]) / gap) if gap > 0 else float("nan")
    return out


def save_risk_coverage_plot(confidence: Any, risk: Any, path: str | Path) -> Path:
    """Risk-coverage curve of ``confidence`` (the estimated DSC, risk ``1 - DSC``) beside the oracle and random
    orders, as a PNG (matplotlib)."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("save_risk_coverage_plot needs matplotlib: pip install 'calib-monai[plots]'.") from e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c, r = _pairs(confidence, risk)
    summary = failure_detection_summary(c, r)
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    curve = risk_coverage_curve(c, r)
    ax.plot(
        curve["coverage"],
        curve["risk"],
        drawstyle="default",
        lw=2,
        label=f"by estimated DSC (AURC {summary['aurc']:.3f})",
    )
    oracle = risk_coverage_curve(-np.arange(r.size, dtype=np.float64), np.sort(r))
    ax.plot(
        oracle["coverage"], oracle["risk"], ls="--", color="grey", label=f"oracle (AURC {summary['aurc_oracle']:.3f})"
    )
    ax.axhline(summary["aurc_random"], ls=":", color="black", label=f"random (AURC {summary['aurc_random']:.3f})")
    ax.set_xlabel("coverage (share of cases accepted, most confident first)")
    ax.set_ylabel("selective risk (mean 1 - DSC of the accepted)")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    gap = summary["aurc_gap_closed"]
    ax.set_title(f"{summary['cases']} cases; {gap:.0%} of the random-to-oracle gap closed", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
