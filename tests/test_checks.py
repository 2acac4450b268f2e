"""``calib_monai.checks``: the package's one option, number and count check, on hand-worked cases."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from calib_monai.checks import check_number, check_option, check_positive_int


def test_an_option_is_returned_as_given():
    assert check_option("reduction", "sum", ("mean", "sum", "none")) == "sum"
    assert check_option("dim", 3, (2, 3)) == 3


@pytest.mark.parametrize(
    "value, message",
    [
        # "meen" -> "mean": one substitution (MONAI's Damerau-Levenshtein distance 1)
        ("meen", "reduction must be one of ('mean', 'sum'), got 'meen'. Did you mean 'mean'?"),
        # "smu" -> "sum": one transposition; Damerau counts it as 1
        ("smu", "reduction must be one of ('mean', 'sum'), got 'smu'. Did you mean 'sum'?"),
        # "average" is 6 edits from "mean" and 7 from "sum": more than 3, no guess
        ("average", "reduction must be one of ('mean', 'sum'), got 'average'."),
        # not a string: no guess, the value shown as repr
        (None, "reduction must be one of ('mean', 'sum'), got None."),
        (["mean"], "reduction must be one of ('mean', 'sum'), got ['mean']."),
    ],
)
def test_an_unknown_option_names_the_options_and_the_nearest(value, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_option("reduction", value, ("mean", "sum"))


def test_true_is_not_the_option_1():
    with pytest.raises(ValueError, match=r"^dim must be one of \(1, 2\), got True\.$"):
        check_option("dim", True, (1, 2))


def test_the_nearest_option_takes_the_fewest_edits():
    # "zero" is 1 edit from "zeros" and 3 from "nan" (two substitutions, one deletion): "zeros"
    with pytest.raises(ValueError, match=r"got 'zero'\. Did you mean 'zeros'\?$"):
        check_option("border", "zero", ("nan", "zeros"))
    with pytest.raises(ValueError, match=r"got 'xyzxyz'\.$"):
        check_option("border", "xyzxyz", ("a", "b"))


@pytest.mark.parametrize(
    "args, expected",
    [((0, 1), ">= 0 and <= 1"), ((0, None, True), "> 0"), ((None, 1, False, True), "< 1")],
)
def test_the_range_in_words(args, expected):
    low, high, low_open, high_open = (*args, *(None, None, False, False)[len(args) :])
    with pytest.raises(ValueError, match=f"^x must be a finite number {expected}, got 'no'\\.$"):
        check_number("x", "no", low, high, low_open=low_open, high_open=high_open)


@pytest.mark.parametrize("value", [0, 0.5, 1, np.float32(0.25), np.int64(1), torch.tensor(0.75)])
def test_numbers_within_the_range_come_back_as_floats(value):
    out = check_number("p", value, 0, 1)
    assert isinstance(out, float) and out == float(value)


@pytest.mark.parametrize(
    "value, kwargs, message",
    [
        (-1, {"low": 0}, "x must be a finite number >= 0, got -1."),
        (0, {"low": 0, "low_open": True}, "x must be a finite number > 0, got 0."),
        (1.0, {"low": 0, "high": 1, "high_open": True}, "x must be a finite number >= 0 and < 1, got 1.0."),
        (float("nan"), {}, "x must be a finite number, got nan."),
        (float("inf"), {"low": 0}, "x must be a finite number >= 0, got inf."),
        (True, {}, "x must be a finite number, got True."),
        ("1", {}, "x must be a finite number, got '1'."),
        (torch.ones(2), {}, "x must be a finite number, got tensor([1., 1.])."),
        (5, {"low": 0, "hint": "a weight"}, None),
        (-5, {"low": 0, "hint": "a weight"}, "x must be a finite number >= 0 (a weight), got -5."),
        (2, {"low": 0, "high": 1, "wanted": "a confidence in [0, 1]"}, "x must be a confidence in [0, 1], got 2."),
    ],
)
def test_numbers_out_of_range_or_of_another_kind_are_refused_in_one_line(value, kwargs, message):
    if message is None:
        assert check_number("x", value, **kwargs) == 5.0
        return
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_number("x", value, **kwargs)


def test_integer_numbers():
    assert check_number("k", 3, 1, integer=True) == 3 and isinstance(check_number("k", np.int32(3), integer=True), int)
    for bad in (2.0, 2.5, "3", True):
        with pytest.raises(ValueError, match=rf"^k must be an integer >= 1, got {re.escape(repr(bad))}\.$"):
            check_number("k", bad, 1, integer=True)


@pytest.mark.parametrize("value", [1, 15, np.int64(20)])
def test_counts(value):
    assert check_positive_int("num_bins", value) == int(value)


@pytest.mark.parametrize("value", [0, -5, 2.5, True, "15", None, 15.0])
def test_counts_refused(value):
    with pytest.raises(ValueError, match=rf"^num_bins must be an integer >= 1, got {re.escape(repr(value))}\.$"):
        check_positive_int("num_bins", value)
