"""The site study's figures from hand-made served records: the rank histogram's count against the binomial interval,
and the monitor replayed over random orders (an alarm exactly where the served martingale's arithmetic puts it)."""

from __future__ import annotations

import pytest
from scipy.stats import beta

from calib_monai.review.site_martingale import SiteMartingale
from studies.quality_report import ID
from studies.site import alarm_rows, rank_rows


def _record(case, condition, ranks, m=25, strength="", est=0.8, dice=0.8):
    return {
        "method": "ce_dice",
        "seed": "0",
        "condition": condition,
        "strength": strength,
        "case": case,
        "est_mean_dice": str(est),
        "mean_dice": str(dice),
        "validation_subjects": str(m),
        "validation_volumes": str(m),
        **{f"rank_{name}": str(rank) for name, rank in ranks.items()},
    }


def test_a_uniform_signal_lies_in_its_interval_and_a_shifted_one_does_not():
    # 52 ordinary volumes, n = m = 25: an exchangeable signal ranks 1 for 52 / 26 = 2 of them on average
    uniform = [1 + i % 26 for i in range(52)]  # each rank twice: exactly uniform, 2 at rank 1
    shifted = [1 if i < 16 else 2 + i % 24 for i in range(52)]  # 16 at rank 1, as the feature signal on ACDC
    records = [_record(f"c{i}", ID, {"input": u, "features": s}) for i, (u, s) in enumerate(zip(uniform, shifted))]
    rows = {r["signal"]: r for r in rank_rows(records)}
    # the central 95% interval of Binomial(52, 1/26): [0, 5]
    assert rows["input"]["interval_95"] == "0-5" and rows["input"]["rank_1"] == 2 and rows["input"]["within"] == "yes"
    assert rows["features"]["rank_1"] == 16 and rows["features"]["within"] == "no"
    assert rows["input"]["ks_p"] > 0.5 and rows["features"]["ks_p"] < 1e-3
    assert "case_score" not in rows  # a signal no record carries is not reported


def test_the_monitor_replay_alarms_where_its_arithmetic_says():
    m = 25
    # every case ranks 1 on one of 2 signals: the alarm comes at the fewest cases the martingale needs, in any order
    shifted = [_record(f"s{i}", "gamma", {"input": 1, "features": 7}, m, "strong", 0.8, 0.7) for i in range(12)]
    ordinary = [_record(f"o{i}", ID, {"input": 1 + i % 26, "features": 1 + (i * 7) % 26}, m) for i in range(40)]
    rows = {r["stream"]: r for r in alarm_rows(shifted + ordinary, orders=20)}
    test = SiteMartingale(m, ("input", "features"))
    fewest = test.fewest_cases()
    # by hand: u = 1 - (delta_ref / 2)^(1/m) bounds a rank-1 chance (Beta(1, m)), each bet lambda grows by
    # 1 - lambda + lambda / u per rank-1 case; the mean over 8 bets (4 per signal, half of them on the silent signal)
    u = beta.ppf(1 - 0.005 / 2, 1, m)
    assert u == pytest.approx(1 - (0.005 / 2) ** (1 / m))
    value = lambda n: sum((1 - b + b / u) ** n + (1 - b) ** n for b in (0.25, 0.5, 0.75, 0.9)) / 8  # noqa: E731
    by_hand = next(n for n in range(1, 50) if value(n) >= 1 / 0.005)
    assert fewest == by_hand
    gamma = rows["gamma (strong)"]
    assert gamma["orders_alarmed"] == "20/20" and gamma["median_cases_to_alarm"] == by_hand
    assert gamma["estimate_minus_truth"] == pytest.approx(0.1)
    # the cases served before the alarm carry no warning (none is flagged): each 0.1 above its truth
    assert gamma["unwarned_minus_truth"] == pytest.approx(0.1) and gamma["unwarned_over_0.03"] == 1.0
    flagged = [{**r, "flag": "1.0"} for r in shifted]  # every case flagged: no answer is silent
    assert alarm_rows(flagged, orders=3)[0]["unwarned_minus_truth"] == "n/a"
    # 40 ordinary cases with 3 rank-1 cases over the two signals never reach 200
    assert rows[ID]["orders_alarmed"] == "0/20" and rows[ID]["median_cases_to_alarm"] == "never"
    assert rows[ID]["estimate_minus_truth"] == 0.0 and rows[ID]["unwarned_over_0.03"] == 0.0
