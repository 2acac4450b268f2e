"""The site monitor (issue 47, ``calib_monai/review/site_monitor.py``) over simulated references and streams.

Each validation subject and each served case gets three nonconformities, as ``ValidatedRange.check`` sees them: the
case score's (a skewed level), the input signal's (a distance in 3 image statistics) and the feature signal's (a
distance in 8 features). A shifted case's input signal lies ``shift`` of its standard deviations further out (its
feature signal half as far). Ranks are the package's: ``combined_scores``, ``subject_maxima`` and ``at_least`` of
``calib_monai.review.conformal`` (the case in the robust standardisation of the m + 1, full-conformal);
``batch_ranks`` takes the same steps for many cases at once and is checked equal to them on every setting.

Measured: (a) the alarm rate of in-distribution streams over reference draws, (b) the share of references whose
chance of a false alarm exceeds ``delta_v`` (what ``delta_ref`` must bound), (c) the cases to an alarm at a shifted
site, and the fewest cases any alarm needs. Beside the monitor (a bet on each signal's rank), the issue's sketch: the
same bets on the combined rank alone (``signals=("combined",)``, its bound at the whole ``delta_ref``).

    python docs/results/site_monitor/simulate.py   # its output is the body of docs/results/site_monitor/README.md
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
from scipy.stats import binom, chi, gamma

from calib_monai.review import BETS, REFERENCE_SHARE, SiteMartingale
from calib_monai.review.conformal import at_least, combined_scores, competition_ranks, subject_maxima
from calib_monai.review.site_monitor import advance, new_state, summarise

SIGNALS = ("case_score", "input", "features")


#: the standard deviations of the input and feature distances of ordinary cases (chi with 3 and 8 degrees of freedom)
INPUT_SD, FEATURE_SD = float(chi(3).std()), float(chi(8).std())


def draw_volumes(rng: np.random.Generator, n: int, shift: float = 0.0) -> np.ndarray:
    """``(n, 3)`` nonconformities: case score (skewed), input (a 3-statistic distance), features (an 8-d one); a
    shifted case's input signal lies ``shift`` of its standard deviations further out, its feature signal half as
    far."""
    level = rng.gamma(2.0, 0.03, n)  # 0.9 minus the case score: a few low scores, most near the top
    statistics = np.linalg.norm(rng.normal(size=(n, 3)), axis=1) + shift * INPUT_SD
    features = np.linalg.norm(rng.normal(size=(n, 8)), axis=1) + shift / 2 * FEATURE_SD
    return np.stack([level, statistics, features], axis=1)


def package_ranks(reference: np.ndarray, case: np.ndarray) -> tuple[int, list[int]]:
    """The case's rank among the m + 1 and each signal's rank, by ``ValidatedRange.check``'s own steps."""
    m = len(reference)
    values = {name: np.append(reference[:, s], case[s]) for s, name in enumerate(SIGNALS)}
    _, combined = combined_scores(values, m + 1)
    most = subject_maxima(combined[:-1], np.arange(m), m)  # one volume per subject
    return 1 + int(at_least(most, combined[-1]).sum()), [int(competition_ranks(values[n])[-1]) for n in SIGNALS]


_LEAVE_ONE_OUT: dict[int, np.ndarray] = {}


def batch_ranks(reference: np.ndarray, cases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``package_ranks`` of each of ``cases`` (``(B, 3)``) against one reference: the same medians, scales and
    comparisons, over a leading axis (all values finite, no scale of 0: as drawn here)."""
    m, b = len(reference), len(cases)
    if m + 1 not in _LEAVE_ONE_OUT:
        _LEAVE_ONE_OUT[m + 1] = np.array([np.delete(np.arange(m + 1), i) for i in range(m + 1)])
    others_of = _LEAVE_ONE_OUT[m + 1]
    combined = np.full((b, m + 1), -np.inf)
    signal_ranks = np.empty((b, len(SIGNALS)), dtype=np.int64)
    for s in range(len(SIGNALS)):
        values = np.concatenate([np.broadcast_to(reference[:, s], (b, m)), cases[:, s : s + 1]], axis=1)
        others = values[:, others_of]
        median = np.median(others, axis=-1)
        scale = 1.4826 * np.median(np.abs(others - median[..., None]), axis=-1)
        combined = np.maximum(combined, (values - median) / scale)
        signal_ranks[:, s] = 1 + (values[:, :m] > values[:, m:] + 1e-9 * np.maximum(1, np.abs(values[:, m:]))).sum(1)
    ranks = 1 + at_least(combined[:, :m], combined[:, m:]).sum(1)
    return ranks, signal_ranks


def check_batch(rng: np.random.Generator, m: int, shift: float, references: int = 5, cases: int = 100) -> int:
    """``batch_ranks`` against ``package_ranks`` on fresh draws; the number of cases compared (raises on a miss)."""
    for _ in range(references):
        reference, served = draw_volumes(rng, m), draw_volumes(rng, cases, shift)
        ranks, signal_ranks = batch_ranks(reference, served)
        for i in range(cases):
            rank, signals = package_ranks(reference, served[i])
            assert (rank, signals) == (ranks[i], list(signal_ranks[i])), (m, shift, i)
    return references * cases


def as_cases(signal_ranks: np.ndarray) -> list[dict[str, int]]:
    return [dict(zip(SIGNALS, map(int, row))) for row in signal_ranks]


def monitor_alarm(test: SiteMartingale, signal_ranks: np.ndarray) -> float:
    """The monitor's (the package's ``log_values``) cases to an alarm on one stream; inf: none."""
    return test.first_alarm(test.log_values(as_cases(signal_ranks))) or math.inf


def sketch_alarm(sketch: SiteMartingale, ranks: np.ndarray) -> float:
    """The issue's sketch: the same bets on the combined rank."""
    return sketch.first_alarm(sketch.log_values([{"combined": int(r)} for r in ranks])) or math.inf


def alarm_rate_given(test: SiteMartingale, pis: np.ndarray, rng, streams: int, horizon: int) -> float:
    """The chance of an alarm within ``horizon`` cases whose signals rank 1 independently with chances ``pis`` (one
    per signal: they are drawn independently here), by ``streams`` simulated streams; the martingale from the counts
    of rank-1 cases (each bet's product depends on them only), checked against ``test.log_values``."""
    from scipy.special import logsumexp

    (u,) = test.bounds
    n = np.arange(1, horizon + 1)
    alarms = 0
    for start in range(0, streams, 1000):
        hits = rng.random((min(1000, streams - start), horizon, len(pis))) < np.asarray(pis)
        counts = np.cumsum(hits, axis=1)
        logs = [
            counts[..., s] * math.log(1 - b + b / u) + (n - counts[..., s]) * math.log(1 - b)
            for s in range(len(pis))
            for b in test.bets
        ]
        log_m = logsumexp(np.stack(logs), axis=0) - math.log(len(logs))
        if start == 0:
            assert np.allclose(log_m[0], test.log_values(as_cases(np.where(hits[0], 1, test.m + 1))))
        alarms += int((log_m >= math.log(test.threshold)).any(axis=1).sum())
    return alarms / streams


def in_distribution(rng, m: int, references: int, stream: int, streams: int) -> dict:
    """(a) and (b) at one m: ``streams`` streams of ``stream`` cases per reference; pi from all their cases."""
    test, sketch = SiteMartingale(m, SIGNALS), SiteMartingale(m, ("combined",))
    (u,), (u_sketch,) = test.bounds, sketch.bounds
    alarms = sketch_alarms = 0
    pis, pis_sketch, split = np.empty((references, len(SIGNALS))), np.empty(references), np.empty(references)
    for r in range(references):
        reference = draw_volumes(rng, m)
        ranks, signal_ranks = batch_ranks(reference, draw_volumes(rng, stream * streams))
        for i in range(streams):
            part = slice(i * stream, (i + 1) * stream)
            alarms += monitor_alarm(test, signal_ranks[part]) < math.inf
            sketch_alarms += sketch_alarm(sketch, ranks[part]) < math.inf
        pis[r], pis_sketch[r] = np.mean(signal_ranks <= 1, axis=0), np.mean(ranks <= 1)
        # the split-conformal law itself: one fixed score (the input distance) against the reference's maximum
        split[r] = np.mean(draw_volumes(rng, stream * streams)[:, 1] > reference[:, 1].max())
    bad = np.flatnonzero((pis > u).any(axis=1))
    # a good reference alarms at most delta_v of the time (Ville); a bad one: measured, with its estimated pi
    conditional = [alarm_rate_given(test, pis[b], rng, 20000, stream) for b in bad]
    total = references * streams
    return {
        "m": m,
        "u": u,
        "u_sketch": u_sketch,
        "alarms": alarms,
        "sketch_alarms": sketch_alarms,
        "streams": total,
        "slack": int(binom.ppf(0.99, total, test.delta)),
        "bad": len(bad) / references,
        "per_signal_beyond": (pis > u).mean(axis=0),
        "over_delta_v": sum(c > test.delta_stream for c in conditional) / references,
        "worst": max(conditional, default=0.0),
        "pi_mean": pis.mean(axis=0),
        "sketch_beyond": float(np.mean(pis_sketch > u_sketch)),
        "split_beyond": float(np.mean(split > u_sketch)),
    }


def shifted(rng, m: int, shift: float, references: int, horizon: int) -> dict:
    """(c) at one m and shift: cases to an alarm (one stream per reference) of the monitor and the sketch."""
    test, sketch = SiteMartingale(m, SIGNALS), SiteMartingale(m, ("combined",))
    delays, sketch_delays, input_one, combined_one, moved = [], [], [], [], []
    for _ in range(references):
        ranks, signal_ranks = batch_ranks(draw_volumes(rng, m), draw_volumes(rng, horizon, shift))
        delays.append(monitor_alarm(test, signal_ranks))
        sketch_delays.append(sketch_alarm(sketch, ranks))
        input_one.append(np.mean(signal_ranks[:, 1] <= 1))
        combined_one.append(np.mean(ranks <= 1))
        if delays[-1] < math.inf:  # the package's attribution at the alarm
            state = new_state("", "", test)
            for case in as_cases(signal_ranks[: int(delays[-1])]):
                advance(state, 1, case, test)
            moved.append(summarise(state, Path("site.json"))["evidence"]["signal_that_moved"])
    delays, sketch_delays = np.sort(delays), np.sort(sketch_delays)
    q90 = math.ceil(0.9 * references) - 1
    return {
        "input_one": float(np.mean(input_one)),
        "combined_one": float(np.mean(combined_one)),
        "alarmed": float(np.mean(np.isfinite(delays))),
        "median": float(np.median(delays)),
        "q90": float(delays[q90]),  # inf: fewer than 90% alarmed within the horizon
        "sketch_alarmed": float(np.mean(np.isfinite(sketch_delays))),
        "sketch_median": float(np.median(sketch_delays)),
        "input_moved": float(np.mean([name == "input" for name in moved])) if moved else float("nan"),
    }


def bernoulli_delays(rng, m: int, pis: tuple[float, ...], streams: int, horizon: int) -> tuple[float, float]:
    """Cases to an alarm of the monitor when each signal ranks 1 with its chance in ``pis``, independently."""
    test = SiteMartingale(m, SIGNALS)
    delays = [monitor_alarm(test, np.where(rng.random((horizon, 3)) < pis, 1, m + 1)) for _ in range(streams)]
    return float(np.median(delays)), float(np.mean(np.isfinite(delays)))


def fmt(x: float) -> str:
    return "> 200" if x == math.inf else f"{x:g}"


def exact_beyond(rng, m: int, references: int) -> tuple[float, np.ndarray]:
    """The monitor's bound without estimation noise: each signal's ``pi_s = P(rank_s = 1 | reference)`` is its
    survival function at the reference's largest value (the law of ``draw_volumes``); the share of ``references``
    draws with some ``pi_s > u_1``, and per signal."""
    (u,) = SiteMartingale(m, SIGNALS).bounds
    largest = np.stack([draw_volumes(rng, m).max(0) for _ in range(references)])
    pis = np.stack(
        [gamma(2.0, scale=0.03).sf(largest[:, 0]), chi(3).sf(largest[:, 1]), chi(8).sf(largest[:, 2])], axis=1
    )
    return float(np.mean((pis > u).any(1))), np.mean(pis > u, axis=0)


def sketch_tail(rng, m: int, references: int, cases: int) -> tuple[float, float, float]:
    """The combined rank's ``pi`` (the sketch's event) against its bound ``u_1`` at the whole ``delta_ref``: the share
    of references beyond it, and the same estimate for the split-conformal event of one fixed score (the input
    distance), as noisy (``cases`` per reference), whose law is exactly Beta(1, m)."""
    (u,) = SiteMartingale(m, ("combined",)).bounds
    full, split = np.empty(references), np.empty(references)
    for r in range(references):
        reference = draw_volumes(rng, m)
        ranks, _ = batch_ranks(reference, draw_volumes(rng, cases))
        full[r] = np.mean(ranks <= 1)
        split[r] = np.mean(draw_volumes(rng, cases)[:, 1] > reference[:, 1].max())
    return u, float(np.mean(full > u)), float(np.mean(split > u))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--references", type=int, default=2000, help="reference draws per m (a, b)")
    parser.add_argument("--stream", type=int, default=200, help="cases per in-distribution stream")
    parser.add_argument("--streams", type=int, default=10, help="in-distribution streams per reference")
    parser.add_argument("--shifted", type=int, default=500, help="reference draws per shifted setting (c)")
    parser.add_argument("--exact", type=int, default=100000, help="reference draws of the exact bound check")
    parser.add_argument("--tail", type=int, default=6000, help="reference draws per m of the combined rank's tail")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    start = time.time()
    ms, shifts = (10, 20, 25), (2.0, 3.0, 5.0)
    compared = sum(check_batch(rng, m, s) for m in ms for s in (0.0, 3.0))
    print(
        f"Settings: delta = 0.01 (delta_ref = delta_v = {0.01 * REFERENCE_SHARE:g}), k = 1, bets {BETS}, "
        f"signals {', '.join(SIGNALS)}; seed {args.seed}. `batch_ranks` gave the package's ranks on all {compared} "
        "cases compared.\n"
    )
    print(
        f"## (a), (b): in-distribution, {args.references} reference draws per m, {args.streams} streams of "
        f"{args.stream} cases each\n"
    )
    print(
        "| m | u_1 (per signal) | alarms / streams | 99% binomial bound at delta | refs with some pi_s > u_1 "
        "(case score, input, features) | refs with P(alarm within 200 \\| ref) > delta_v (worst) | mean pi_s "
        "(1/(m+1)) | sketch: u_1, alarms, refs with pi > u_1 | split conformal: refs with pi > u_1 of the sketch |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for m in ms:
        a = in_distribution(rng, m, args.references, args.stream, args.streams)
        beyond = ", ".join(f"{v:.4f}" for v in a["per_signal_beyond"])
        print(
            f"| {m} | {a['u']:.3f} | {a['alarms']} / {a['streams']} | {a['slack']} | {a['bad']:.4f} ({beyond}) | "
            f"{a['over_delta_v']:.4f} ({a['worst']:.3f}) | {', '.join(f'{p:.3f}' for p in a['pi_mean'])} "
            f"({1 / (m + 1):.3f}) | {a['u_sketch']:.3f}, {a['sketch_alarms']}, {a['sketch_beyond']:.4f} | "
            f"{a['split_beyond']:.4f} |"
        )
    print(
        f"\nThe monitor's bound without estimation noise ({args.exact} reference draws per m; pi_s from each signal's "
        "law):\n"
    )
    print("| m | refs with some pi_s > u_1 | case score, input, features |")
    print("|---|---|---|")
    for m in ms:
        share, per_signal = exact_beyond(rng, m, args.exact)
        print(f"| {m} | {share:.4f} | {', '.join(f'{v:.4f}' for v in per_signal)} |")
    print(
        f"\nThe sketch's event, the combined rank 1, against its bound ({args.tail} reference draws per m, 1000 cases "
        "each):\n"
    )
    print("| m | u_1 (delta_ref = 0.005) | refs with pi > u_1: combined rank | same estimate, split conformal |")
    print("|---|---|---|---|")
    for m in (10, 20):
        u, full, split = sketch_tail(rng, m, args.tail, 1000)
        print(f"| {m} | {u:.3f} | {full:.4f} | {split:.4f} |")
    print(f"\n## (c): shifted sites, {args.shifted} reference draws per setting, one stream of up to 200 cases each\n")
    print(
        "| m | shift (input SD) | input rank 1 | combined rank 1 | monitor: alarmed within 200 | median cases | 90% "
        "within | input named as the signal that moved | sketch: alarmed | sketch: median |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in ms:
        for shift in shifts:
            c = shifted(rng, m, shift, args.shifted, 200)
            print(
                f"| {m} | {shift:g} | {c['input_one']:.2f} | {c['combined_one']:.2f} | {c['alarmed']:.3f} | "
                f"{fmt(c['median'])} | {fmt(c['q90'])} | {c['input_moved']:.2f} | {c['sketch_alarmed']:.3f} | "
                f"{fmt(c['sketch_median'])} |"
            )
    print("\n## The measured rates as streams (input signal rank 1; the others at 1/(m+1)), 5000 streams each\n")
    print("| m | site (32 of 33): median cases (alarmed within 200) | ordinary (3 of 40): alarmed within 200 |")
    print("|---|---|---|")
    for m in ms:
        rest = 1 / (m + 1)
        site, alarmed = bernoulli_delays(rng, m, (rest, 32 / 33, rest), 5000, 200)
        _, ordinary = bernoulli_delays(rng, m, (rest, 3 / 40, rest), 5000, 200)
        print(f"| {m} | {fmt(site)} ({alarmed:.3f}) | {ordinary:.4f} |")
    print("\n## The fewest cases to an alarm (every case ranked 1 on one signal)\n")
    print(
        "A bet on a signal's rank 1 multiplies by at most 1/u_1 per case: no monitor with this budget alarms before "
        "`ceil(log(1/delta_v) / log(1/u_1))` cases (the bound); the monitor's mixture of 4 bets per signal needs a "
        "little more.\n"
    )
    print(
        "| m | u_1 (S = 1 / 3 signals) | bound (S = 1 / 3) | monitor, S = 1 / 2 / 3 signals | monitor, S = 3, two "
        "signals moved | monitor, S = 3, reference share 0.3 / 0.7 | 3 cases possible (S = 1 / 3)? |"
    )
    print("|---|---|---|---|---|---|---|")
    for m in (10, 15, 20, 25, 30, 40, 50):
        tests = [SiteMartingale(m, SIGNALS[:s]) for s in (1, 2, 3)]
        us = [t.bounds[0] for t in tests]
        bounds = [math.ceil(math.log(t.threshold) / -math.log(u) - 1e-9) for t, u in zip(tests, us)]
        shares = [SiteMartingale(m, SIGNALS, reference_share=r).fewest_cases() for r in (0.3, 0.7)]
        print(
            f"| {m} | {us[0]:.3f} / {us[2]:.3f} | {bounds[0]} / {bounds[2]} | "
            f"{' / '.join(str(t.fewest_cases()) for t in tests)} | {tests[2].fewest_cases(moved=2)} | "
            f"{shares[0]} / {shares[1]} | {'yes' if bounds[0] <= 3 else 'no'} / {'yes' if bounds[2] <= 3 else 'no'} |"
        )
    for s in (1, 3):
        bound = next(m for m in range(1, 1000) if (1 / SiteMartingale(m, SIGNALS[:s]).bounds[0]) ** 3 >= 200)
        monitor = next(m for m in range(1, 1000) if SiteMartingale(m, SIGNALS[:s]).fewest_cases() <= 3)
        print(
            f"\nThree rank-1 cases can alarm with {s} signal(s) from m = {bound} validation subjects (any bet) and "
            f"from m = {monitor} (the monitor's bets)."
        )
    print(f"\n({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
