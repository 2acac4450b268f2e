"""The words of a review flag (``ValidatedRange.check``): one reason per signal that flagged the case, and the rule
and its bar in words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NOT_VOUCHED", "NO_CASE_SCORE", "describe_bar", "describe_rule", "missing_scores", "review_reason"]

#: Appended once to a flag by the image or the features: no validation volume measured how right the estimate is there.
NOT_VOUCHED = "; the estimated DSC is not vouched for on such a case"
#: Why a case without a case score (every structure absent) is not judged by it.
NO_CASE_SCORE = "cannot judge the case score: the case has none (the model finds none of the structures)"


def missing_scores(missing: int, volumes: int) -> str:
    """The warning of a range whose case-score signal lacks ``missing`` of its ``volumes`` validation scores."""
    return (
        f"{missing} of {volumes} validation volumes have no case score (no structure predicted): the case score ranks "
        "them below every case, so they keep no low-scoring case from being flagged"
    )


def _shown(value: float | None, spec: str) -> str:  # None: a distance past any float (stored as null)
    return "beyond any finite" if value is None else format(value, spec)


def review_reason(rule: Any, name: str, signal: Mapping[str, Any], farthest: str = "") -> str:
    """The reason a flag gives for ``signal`` (one entry of ``ValidatedRange.check``'s ``signals``) of ``rule``, a
    :class:`~calib_monai.review.rule.ValidatedRange`: what was extreme, how far, and its rank."""
    rank, value = signal["rank"], signal["value"]
    of = f"{rule.n + 1} volumes" if rule.m < rule.n else rule.n + 1  # a signal ranks volumes, the flag subjects
    z = signal["beyond"]  # beyond 1000: the others barely vary (a scale near 0), a count of MADs means nothing
    beyond = "" if z is None else f", {z:.1f} MADs beyond the others" if abs(z) <= 1000 else ""
    beyond = ", far beyond the others, which barely vary" if z is not None and abs(z) > 1000 else beyond
    if name == "case_score":
        finite = [s for s in rule.scores if s == s]
        lowest = f"; the lowest validation score is {min(finite):.3f}" if finite else ""
        return f"estimated mean DSC {value:.3f} is among the lowest (rank {rank} of {of}{beyond}{lowest})"
    if name == "input":
        images = "the training images" if rule.input_reference else "the validation images"
        return (
            f"image unlike {images} ({farthest}: distance {_shown(value, '.1f')} standard deviations, rank "
            f"{rank} of {of}{beyond})"
        )
    whose = "the training images'" if rule.feature_reference else "the validation cases'"
    return f"features unlike {whose} (Mahalanobis distance {_shown(value, '.3g')}, rank {rank} of {of}{beyond})"


def describe_rule(rule: Any) -> str:
    """The rule in words (``ValidatedRange.describe``): what is measured, when a case is flagged and the bound."""
    names = {"case_score": "lowest case score", "input": "largest image-statistic distance"}
    if rule.input_check and rule.input_signal.precision is not None:
        shading = " the shading statistics together," if len(rule.input_signal.joint) > 1 else ""
        names["input"] = f"image-statistic distance (the intensity statistics together,{shading} each geometry alone)"
    names["features"] = "largest network-feature (Mahalanobis) distance"
    signals = ", ".join(names[s] for s in rule.signals)
    among = f"the {rule.n + 1}"
    if rule.m < rule.n:
        among = f"the {rule.m + 1} subjects (the case's and the {rule.m} validation ones, each by its most extreme)"
    words = (
        f"measure the case and each of the {rule.n} validation volumes against the others by each signal "
        f"({signals}) as robust z-scores (MADs beyond the others' median), take each one's largest, and flag the "
        f"case when it is among the {rule.rank} largest of {among} (ties counted against the case)"
    )
    if rule.volume_factor:
        words += f", or its expected volume of a class is outside the validated range widened {rule.volume_factor}x"
    if rule.rank == 0:
        return f"{words}: {rule.too_few_reason}"
    return (
        f"{words}: an ordinary case is flagged with probability at most {rule.bound:.1%} at {rule.counted_as} (on "
        f"average over validation draws; below {rule.draw_bound:.1%} for 90% of them)"
    )


_SIGNAL_WORDS = {"case_score": "case score", "input": "image statistics", "features": "network features"}


def describe_bar(bar: Mapping[str, Any], signals: list[str]) -> str:
    """``signals.signal_bar`` in words, with the way out when the case score sets the bar."""
    beyond = "beyond any finite z" if bar["z"] is None else f"{bar['z']:.1f} MADs beyond the others"
    largest = [f"{_SIGNAL_WORDS[n]} {v:.1f}" for n, v in bar["largest"].items() if n != bar["signal"] and v is not None]
    others = f" (the others' largest: {', '.join(largest)})" if largest else ""
    who = f"validation subject {bar['subject']}"
    if not bar["subject"]:
        who = f"validation volume {bar['volume'] + 1} of {bar['volumes']} (in the validation list's order)"
    words = (
        f"the flag's bar is {who} by its {_SIGNAL_WORDS[bar['signal']]}, {beyond}"
        f"{others}: a case is flagged only beyond it"
    )
    if bar["signal"] == "case_score" and len(signals) > 1:
        words += (
            "; where a shift is expected and many subjects validate, --review_score_check false lets the image and "
            "the features judge without it (docs/results/score_check)"
        )
    return words
