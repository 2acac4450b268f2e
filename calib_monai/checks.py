"""Argument checks shared by the whole package: an option among a few, a number within a range, a count.

Each check returns the value or raises a one-line ``ValueError`` naming the argument, what it must be and the value
given. An option is matched exactly (MONAI's ``look_up_option`` would strip a string and return a default). Floor 0:
standard library, NumPy, torch and MONAI only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any

import numpy as np
import torch
from monai.utils import damerau_levenshtein_distance

__all__ = [
    "PROBABILITY_ROUNDING",
    "check_number",
    "check_option",
    "check_positive_int",
    "clip_probability_rounding",
    "is_real_number",
    "is_whole_number",
]

#: A misspelt option within this many edits of a known one is answered with "did you mean" (MONAI's rule).
_MAX_EDITS = 3


def check_option(name: str, value: Any, options: Collection[Any]) -> Any:
    """``value`` if it is one of ``options``, else ``"<name> must be one of <options>, got <value>."`` (a ValueError),
    followed by ``Did you mean '<option>'?`` for the nearest within 3 edits (Damerau-Levenshtein, MONAI's rule).

    >>> check_option("penalty", "l1", ("l1", "l2"))
    'l1'
    >>> check_option("border", "zero", ("background", "zeros"))
    Traceback (most recent call last):
    ValueError: border must be one of ('background', 'zeros'), got 'zero'. Did you mean 'zeros'?
    """
    try:
        found = not isinstance(value, bool) and value in options
    except TypeError:  # an unhashable value and a set of options
        found = False
    if found:
        return value
    edits = {o: damerau_levenshtein_distance(str(o), value) for o in options} if isinstance(value, str) else {}
    close = {o: d for o, d in edits.items() if d <= _MAX_EDITS}
    hint = f" Did you mean {min(close, key=close.get)!r}?" if close else ""
    raise ValueError(f"{name} must be one of {tuple(options)}, got {value!r}.{hint}")


def is_real_number(value: Any) -> bool:
    """A real number (Python, NumPy, or a one-element tensor), not a bool: what ``check_number`` accepts.

    >>> is_real_number(np.float32(0.5)), is_real_number(torch.tensor([2.0])), is_real_number(True)
    (True, True, False)
    """
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def is_whole_number(value: Any) -> bool:
    """A Python or NumPy integer, not a bool (``2.0`` and ``"2"`` are not).

    >>> is_whole_number(np.int64(2)), is_whole_number(2.0), is_whole_number(False)
    (True, False, False)
    """
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_number(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    hint: str = "",
    wanted: str | None = None,
) -> Any:
    """``value`` as a ``float`` (``integer``: an ``int``) if it is a finite real number within ``[low, high]``, else a
    ValueError ``"<name> must be a finite number >= <low> (<hint>), got <value>."``.

    Args:
        name: the argument, as the user writes it.
        value: a Python or NumPy number or a one-element tensor; bools and strings are refused.
        low, high: the bounds, None for none; ``low_open``/``high_open``: the bound itself excluded.
        integer: whole numbers only (``2.5`` and ``2.0`` refused), and the message says "an integer".
        hint: what the value means, in brackets after the range (``"the weight of the Dice term"``).
        wanted: the whole requirement in words instead of "a finite number" and the range
            (``"a confidence in [0, 1]"``).

    >>> check_number("tau", 1, 0, 1, low_open=True)
    1.0
    >>> check_number("gamma", -1, 0, hint="the focusing exponent")
    Traceback (most recent call last):
    ValueError: gamma must be a finite number >= 0 (the focusing exponent), got -1.
    >>> check_number("epochs", 2.5, 1, integer=True)
    Traceback (most recent call last):
    ValueError: epochs must be an integer >= 1, got 2.5.
    """
    bounds = [f"{'>' if low_open else '>='} {low:g}"] if low is not None else []
    bounds += [f"{'<' if high_open else '<='} {high:g}"] if high is not None else []
    bounds = " and ".join(bounds)
    if wanted is None:
        wanted = ("an integer" if integer else "a finite number") + (f" {bounds}" if bounds else "")
    message = f"{name} must be {wanted}{f' ({hint})' if hint else ''}, got {value!r}"
    if not (is_whole_number(value) if integer else is_real_number(value)):
        raise ValueError(f"{message}.")
    number = int(value) if integer else float(value)
    below = low is not None and (number <= low if low_open else number < low)
    above = high is not None and (number >= high if high_open else number > high)
    if not math.isfinite(number) or below or above:
        raise ValueError(f"{message}.")
    return number


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as an ``int`` if it is a whole number >= 1 (a count: ``num_bins``, ``max_voxels``), else
    ``"<name> must be an integer >= 1, got <value>."``. Refused: ``0``, ``-5``, ``2.5``, ``True``, ``"15"``.

    >>> check_positive_int("num_bins", 15)
    15
    >>> check_positive_int("num_bins", True)
    Traceback (most recent call last):
    ValueError: num_bins must be an integer >= 1, got True.
    """
    return check_number(name, value, 1, integer=True)


#: How far float arithmetic may carry a probability outside [0, 1]: a softmax mapped back to the image's grid by
#: linear interpolation (weights summing to 1 in float32) reaches 1 + 1.2e-7; a value further out is not rounding.
PROBABILITY_ROUNDING = 1e-6


def clip_probability_rounding(prob: torch.Tensor, name: str = "probabilities") -> torch.Tensor:
    """``prob`` with values within :data:`PROBABILITY_ROUNDING` of [0, 1] clipped into it, in place, so that the checks
    downstream stay exact; values further out (or NaN) are a ValueError naming ``name`` and the values seen. An empty
    or integer tensor is returned as it is.

    >>> clip_probability_rounding(torch.tensor([1.0 + 1e-7, 0.0, -1e-8])).tolist()
    [1.0, 0.0, 0.0]
    >>> clip_probability_rounding(torch.tensor([2.0, -1.0]), "pred")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: pred must lie in [0, 1] (within float rounding, 1e-06), but they hold values in [-1, 2]: ...
    """
    if not prob.is_floating_point() or not prob.numel() or prob.device.type == "meta":
        return prob
    lo, hi = (float(v) for v in torch.stack(torch.aminmax(prob)).double().tolist())
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo < -PROBABILITY_ROUNDING or hi > 1 + PROBABILITY_ROUNDING:
        raise ValueError(
            f"{name} must lie in [0, 1] (within float rounding, {PROBABILITY_ROUNDING:g}), but they hold values in "
            f"[{lo:.9g}, {hi:.9g}]: they are not probabilities (logits, or a spline interpolation that overshoots)."
        )
    if lo < 0 or hi > 1:
        prob.clamp_(0.0, 1.0)
    return prob
