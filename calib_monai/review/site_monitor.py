"""The site monitor: a test martingale over the stream of cases one deployment serves, which alarms when its cases
rank among the most extreme of the validation subjects more often than cases like them can (a case judged alone is
flagged only past the most extreme validation subject: at a new site most cases may rank 1, few flagged).

Each served case gets from :meth:`calib_monai.review.ValidatedRange.check` each signal's rank (case score,
input, features: ``signals[name]["rank"]``; 1 = most extreme) and the combined rank among the ``m + 1`` subjects.
The monitor bets, for each signal ``s`` the range judges by and each ``k`` (1 by default), on ``E_sk = {rank_s <= k}``.

**The reference is shared**: every case of a stream is ranked against the same ``m`` validation subjects, so the
p-values are not independent, and given the reference not uniform: ``pi_sk = P(E_sk | reference)`` is random over
reference draws. Each signal is one function fixed before validation (the case score; the input and feature
distances to the training images' references), so ``E_sk`` is split-conformal and ``pi_sk`` is
``Beta(k, m + 1 - k)`` distributed over reference draws (Vovk 2012, "Conditional validity of inductive conformal
predictors"; smaller when a subject has several volumes). The bets are sized for the reference:

- ``u_k``: the ``1 - delta_ref / (S K)`` quantile of ``Beta(k, m + 1 - k)`` (``S`` signals, ``K`` values of ``k``;
  ``k = 1``: ``1 - (delta_ref / (S K))^(1 / m)``). With probability ``>= 1 - delta_ref`` over reference draws,
  ``pi_sk <= u_k`` for every ``s``, ``k`` (union bound): a good reference.
- Given the reference, in-distribution cases are independent, each ranked against the reference alone: for each
  ``s``, ``k`` and ``lambda`` in ``site_martingale.BETS`` the product of ``1 - lambda + lambda 1{E_sk} / u_k`` has
  expected factor ``1 - lambda + lambda pi_sk / u_k <= 1`` given a good reference, a nonnegative supermartingale
  from 1; so is ``M``, the mean of these products. A case that leaves a signal out bets nothing on it.
- Ville: ``P(sup_n M_n >= 1 / delta_v | good reference) <= delta_v``. The alarm: ``M_n >= 1 / delta_v``, once; it
  stays until an explicit reset.

**Guarantee.** With probability ``>= 1 - delta_ref`` over the draw of the validation subjects, the chance that the
monitor ever alarms (any stream length) on cases exchangeable with them is at most ``delta_v``; marginally at most
``delta = delta_ref + delta_v`` (default 0.01, halved by ``site_martingale.REFERENCE_SHARE``). Assumed: cases
independent given the reference; continuous signal values (a signal's rank counts ties for the case); fixed signal
functions (without training-image references, input and features are measured against the validation images:
full-conformal, the bound approximate). An image served again counts once (content hash); two of one patient twice.

**Why each signal's rank, not the combined one**: the combined rank is full-conformal (the case enters the robust
standardisation of the ``m + 1``), so nothing gives its ``pi`` a law; and its bar is the heaviest-tailed signal's
extreme, which a case far out on one signal reaches less often (``docs/results/site_monitor``). It is stored only.

**Its limit**: a bet on ``E_sk`` multiplies by at most ``1 / u_k`` per case: no alarm before
``log(1 / delta_v) / log(1 / u_1)`` cases, however far the site lies.

State: ``<folder>/site.json`` (written atomically; each read-modify-write under an OS lock on
``<folder>/site.json.lock``, so servers sharing a folder lose no case), naming the weights' and the validated range's
sha256 and holding the stream's running state: the number of cases, each signal's bets' log-products
(:meth:`SiteMartingale.step`), the counts up to the alarm and, once it fires, the alarm's case and what moved it.
The served cases themselves go to ``<folder>/site_cases.jsonl``, appended (:mod:`~.site_store`): a restart or a
second process gives the same answer, and a case costs the same at any stream length
(``docs/results/benchmarks/site_monitor.md``). New weights or a new range (Train, a new ``calibrate``) start a new
record, the previous one (its cases inlined) moved to ``<folder>/site_archive/`` (said in the log).
``calib-monai site show <folder>`` / ``calib-monai site reset <folder>``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calib_monai.atomic import ensure_folder, write_error, write_json_atomically
from calib_monai.checks import check_number, is_real_number
from calib_monai.defaults import SITE_LABELS_MIN
from calib_monai.review import site_store
from calib_monai.review.site_martingale import DEFAULT_DELTA, SiteMartingale
from calib_monai.review.site_store import SITE_FILE, reset_site

__all__ = [
    "ARCHIVE_FOLDER",
    "FORMAT_VERSION",
    "SITE_FILE",
    "SiteMonitor",
    "SiteStateError",
    "advance",
    "new_state",
    "read_state",
    "reset_site",
    "show_site",
    "summarise",
]

#: Where the records of earlier models go, beside ``site.json``: ``site_<weights12>_<range12>.json``.
ARCHIVE_FOLDER = "site_archive"
FORMAT_VERSION = 2
logger = logging.getLogger("calib_monai")
#: How the alarm's message names a signal (``ValidatedRange.signals``).
SIGNAL_WORDS = {"case_score": "estimated DSC (case score)", "input": "image statistics", "features": "network features"}


class SiteStateError(ValueError):
    """A ``site.json`` that cannot be used as it is: one line naming the file and the fix."""


def _value(log_value: float) -> float:  # capped below float overflow: JSON has no infinity
    return float(math.exp(min(log_value, 690.0)))


def _signal_ranks(signals: Mapping[str, Any] | None) -> dict[str, int]:
    """Each signal's rank, from ``{name: rank}`` or ``ValidatedRange.check``'s ``signals`` (``{name: {"rank"}}``)."""
    out = {}
    for name, value in (signals or {}).items():
        rank = value.get("rank") if isinstance(value, Mapping) else value
        out[str(name)] = check_number(f"site monitor rank of signal {name}", rank, 1, integer=True)
    return out


def _reset_fix(folder: Path) -> str:
    return f"`calib-monai site reset {folder}`"


def _corrupt(path: Path, what: str) -> SiteStateError:
    return SiteStateError(f"site state {path} is corrupt ({what}): clear it with {_reset_fix(path.parent)}")


def read_state(path: Path) -> dict[str, Any] | None:
    """The checked content of ``site.json`` (None when there is none); a :class:`SiteStateError` naming the file and
    the fix when it cannot be read as a site state of this format. Its case log is checked by the monitor, under its
    lock (:func:`site_store.recover`)."""
    folder = path.parent
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise SiteStateError(
            f"cannot read site state {path} ({err}): fix its permissions or clear it with {_reset_fix(folder)}"
        ) from err

    def corrupt(what: str) -> SiteStateError:
        return _corrupt(path, what)

    try:
        state = json.loads(text)
    except ValueError as err:
        raise corrupt(f"not JSON: {err}") from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise corrupt("no format_version")
    if state["format_version"] != FORMAT_VERSION:
        raise SiteStateError(
            f"site state {path} has format_version {state['format_version']!r}; this calib-monai reads "
            f"{FORMAT_VERSION}: use the calib-monai that wrote it, or clear it with {_reset_fix(folder)}"
        )
    try:
        for key in ("weights_sha256", "range_sha256"):
            if not isinstance(state[key], str):
                raise TypeError(f"{key} is not a string")
        test = SiteMartingale.from_settings(state)
        settings = test.settings()
        changed = [k for k, v in settings.items() if state[k] != v]
        if changed:  # "1" read as 1 would pass here and fail as another test when the next case is served
            raise TypeError(f"{changed[0]} {state[changed[0]]!r} is not of its type ({settings[changed[0]]!r})")
        if not isinstance(state.get("labels", []), list):
            raise TypeError(f"labels must be a list, got {type(state['labels']).__name__}")
        counts = (state["cases"], state["cases_bytes"], state["combined_rank_within_k"], *state["signal_hits"].values())
        if not all(type(n) is int and n >= 0 for n in counts) or list(state["signal_hits"]) != list(test.signals):
            raise TypeError("cases, cases_bytes, combined_rank_within_k or signal_hits")
        products, width = state["log_products"], len(test.ks) * len(test.bets)
        if list(products) != list(test.signals) or any(len(v) != width for v in products.values()):
            raise TypeError(f"log_products is not {width} numbers per signal {list(test.signals)}")
        if not all(isinstance(v, float) and v < math.inf for row in products.values() for v in row):
            raise TypeError("log_products holds a value that is not a number")
        alarm, inherited = state["alarm"], state.get("inherited_alarm")
        if inherited is not None and not all(isinstance(inherited[k], str) for k in ("weights", "range", "message")):
            raise TypeError(f"inherited_alarm {inherited!r:.60}")
        ok = alarm is None or type(alarm["cases"]) is int and alarm["signal_that_moved"] in test.signals
        if not ok or alarm is not None and not math.isfinite(alarm["log_value"]):
            raise TypeError(f"alarm {alarm!r:.60}")
        for label in state.get("labels", []):
            for key in ("score", "truth"):  # a case score and a mean DSC
                if not (isinstance(label["case"], str) and is_real_number(label[key]) and 0 <= label[key] <= 1):
                    raise ValueError(f"label of {label['case']!r}: {key} {label[key]!r} is not in [0, 1]")
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise corrupt(f"{type(err).__name__}: {err}") from None
    return state


def summarise(state: dict[str, Any] | None, path: Path) -> dict[str, Any]:
    """What the stream says: cases, the martingale's value, the alarm with its evidence and the message that every
    answer after the alarm carries."""
    if state is None:
        return {"file": str(path), "cases": 0, "value": 1.0, "alarm": False, "evidence": None, "message": ""}
    test = SiteMartingale.from_settings(state)
    k, hits, alarm, inherited = min(test.ks), dict(state["signal_hits"]), state["alarm"], state.get("inherited_alarm")
    evidence, message = None, ""
    if inherited and not alarm:  # the site alarmed under earlier weights or another range (Train, calibrate)
        evidence = {"inherited_from": {key: inherited[key] for key in ("weights", "range")}}
        message = (
            f"{inherited['message']} [raised under weights {inherited['weights']} and range {inherited['range']}; "
            f"kept by these until {SITE_LABELS_MIN} site labels re-anchor them, or {_reset_fix(path.parent)}]"
        )
    if alarm:
        alarm_at, moved = alarm["cases"], alarm["signal_that_moved"]
        evidence = {
            "cases": alarm_at,
            "value": _value(alarm["log_value"]),
            "threshold": test.threshold,
            "signal_that_moved": moved,
            "signal_hits": hits,  # cases whose signal ranked within k, up to the alarm
            "combined_rank_within_k": state["combined_rank_within_k"],
            "k": k,
            "delta": test.delta,
            "delta_reference": test.delta_reference,
            "validation_subjects": test.m,
        }
        where = "beyond every validation volume" if k == 1 else f"among the {k} most extreme of the validation volumes"
        message = (
            f"site alarm ({path}): {hits[moved]} of the first {alarm_at} cases served here lay {where} by the "
            f"{SIGNAL_WORDS.get(moved, moved)} "
            f"signal (evidence {evidence['value']:.0f} >= {test.threshold:.0f}; cases like the validation ones raise "
            f"this alarm at most {test.delta:.0%} of the time): the case score's level is not vouched for at this "
            "site; label the typical cases MONAI Label's Next Sample offers (or `calib-monai site label "
            f"{path.parent} LABELS`): from {SITE_LABELS_MIN} labels on the level is re-anchored; then Train, or run "
            f"{_reset_fix(path.parent)} after re-validating"
        )
    return {
        "file": str(path),
        "cases": state["cases"],
        "value": _value(test.log_value(state["log_products"])) if state["cases"] else 1.0,
        "threshold": test.threshold,
        "alarm": alarm is not None or inherited is not None,
        "evidence": evidence,
        "message": message,
        "signal_hits": hits,
        "weights_sha256": state["weights_sha256"],
        "range_sha256": state["range_sha256"],
        "labels": len(state.get("labels", [])),
        "label_errors": [label["score"] - label["truth"] for label in state.get("labels", [])],
    }


def advance(
    state: dict[str, Any], rank: int, signal_ranks: Mapping[str, int], test: SiteMartingale | None = None
) -> None:
    """Add one served case (``rank``: its combined rank; ``signal_ranks``: ``{name: rank}``) to the running
    ``state`` in place: the bets' log-products, the counts up to the alarm, and at the first crossing of the
    threshold the alarm, with the signal that moved (whose own bets had grown most). Its log line is the caller's."""
    test = test or SiteMartingale.from_settings(state)
    k = min(test.ks)
    state["log_products"] = test.step(state["log_products"], signal_ranks)
    state["cases"] += 1
    if state["alarm"] is not None:
        return
    for name in test.signals:
        state["signal_hits"][name] += 0 < signal_ranks.get(name, 0) <= k
    state["combined_rank_within_k"] += rank <= k
    log_value = test.log_value(state["log_products"])
    if log_value >= math.log(test.threshold):
        grown = {name: test.log_value({name: rows}) for name, rows in state["log_products"].items()}
        moved = max(grown, key=grown.get)
        state["alarm"] = {"cases": state["cases"], "log_value": log_value, "signal_that_moved": moved}


def new_state(weights_sha256: str, range_sha256: str, test: SiteMartingale) -> dict[str, Any]:
    """The running state of a stream with no case yet (``site.json``'s content)."""
    return {
        "format_version": FORMAT_VERSION,
        "weights_sha256": weights_sha256,
        "range_sha256": range_sha256,
        **test.settings(),
        "cases": 0,
        "cases_bytes": 0,  # of site_cases.jsonl: the cases counted
        "log_products": {name: [0.0] * (len(test.ks) * len(test.bets)) for name in test.signals},
        "signal_hits": dict.fromkeys(test.signals, 0),
        "combined_rank_within_k": 0,
        "alarm": None,
        "labels": [],
    }


class SiteMonitor:
    """The site monitor of one deployment: ``<folder>/site.json`` for the weights and validated range of the given
    sha256 (``m`` validation subjects, ``signals`` the range judges by: ``ValidatedRange.m`` and ``.signals``).
    :meth:`observe` records a served case and answers the stream's state."""

    def __init__(
        self,
        folder: str | os.PathLike,
        weights_sha256: str,
        range_sha256: str,
        m: int,
        signals: Sequence[str],
        delta: float = DEFAULT_DELTA,
        k: int | Sequence[int] = 1,
    ) -> None:
        self.folder = Path(folder)
        self.path = self.folder / SITE_FILE
        self.lock_path = self.folder / (SITE_FILE + ".lock")
        self.weights_sha256, self.range_sha256 = str(weights_sha256), str(range_sha256)
        ks = (k,) if isinstance(k, (int, np.integer)) else tuple(k)
        self.test = SiteMartingale(m, tuple(str(s) for s in signals), delta, tuple(int(v) for v in ks))
        with site_store.locked(self.lock_path):
            self._read()  # another model's record is archived now, not at the first case

    def _read(self) -> dict[str, Any] | None:
        """The stream of these weights and range (None: none yet). A record of other weights or another range (a
        retrained or recalibrated model) is archived (:meth:`_archive`) and a new stream starts; a record of these
        with other monitor settings is refused: a test changed midway is no test. Call under the lock."""
        state = read_state(self.path)
        site_store.recover(self.folder, state["cases_bytes"] if state else 0, lambda what: _corrupt(self.path, what))
        if state is None:
            return None
        if (state["weights_sha256"], state["range_sha256"]) != (self.weights_sha256, self.range_sha256):
            self._archive(state)
            said = summarise(state, self.path)
            if not said["alarm"]:
                return None
            # the site is what alarmed, not the weights: the new record keeps the alarm (an explicit reset clears it)
            kept = new_state(self.weights_sha256, self.range_sha256, self.test)
            kept["inherited_alarm"] = {
                "weights": state["weights_sha256"][:12],
                "range": state["range_sha256"][:12],
                "message": state.get("inherited_alarm", {}).get("message") or said["message"],
            }
            write_json_atomically(self.path, kept)
            return kept
        ours = self.test.settings()
        theirs = {key: state[key] for key in ours}
        if theirs != ours:
            diff = ", ".join(f"{key} {theirs[key]} -> {ours[key]}" for key in ours if theirs[key] != ours[key])
            raise SiteStateError(
                f"site state {self.path} was recorded with other monitor settings ({diff}): a test changed midway "
                f"is no test; serve with its settings, or clear it with {_reset_fix(self.folder)}"
            )
        return state

    def _archive(self, state: dict[str, Any]) -> Path:
        """Move another model's record to ``<folder>/site_archive/`` (written whole first, its cases inlined as
        ``case_log``), saying so in the log."""
        name, index = f"site_{state['weights_sha256'][:12]}_{state['range_sha256'][:12]}", 1
        while (target := self.folder / ARCHIVE_FOLDER / (name + (f"_{index}" if index > 1 else "") + ".json")).exists():
            index += 1
        ensure_folder(target.parent, "cannot archive the site record: its folder")
        write_json_atomically(target, {**state, "case_log": site_store.read_cases(self.folder, state["cases_bytes"])})
        try:
            self.path.unlink()
        except OSError as err:
            raise write_error(self.path, err) from err
        site_store.remove_log(self.folder)
        before = summarise(state, target)
        logger.warning(
            f"site monitor: {self.path} recorded weights {state['weights_sha256'][:12]} and validated range "
            f"{state['range_sha256'][:12]} ({before['cases']} cases, alarm: {'yes' if before['alarm'] else 'no'}); "
            f"these are weights {self.weights_sha256[:12]} and range {self.range_sha256[:12]}: a new model or range "
            f"starts a new site record; the previous one is kept as {target}"
        )
        return target

    def observe(self, case_hash: str, rank: int, signal_ranks: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Record a served case (``case_hash``: its image content's hash; ``rank``: ``check``'s rank among the m + 1;
        ``signal_ranks``: ``{name: rank}`` or ``check``'s ``signals``) and return the stream's state after it
        (``counted``: False for an image seen before, which is not counted again)."""
        if not isinstance(case_hash, str) or not case_hash:
            raise ValueError(f"site monitor: case_hash must be the image content's hash (a string), got {case_hash!r}")
        rank = check_number("site monitor rank", rank, 1, self.test.m + 1, integer=True)
        signals = _signal_ranks(signal_ranks)
        with site_store.locked(self.lock_path):
            state = self._read() or new_state(self.weights_sha256, self.range_sha256, self.test)
            counted = not site_store.seen(self.folder, state["cases_bytes"], case_hash)
            if counted:  # the case's line first, then site.json recording it: a stop between is recovered
                case = {"hash": case_hash, "rank": rank, "signal_ranks": signals}
                state["cases_bytes"] = site_store.append_case(self.folder, state["cases_bytes"], case)
                advance(state, rank, signals, self.test)
                write_json_atomically(self.path, state)
        return {**summarise(state, self.path), "counted": counted}

    def label(self, case: str, score: float, truth: float) -> dict[str, Any]:
        """Record a site label: ``case`` (its name; labelled again: replaced) was served with the raw case score
        ``score`` by these weights and range, and its delivered segmentation has the true mean DSC ``truth`` against
        the label. The labels re-anchor the served score (:mod:`calib_monai.review.anchor`)."""
        score = check_number(f"site label {case}: served case score", score, 0, 1)
        truth = check_number(f"site label {case}: true mean DSC", truth, 0, 1)
        with site_store.locked(self.lock_path):
            state = self._read() or new_state(self.weights_sha256, self.range_sha256, self.test)
            labels = [entry for entry in state["labels"] if entry["case"] != str(case)]
            state["labels"] = [*labels, {"case": str(case), "score": score, "truth": truth}]
            write_json_atomically(self.path, state)
        return summarise(state, self.path)

    def status(self) -> dict[str, Any]:
        """The stream's state as stored (nothing recorded)."""
        with site_store.locked(self.lock_path):
            return summarise(self._read(), self.path)

    def reset(self) -> dict[str, Any]:
        """Clear the state (the next case starts a new stream)."""
        return reset_site(self.folder)


def show_site(folder: str | os.PathLike) -> dict[str, Any]:
    """``calib-monai site show FOLDER``: the state of ``FOLDER/site.json`` (cases, value, alarm, evidence)."""
    path = site_store.site_folder(folder) / SITE_FILE
    return summarise(read_state(path), path)
