"""The contour study's arithmetic (studies/margins.py, studies/margin_summary.py) on hand-made masks: the per-case
guarantee's counts, the excess and missing volumes, the binomial interval, the range a valid rule gives and the
targets."""

import numpy as np
import pytest

from studies.margin_summary import binomial_interval, guarantee_range, rescore_margins, summary_rows
from studies.margins import structure_row


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
    assert row["guarantee_low"] == f"{guarantee_range(3, 25, 0.1)[0]}/3" and row["within_guarantee"] == "yes"
    records[2]["excess_ml"] = 9.0  # mean 4.0: no reduction
    (row,) = summary_rows(records, alpha=0.1)
    assert row["excess_reduction"] == 0.0 and row["excess_target"] == "NO"


def test_coverage_at_alpha_from_stored_requirements():
    """m = 9 subjects: alpha 0.1 -> k = floor(0.1 * 10) = 1, lambda_out the smallest stored requirement, lambda_in the
    largest; a test case's outer holds when its own requirement is at least lambda_out (a tie holds), its inner when
    its own is at most lambda_in; alpha 0.05 -> k = 0: cannot vouch (None)."""
    from studies.margin_figures import coverage_at

    outer = [0.3, 0.1, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    inner = [0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99]
    contours = {"classes": {"LV": {"required_out": outer, "required_in": inner}}}
    tests = [
        {"LV": {"outer": 0.05, "inner": 0.995}},  # misses both
        {"LV": {"outer": 0.1, "inner": 0.99}},  # ties: holds both
        {"LV": {"outer": 0.5, "inner": 0.2}},
        {"LV": None},  # absent and not predicted: not counted
    ]
    got = coverage_at(contours, tests, 0.1)["LV"]
    assert (got["lambda_out"], got["lambda_in"]) == (0.1, 0.99)
    assert (got["outer"], got["inner"], got["cases"]) == (2, 2, 3)
    # alpha 0.2: k = floor(2.0) = 2 -> the second smallest (0.2) and the second largest (0.98)
    got = coverage_at(contours, tests, 0.2)["LV"]
    assert (got["lambda_out"], got["lambda_in"]) == (0.2, 0.98)
    assert (got["outer"], got["inner"]) == (1, 1)
    assert coverage_at(contours, tests, 0.05) == {"LV": None}


def _conformal_runs(n: int, m: int, alpha: float, runs: int = 40000) -> np.ndarray:
    """The count of ``n`` test cases a valid rule holds for, in each of ``runs`` simulated runs: ``m`` validation and
    ``n`` test requirements exchangeable (uniform), the lambda the ``floor(alpha (m + 1))``-th largest of the m."""
    rng = np.random.default_rng(0)
    validation = np.sort(rng.random((runs, m)), axis=1)
    lam = validation[:, m - int(np.floor(alpha * (m + 1)))]
    return (rng.random((runs, n)) <= lam[:, None]).sum(1)


@pytest.mark.parametrize("m", [10, 25])
def test_guarantee_range_is_what_the_conformal_rule_gives_in_simulation(m):
    n, alpha = 40, 0.1
    counts = _conformal_runs(n, m, alpha)
    low, below = guarantee_range(n, m, alpha)
    assert np.mean(counts < low) <= 0.025 + 0.003 and np.mean(counts <= low) > 0.025 - 0.003  # its 2.5% quantile
    fails = [x for x in range(n + 1) if binomial_interval(x, n)[1] < 1 - alpha]  # x <= 31 at n = 40
    assert max(fails) == 31 and np.mean(counts <= 31) == pytest.approx(below, abs=0.006)
    assert np.mean(counts) / n >= 1 - alpha  # marginally valid: (m + 1 - floor(alpha (m + 1))) / (m + 1)
    assert (m, round(below, 2)) in ((10, 0.11), (25, 0.04))  # one run in nine at m = 10
    assert guarantee_range(n, 8, alpha) == (0, pytest.approx(float("nan"), nan_ok=True))  # no lambda at m = 8


def test_rescore_keeps_the_header_and_makes_the_verdicts_again(tmp_path):
    from studies.study import write_csv

    key = {"method": "nacl", "seed": 1, "epsilon": 0.1, "condition": "test", "structure": "LV", "m": 10}
    margin = {"lambda_out": 0.2, "lambda_in": 0.8, "d_out": 3, "d_in": 1, "true_ml": 5.0, "morph_excess_ml": 4.0}
    volumes = {"excess_ml": 1.0, "missing_ml": 1.0, "morph_missing_ml": 2.0, "flagged": False}
    holds = {"outer_holds": True, "morph_outer_holds": True, "morph_inner_inside": True}
    records = [{**key, **margin, **volumes, **holds, "case": f"c{i}", "inner_inside": i >= 9} for i in range(40)]
    write_csv(tmp_path / "per_case.csv.gz", records)  # 31 of 40 inner: below the binomial interval, within m = 10's
    (tmp_path / "README.md").write_text("# Title\n\nCommand: `x`\n\n## Where the targets hold\n\nold\n")
    rescore_margins(tmp_path, alpha=0.1)
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# Title\n\nCommand: `x`\n\n## Where the targets hold\n") and "\nold\n" not in text
    assert "coverage target holds for 0 of 1 (seed, structure), within the guarantee for 1;" in text
    assert "excess target (>= 30% less than the morphological margin) for 1 of 1 (reduction +75%)" in text
    assert "| nacl | 1 | 0.1000 | test | LV | 40 | 10 |" in text and "31/40" in text
    (tmp_path / "README.md").write_text("# no report\n")
    with pytest.raises(ValueError, match="has no '## Where the targets hold' section"):
        rescore_margins(tmp_path, alpha=0.1)
