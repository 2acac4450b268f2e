"""The contour study's arithmetic (studies/margins.py) on hand-made masks: the per-case guarantee's counts, the excess
and missing volumes, the binomial interval and the targets."""

import numpy as np
import pytest

from studies.margins import binomial_interval, structure_row, summary_rows


def _truth():
    truth = np.zeros((4, 6, 12), bool)
    truth[1, 1:6, 1:11] = True  # 50 voxels: epsilon 0.02 allows floor(1.0) = 1 missed voxel
    return truth


def test_structure_row_counts_and_volumes():
    truth = _truth()
    outer = truth.copy()
    outer[1, 1, 1] = False  # one true voxel missed: allowed
    outer[2, 0, 0:3] = True  # three voxels outside the truth
    inner = np.zeros_like(truth)
    inner[1, 2, 2:11] = True  # nine inside
    inner[0, 0, 0] = True  # one of ten outside: floor(0.1 * 10) = 1 allowed at epsilon 0.1, 0 at 0.02
    row = structure_row(truth, inner, outer, epsilon=0.02, voxel_ml=0.5)
    assert row["outer_holds"] and not row["inner_inside"]
    assert row["excess_ml"] == 1.5 and row["true_ml"] == 25.0
    assert row["missing_ml"] == (50 - 9) * 0.5
    assert structure_row(truth, inner, outer, epsilon=0.1)["inner_inside"]
    outer[1, 1, 2] = False  # two missed of 50: beyond floor(1.0)
    assert not structure_row(truth, inner, outer, epsilon=0.02)["outer_holds"]
    empty = structure_row(truth, np.zeros_like(truth), outer, epsilon=0.02)
    assert empty["inner_inside"] and empty["missing_ml"] == 50.0  # an empty inner set claims nothing


def test_binomial_interval():
    low, high = binomial_interval(3, 3)
    assert low == pytest.approx(0.025 ** (1 / 3)) and high == 1.0  # P(all 3 | p) = p^3 = 0.025
    low, high = binomial_interval(2, 3)  # Beta(2, 2) cdf 3x^2 - 2x^3 = 0.025; Beta(3, 1) cdf x^3 = 0.975
    assert 3 * low**2 - 2 * low**3 == pytest.approx(0.025) and high == pytest.approx(0.975 ** (1 / 3))


def test_summary_rows_coverage_and_excess():
    key = {"method": "ce_dice", "seed": 0, "epsilon": 0.02, "condition": "test", "structure": "A"}
    margin = {"m": 25, "lambda_out": 0.01, "lambda_in": 0.9, "d_out": 2, "d_in": 1, "true_ml": 10.0}
    records = [
        {
            **key,
            **margin,
            "outer_holds": o,
            "inner_inside": True,
            "morph_outer_holds": True,
            "morph_inner_inside": m,
            "excess_ml": e,
            "flagged": m,
            "morph_excess_ml": 4.0,
            "missing_ml": 1.0,
            "morph_missing_ml": 3.0,
        }
        for o, m, e in ((True, True, 1.0), (True, False, 2.0), (False, False, 3.0))
    ]
    (row,) = summary_rows(records, alpha=0.1)
    assert row["n"] == 3 and row["m"] == 25 and row["outer_covered"] == "2/3" and row["inner_covered"] == "3/3"
    assert row["flagged"] == 1 and row["morph_inner_covered"] == "1/3" and row["outer_ci"] == "0.09-0.99"
    assert row["excess_ml"] == 2.0 and row["morph_excess_ml"] == 4.0 and row["excess_reduction"] == 0.5
    assert row["coverage_target"] == "yes" and row["excess_target"] == "yes"  # 0.9 inside 0.09-0.99; 50% >= 30%
    records[2]["excess_ml"] = 9.0  # mean 4.0: no reduction
    (row,) = summary_rows(records, alpha=0.1)
    assert row["excess_reduction"] == 0.0 and row["excess_target"] == "NO"
