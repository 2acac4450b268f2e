"""The site monitor (``calib_monai/review/site_monitor.py``, issue 47): its martingale by hand, its bound against
scipy's Beta quantile, the stored state (dedup, restart, reset, refusals, two processes), and a fast simulation of
its two promises: rare false alarms over reference draws, an early alarm at a shifted site."""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import beta, binom

from calib_monai.review import SITE_FILE, SiteMartingale, SiteMonitor, SiteStateError, reference_bounds
from calib_monai.review.conformal import competition_ranks
from calib_monai.review.site_monitor import ARCHIVE_FOLDER, advance, new_state, reset_site, show_site, summarise
from calib_monai.review.site_store import CASES_FILE

REPO = Path(__file__).resolve().parents[1]
WEIGHTS, RANGE = "a1" * 32, "b2" * 32
SIGNALS = ("case_score", "input", "features")


def _monitor(folder, m=20, **kwargs) -> SiteMonitor:
    return SiteMonitor(folder, kwargs.pop("weights", WEIGHTS), kwargs.pop("range_sha", RANGE), m, SIGNALS, **kwargs)


def _logged(folder) -> list[dict]:
    """The served cases as the case log holds them, one JSON line each."""
    return [json.loads(line) for line in (Path(folder) / CASES_FILE).read_text().splitlines()]


def test_bounds_are_the_beta_quantile_and_its_closed_form_for_k_1():
    for m in (5, 10, 20, 25):
        assert reference_bounds(m, (1,), 0.005)[0] == pytest.approx(beta.ppf(0.995, 1, m), rel=1e-12)
        assert reference_bounds(m, (1,), 0.005)[0] == pytest.approx(1 - 0.005 ** (1 / m), rel=1e-12)
        assert reference_bounds(m, (2,), 0.005)[0] == pytest.approx(beta.ppf(0.995, 2, m - 1), rel=1e-12)
    # the monitor splits delta_ref = 0.005 over its 3 signals and 2 ks
    test = SiteMartingale(20, SIGNALS, ks=(1, 2))
    assert test.delta_reference == test.delta_stream == pytest.approx(0.005) and test.threshold == pytest.approx(200)
    assert test.bounds == pytest.approx([1 - (0.005 / 6) ** (1 / 20), beta.ppf(1 - 0.005 / 6, 2, 19)])


def test_the_martingale_by_hand():
    """m = 10, one signal: u = 1 - 0.005^(1/10) = 0.411296, 1/u = 2.431339. A rank-1 case multiplies bet lambda by
    1 - lambda + lambda / u, another case by 1 - lambda; M is the mean over the bets 0.25, 0.5, 0.75, 0.9."""
    test = SiteMartingale(10, ("input",))
    assert test.bounds[0] == pytest.approx(0.41129598, rel=1e-7)
    hit = [1.357835, 1.715670, 2.073504, 2.288205]  # 0.75 + 0.25 * 2.431339, 0.5 + 0.5 * 2.431339, ...
    miss = [0.75, 0.5, 0.25, 0.1]
    by_hand = [
        sum(hit) / 4,  # 1.858804
        sum(h * s for h, s in zip(hit, miss)) / 4,  # 0.655852
        sum(h * s * h for h, s in zip(hit, miss)) / 4,  # 1.113248
    ]
    values = np.exp(test.log_values([{"input": 1}, {"input": 3}, {"input": 1}]))
    assert values == pytest.approx(by_hand, rel=1e-6)
    assert values == pytest.approx([1.858804, 0.655852, 1.113248], rel=1e-6)
    # a signal the case leaves out places no bet; another signal's bets average in with their own
    two = SiteMartingale(10, ("input", "features"), delta=0.01)
    u2 = 1 - (0.005 / 2) ** (1 / 10)
    expected = (sum(1 - b + b / u2 for b in two.bets) + 4) / 8
    assert np.exp(two.log_values([{"input": 1}]))[0] == pytest.approx(expected, rel=1e-12)
    # the fewest all-rank-1 cases: the first n at which the martingale reaches 1 / delta_v = 200
    n = test.fewest_cases()
    logs = test.log_values([{"input": 1}] * n)
    assert logs[-1] >= math.log(200) > logs[-2]


def test_observe_counts_an_image_once_and_a_restart_continues(tmp_path):
    monitor = _monitor(tmp_path)
    first = monitor.observe("hash0", 1, {"case_score": {"rank": 4}, "input": {"rank": 1}, "features": {"rank": 2}})
    again = monitor.observe("hash0", 1, {"input": 1})
    assert first["counted"] and not again["counted"] and again["cases"] == 1 and again["value"] == first["value"]
    for i in range(1, 4):
        monitor.observe(f"hash{i}", 2, {"case_score": 3, "input": 1, "features": 5})
    restarted = _monitor(tmp_path)  # a new process on the same folder: the same stream
    assert restarted.status()["cases"] == 4
    after = restarted.observe("hash4", 1, {"case_score": 2, "input": 1, "features": 7})
    cases = [{"case_score": 4, "input": 1, "features": 2}] + [{"case_score": 3, "input": 1, "features": 5}] * 3
    cases.append({"case_score": 2, "input": 1, "features": 7})
    expected = math.exp(SiteMartingale(20, SIGNALS).log_values(cases)[-1])
    assert after["cases"] == 5 and after["value"] == pytest.approx(expected, rel=1e-12)
    assert after["signal_hits"] == {"case_score": 0, "input": 5, "features": 0}
    stored = json.loads((tmp_path / SITE_FILE).read_text())
    assert [c["hash"] for c in _logged(tmp_path)] == [f"hash{i}" for i in range(5)]
    assert stored["cases"] == 5 and stored["format_version"] == 2
    assert (stored["weights_sha256"], stored["range_sha256"]) == (WEIGHTS, RANGE)


def test_the_alarm_its_evidence_and_message_stay_until_reset(tmp_path):
    monitor = _monitor(tmp_path)
    fewest = SiteMartingale(20, SIGNALS).fewest_cases()
    for i in range(fewest - 1):
        assert not monitor.observe(f"h{i}", 1, {"case_score": 5, "input": 1, "features": 3})["alarm"]
    state = monitor.observe("last", 1, {"case_score": 5, "input": 1, "features": 3})
    assert state["alarm"] and state["evidence"]["cases"] == fewest and state["evidence"]["value"] >= 200
    assert state["evidence"]["signal_that_moved"] == "input" and state["evidence"]["delta"] == 0.01
    assert (
        "not vouched for at this site" in state["message"] and f"calib-monai site reset {tmp_path}" in state["message"]
    )
    later = monitor.observe("ordinary", 9, {"case_score": 9, "input": 12, "features": 4})
    assert later["alarm"] and later["message"] == state["message"] and later["value"] < state["value"]
    assert show_site(tmp_path)["evidence"] == state["evidence"]
    assert reset_site(tmp_path)["cleared_cases"] == fewest + 1
    assert monitor.status()["cases"] == 0 and not monitor.observe("new", 1, {"input": 1})["alarm"]


def test_a_file_it_cannot_use_is_one_line_naming_it_and_the_fix(tmp_path, caplog):
    path = tmp_path / SITE_FILE
    path.write_text("{cut off")
    with pytest.raises(SiteStateError, match="corrupt") as err:
        _monitor(tmp_path)
    assert str(path) in str(err.value) and f"`calib-monai site reset {tmp_path}`" in str(err.value)
    assert "\n" not in str(err.value)
    reset_site(tmp_path)  # the fix works on a corrupt file
    _monitor(tmp_path).observe("h", 3, {"input": 2})
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "format_version": 99}))
    with pytest.raises(SiteStateError, match="format_version 99; this calib-monai reads 2") as err:
        _monitor(tmp_path)
    assert str(path) in str(err.value) and "site reset" in str(err.value)
    path.write_text(json.dumps(state))
    with pytest.raises(SiteStateError, match="other monitor settings .delta 0.01 -> 0.05"):
        _monitor(tmp_path, delta=0.05)
    # other weights (a retrained model): the record is archived whole, said in the log, and a new stream starts
    with caplog.at_level(logging.WARNING, logger="calib_monai"):
        retrained = _monitor(tmp_path, weights="c3" * 32)
    archived = tmp_path / ARCHIVE_FOLDER / f"site_{'a1' * 6}_{'b2' * 6}.json"
    logged = [{"hash": "h", "rank": 3, "signal_ranks": {"input": 2}}]
    assert json.loads(archived.read_text()) == {**state, "case_log": logged} and retrained.status()["cases"] == 0
    assert not path.exists() and not (tmp_path / CASES_FILE).exists()
    (line,) = [r.getMessage() for r in caplog.records if "new site record" in r.getMessage()]
    assert (
        "a1a1a1a1a1a1" in line and "c3c3c3c3c3c3" in line and "(1 cases, alarm: no)" in line and str(archived) in line
    )
    retrained.observe("h2", 1, {"input": 1})
    _monitor(tmp_path, range_sha="d4" * 32)  # and another range: a second archive beside the first
    assert (tmp_path / ARCHIVE_FOLDER / f"site_{'c3' * 6}_{'b2' * 6}.json").is_file()
    path.write_text(json.dumps(state))
    for broken in ({"cases": "one"}, {"log_products": {"input": [0.0]}}, {"alarm": {"cases": 1}}):
        path.write_text(json.dumps({**state, **broken}))
        with pytest.raises(SiteStateError, match="corrupt"):
            show_site(tmp_path)


def test_the_command_line_shows_and_resets(tmp_path):
    (tmp_path / SITE_FILE).write_text("[]")
    run = [sys.executable, "-m", "calib_monai.cli", "site"]
    shown = subprocess.run([*run, "show", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=300)
    lines = shown.stderr.strip().splitlines()
    assert shown.returncode == 2 and len(lines) == 1 and lines[0].startswith("calib-monai: error: site state")
    assert f"calib-monai site reset {tmp_path}" in lines[0]
    reset = subprocess.run([*run, "reset", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert reset.returncode == 0 and "unreadable" in reset.stdout and not (tmp_path / SITE_FILE).exists()


def _serve(folder: str, worker: int, cases: int, start) -> None:
    start.wait()
    monitor = _monitor(folder)
    for i in range(cases):
        monitor.observe(f"worker{worker}-case{i}", 5, {"input": 3})


def test_two_processes_on_one_state_lose_no_case(tmp_path):
    context = multiprocessing.get_context("fork")
    start = context.Barrier(3)
    workers = [context.Process(target=_serve, args=(str(tmp_path), w, 30, start)) for w in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    assert sorted(c["hash"] for c in _logged(tmp_path)) == sorted(
        f"worker{w}-case{i}" for w in range(3) for i in range(30)
    )
    assert json.loads((tmp_path / SITE_FILE).read_text())["cases"] == 90


def _recomputed(test: SiteMartingale, cases: list[dict]) -> dict:
    """What the stream says, recomputed over all its cases at once (``component_logs``, ``log_values``,
    ``first_alarm``): the value, the alarm's case and value, the signal that moved and the counts up to the alarm."""
    ranks = [c["signal_ranks"] for c in cases]
    components, logs = test.component_logs(ranks), test.log_values(ranks)
    at = test.first_alarm(logs)
    upto = cases[:at] if at else cases
    hits = {name: sum(0 < r.get(name, 0) <= 1 for r in (c["signal_ranks"] for c in upto)) for name in test.signals}
    out = {"value": math.exp(logs[-1]), "alarm": at, "hits": hits, "combined": sum(c["rank"] <= 1 for c in upto)}
    if at:
        grown = {name: np.log(np.exp(rows[:, at - 1]).mean()) for name, rows in components.items()}
        out.update(at_value=math.exp(logs[at - 1]), moved=max(grown, key=grown.get))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_running_state_gives_what_the_full_recomputation_gives(seed):
    """Streams of 60 random cases (m = 20, 3 signals, ks 1 and 2), the even seeds shifted on one signal (they alarm):
    the state kept case by case (``advance``) says what ``SiteMartingale`` over every case says, to 1e-12."""
    rng = np.random.default_rng(seed)
    test = SiteMartingale(20, SIGNALS, ks=(1, 2))
    state, cases = new_state(WEIGHTS, RANGE, test), []
    for i in range(60):
        ranks = {name: int(rng.integers(1, 22)) for name in SIGNALS if rng.random() > 0.1}  # some left out
        if seed % 2 == 0 and rng.random() < 0.9:
            ranks[SIGNALS[seed % 3]] = 1
        cases.append({"hash": str(i), "rank": int(rng.integers(1, 22)), "signal_ranks": ranks})
        advance(state, cases[-1]["rank"], ranks)
        got, want = summarise(state, Path("site.json")), _recomputed(test, cases)
        assert got["value"] == pytest.approx(want["value"], rel=1e-12) and got["signal_hits"] == want["hits"]
        assert got["alarm"] == (want["alarm"] is not None)
        if got["alarm"]:
            evidence = got["evidence"]
            assert (evidence["cases"], evidence["signal_that_moved"]) == (want["alarm"], want["moved"])
            assert evidence["value"] == pytest.approx(want["at_value"], rel=1e-12)
            assert evidence["combined_rank_within_k"] == want["combined"]
    assert got["alarm"] == (seed % 2 == 0) and got["cases"] == 60
    if got["alarm"]:
        assert got["evidence"]["signal_that_moved"] == SIGNALS[seed % 3]


def test_a_stopped_write_is_recovered_and_a_short_log_refused(tmp_path):
    monitor = _monitor(tmp_path)
    for i in range(3):
        before = monitor.observe(f"h{i}", 2, {"input": 1, "features": 4})
    log = tmp_path / CASES_FILE
    recorded = log.read_bytes()
    with log.open("ab") as f:  # a write stopped after the case's line, before site.json recorded it
        f.write(b'{"hash": "stopped", "rank": 1, "signal_ranks": {"input": 1}}\n{"hash": "cut')
    restarted = _monitor(tmp_path)  # the case was never answered: it is cut off, and counts when served again
    assert log.read_bytes() == recorded and restarted.status() == summarise(
        json.loads((tmp_path / SITE_FILE).read_text()), tmp_path / SITE_FILE
    )
    assert restarted.status()["value"] == before["value"] and restarted.status()["cases"] == 3
    assert restarted.observe("stopped", 1, {"input": 1})["counted"] and restarted.status()["cases"] == 4
    log.write_bytes(recorded[:-5])  # shorter than recorded: corrupt, the fix named
    with pytest.raises(SiteStateError, match=f"corrupt .*{CASES_FILE} holds .* bytes, site.json records") as err:
        restarted.observe("next", 1, {"input": 1})
    assert f"`calib-monai site reset {tmp_path}`" in str(err.value) and "\n" not in str(err.value)
    assert reset_site(tmp_path)["cleared_cases"] == 4 and not log.exists()


def test_a_version_1_state_is_refused_with_the_fix(tmp_path):
    path = tmp_path / SITE_FILE
    path.write_text(json.dumps({"format_version": 1, "weights_sha256": WEIGHTS, "cases": []}))
    with pytest.raises(SiteStateError) as err:
        _monitor(tmp_path)
    assert str(err.value) == (
        f"site state {path} has format_version 1; this calib-monai reads 2: use the calib-monai that wrote it, or "
        f"clear it with `calib-monai site reset {tmp_path}`"
    )
    assert reset_site(tmp_path)["cleared_cases"] == "unreadable" and _monitor(tmp_path).status()["cases"] == 0


def test_an_image_served_again_after_a_restart_counts_once(tmp_path):
    _monitor(tmp_path).observe("same image", 1, {"input": 1})
    _monitor(tmp_path).observe("other", 4, {"input": 6})
    again = _monitor(tmp_path).observe("same image", 1, {"input": 1})  # a new process: looked up in the log
    assert not again["counted"] and again["cases"] == 2 and again["signal_hits"]["input"] == 1
    assert [c["hash"] for c in _logged(tmp_path)] == ["same image", "other"]
    # a hash that holds JSON's specials is looked up as written; one that is a prefix of another is not it
    assert _monitor(tmp_path).observe('a "quoted"\nhash', 2, {})["counted"]
    assert not _monitor(tmp_path).observe('a "quoted"\nhash', 2, {})["counted"]
    assert _monitor(tmp_path).observe("same", 2, {})["counted"]


def _signal_ranks(reference: np.ndarray, cases: np.ndarray) -> np.ndarray:
    """Each case's rank per signal among the reference and itself: ``competition_ranks``'s rule, for many cases."""
    return 1 + (reference[None, :, :] > cases[:, None, :] + 1e-9 * np.maximum(1, np.abs(cases[:, None, :]))).sum(1)


def test_a_fast_simulation_rare_false_alarms_and_an_early_alarm_at_a_site():
    rng = np.random.default_rng(0)
    reference, cases = rng.exponential(size=(10, 3)), rng.exponential(size=(5, 3))
    for case in cases:  # the batch rule is the package's
        expected = [competition_ranks(np.append(reference[:, s], case[s]))[-1] for s in range(3)]
        assert list(_signal_ranks(reference, case[None])[0]) == expected
    # the bound: per signal, pi = P(rank 1 | reference) = exp(-max) for exponential values; beyond u in about
    # delta_ref / 3 of reference draws, so some signal beyond in at most delta_ref (union bound)
    test = SiteMartingale(10, SIGNALS)
    pis = np.exp(-rng.exponential(size=(40000, 10, 3)).max(1))
    assert np.mean((pis > test.bounds[0]).any(1)) <= test.delta_reference + 0.0015
    # (a) in-distribution streams of 100 cases, one per reference draw, m = 10
    references, alarms = 2000, 0
    for _ in range(references):
        ranks = _signal_ranks(rng.exponential(size=(10, 3)), rng.exponential(size=(100, 3)))
        alarms += test.first_alarm(test.log_values([dict(zip(SIGNALS, map(int, r))) for r in ranks])) is not None
    assert alarms <= binom.ppf(0.999, references, test.delta)
    # (c) a strong shift of the input signal (5 SD) at m = 20: most references alarm within 10 cases (at the fewest
    # possible), naming the input; the rest drew a validation subject beyond the shifted cases, which masks them
    shifted, delays = SiteMartingale(20, SIGNALS), []
    for _ in range(100):
        cases = rng.exponential(size=(20, 3))
        cases[:, 1] += 5
        ranks = [dict(zip(SIGNALS, map(int, r))) for r in _signal_ranks(rng.exponential(size=(20, 3)), cases)]
        delays.append(shifted.first_alarm(shifted.log_values(ranks)) or math.inf)
        if delays[-1] <= 10:
            hits = [sum(r[name] == 1 for r in ranks[: delays[-1]]) for name in SIGNALS]
            assert int(np.argmax(hits)) == 1
    assert np.mean(np.asarray(delays) <= 10) >= 0.8 and np.median(delays) == shifted.fewest_cases() == 6


def test_an_alarm_is_kept_by_the_next_weights_until_an_explicit_reset(tmp_path):
    # the site alarmed under WEIGHTS; Train publishes weights c...: the new record keeps the alarm and says so
    monitor = _monitor(tmp_path)
    fewest = SiteMartingale(20, SIGNALS).fewest_cases()
    for i in range(fewest):
        raised = monitor.observe(f"h{i}", 1, {"case_score": 5, "input": 1, "features": 3})
    assert raised["alarm"]
    trained = SiteMonitor(tmp_path, "c" * 64, RANGE, 20, SIGNALS)
    kept = trained.observe("after", 12, {"case_score": 9, "input": 12, "features": 4})
    assert kept["alarm"] and kept["cases"] == 1
    assert kept["evidence"] == {"inherited_from": {"weights": WEIGHTS[:12], "range": RANGE[:12]}}
    assert kept["message"].startswith(raised["message"]) and f"raised under weights {WEIGHTS[:12]}" in kept["message"]
    again = SiteMonitor(tmp_path, "d" * 64, RANGE, 20, SIGNALS).status()  # a second Train: still kept, said once
    assert again["alarm"] and again["message"].count("raised under weights") == 1 and "cccccccccccc" in again["message"]
    reset_site(tmp_path)
    assert not SiteMonitor(tmp_path, "e" * 64, RANGE, 20, SIGNALS).status()["alarm"]


def test_a_record_without_an_alarm_passes_nothing_on(tmp_path):
    _monitor(tmp_path).observe("h", 9, {"case_score": 9, "input": 12, "features": 4})
    assert not SiteMonitor(tmp_path, "c" * 64, RANGE, 20, SIGNALS).status()["alarm"]
    assert not (tmp_path / SITE_FILE).exists()  # archived; the new record starts at its first case
