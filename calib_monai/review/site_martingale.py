"""The arithmetic of the site monitor's test (:mod:`calib_monai.review.site_monitor` states the construction and its
guarantee): the bounds ``u_k`` of an ordinary case's chance to rank within ``k`` given the reference, and the
martingale of a stream of cases from their signals' ranks: over the ordered cases at once, or one case at a time from
the running log-products (:meth:`SiteMartingale.step`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from calib_monai.checks import check_number

__all__ = ["BETS", "DEFAULT_DELTA", "REFERENCE_SHARE", "SiteMartingale", "reference_bounds"]

DEFAULT_DELTA = 0.01
#: The share of ``delta`` spent on the reference draw (``delta_ref``); the rest is Ville's (``delta_v``). Even: a
#: larger ``delta_ref`` lowers ``u_1`` (faster alarms) and raises the threshold ``1 / delta_v`` by about as much
#: (docs/results/site_monitor: the fewest cases to an alarm move by at most one over the shares 0.3-0.7).
REFERENCE_SHARE = 0.5
#: The bets ``lambda`` the martingale averages over. No 1.0: one ordinary-looking case would zero that bet for good,
#: and a new site mixes a few in (32 of 33 shifted volumes ranked 1); 0.9 keeps 90% of its growth on rank-1 cases.
BETS = (0.25, 0.5, 0.75, 0.9)


def reference_bounds(
    m: int, ks: Sequence[int] = (1,), delta_ref: float = DEFAULT_DELTA * REFERENCE_SHARE
) -> list[float]:
    """``u_k`` for each ``k``: the ``1 - delta_ref`` quantile of ``Beta(k, m + 1 - k)``, which bounds the chance
    ``P(rank <= k | reference)`` of an ordinary case (split conformal) for all but ``delta_ref`` of reference draws;
    ``delta_ref`` is the share of one event (the monitor divides its budget by the number of signals and ``k``)."""
    from scipy.stats import beta  # on first use: the serving path imports this module

    return [float(beta.ppf(1 - delta_ref, k, m + 1 - k)) for k in ks]


@dataclass(frozen=True)
class SiteMartingale:
    """The test of one deployment's stream: ``m`` validation subjects, the ``signals`` the range judges by, total
    error ``delta``, the ``ks`` and the ``bets`` averaged over. Values come from the ordered cases alone."""

    m: int
    signals: tuple[str, ...] = ("case_score",)
    delta: float = DEFAULT_DELTA
    ks: tuple[int, ...] = (1,)
    bets: tuple[float, ...] = BETS
    reference_share: float = REFERENCE_SHARE

    def __post_init__(self) -> None:
        check_number("site monitor m (validation subjects)", self.m, 1, integer=True)
        check_number("site monitor delta", self.delta, 0, 1, low_open=True, high_open=True)
        check_number("site monitor reference_share", self.reference_share, 0, 1, low_open=True, high_open=True)
        for k in self.ks:
            check_number("site monitor k", k, 1, self.m, integer=True, hint="a rank among the m + 1 subjects")
        for bet in self.bets:
            check_number("site monitor bet", bet, 0, 1, low_open=True)
        for name, values in (("signals", self.signals), ("ks", self.ks), ("bets", self.bets)):
            if not values or len(set(values)) != len(values):
                raise ValueError(f"site monitor {name} must be distinct and at least one, got {list(values)}")

    @property
    def delta_reference(self) -> float:
        return self.delta * self.reference_share

    @property
    def delta_stream(self) -> float:
        return self.delta - self.delta_reference

    @property
    def threshold(self) -> float:
        return 1 / self.delta_stream

    @cached_property
    def bounds(self) -> list[float]:
        """``u_k`` for each of ``ks``, the reference budget split over the signals and ``ks``."""
        return reference_bounds(self.m, self.ks, self.delta_reference / (len(self.signals) * len(self.ks)))

    def component_logs(self, signal_ranks: Sequence[Mapping[str, int]]) -> dict[str, np.ndarray]:
        """Per signal, ``log`` of each bet's product after each case: ``(len(ks) * len(bets), n)``; a case without
        the signal places no bet on it."""
        out = {}
        for name in self.signals:
            ranks = np.array([case.get(name, 0) for case in signal_ranks], dtype=np.int64)  # 0: left out
            rows = []
            for k, u in zip(self.ks, self.bounds):
                for bet in self.bets:
                    factor = np.where(ranks <= k, 1 - bet + bet / u, 1 - bet)
                    rows.append(np.cumsum(np.log(np.where(ranks == 0, 1.0, factor))))
            out[name] = np.stack(rows).reshape(len(rows), len(ranks))
        return out

    def step(self, components: Mapping[str, Sequence[float]] | None, signal_ranks: Mapping[str, int]) -> dict:
        """Each signal's bets' log-products after one more case (``signal_ranks``), from those before it
        (``components``; None: the stream's start, all 0): :meth:`component_logs`' last column, by the same additions
        in the same order. Why: the served path keeps only these, so a case costs the same at any stream length
        instead of a recomputation over every case seen."""
        out = {}
        for name in self.signals:
            rank = int(signal_ranks.get(name, 0))  # 0: left out, no bet
            before = np.zeros(len(self.ks) * len(self.bets)) if components is None else np.asarray(components[name])
            factors = [
                1.0 if rank == 0 else (1 - bet + bet / u if rank <= k else 1 - bet)
                for k, u in zip(self.ks, self.bounds)
                for bet in self.bets
            ]
            out[name] = (before + np.log(np.asarray(factors))).tolist()
        return out

    def log_value(self, components: Mapping[str, Sequence[float]]) -> float:
        """``log M`` from each signal's bets' log-products (:meth:`step`): their mean, as :meth:`log_values` (of the
        signals given: one signal's own bets, to say which moved)."""
        from scipy.special import logsumexp

        rows = np.concatenate([np.asarray(values, dtype=np.float64) for values in components.values()])
        return float(logsumexp(rows)) - math.log(len(rows))

    def log_values(self, signal_ranks: Sequence[Mapping[str, int]]) -> np.ndarray:
        """``log M_n`` after each case (``M_0 = 1`` not included): the mean of every signal's bets' products."""
        from scipy.special import logsumexp

        rows = np.concatenate(list(self.component_logs(signal_ranks).values()))
        return logsumexp(rows, axis=0) - math.log(len(rows))

    def first_alarm(self, log_values: np.ndarray) -> int | None:
        """The number of cases at which ``M`` first reached the threshold (None: not yet)."""
        reached = np.flatnonzero(log_values >= math.log(self.threshold))
        return int(reached[0]) + 1 if reached.size else None

    def fewest_cases(self, moved: int = 1) -> int:
        """The fewest cases that reach the threshold when each ranks 1 on ``moved`` of the signals (not on the
        others)."""
        n = 1
        case = {name: 1 if i < moved else self.m + 1 for i, name in enumerate(self.signals)}
        while self.first_alarm(self.log_values([case] * n)) is None:
            n += 1
        return n

    def settings(self) -> dict[str, Any]:
        return {
            "validation_subjects": self.m,
            "signals": list(self.signals),
            "delta": self.delta,
            "ks": list(self.ks),
            "bets": list(self.bets),
            "reference_share": self.reference_share,
        }

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> SiteMartingale:
        return cls(
            int(settings["validation_subjects"]),
            tuple(str(s) for s in settings["signals"]),
            float(settings["delta"]),
            tuple(int(k) for k in settings["ks"]),
            tuple(float(b) for b in settings["bets"]),
            float(settings["reference_share"]),
        )
