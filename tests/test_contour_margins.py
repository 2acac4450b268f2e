"""The contours' margins (issue 49): the lambdas each validation volume requires, worked out by hand; the conformal
choice by subject with its rank; the too-few-subjects null; the guarantee by simulation on calibrated synthetic
probabilities; the stored set and other weights; the served transform; the morphological baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from monai.data import MetaTensor

from calib_monai.data.inference import ConfidenceAndSegmentationd
from calib_monai.review import ContourMargins, ContourMarginsd, read_contour_margins
from calib_monai.review.contours import GRID, contour_masks, volume_requirements
from calib_monai.review.morphological import choose_margin, morphological_contours, morphological_requirements
from calib_monai.review.rule import write_measured

F32 = np.float32


def _two_class(p1: list[float], label: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.tensor(p1, dtype=torch.float32)
    return torch.stack([1 - p, p]), torch.tensor(label)


def test_the_outer_requirement_by_hand():
    # 10 true voxels: 6 predicted (p >= 0.5), 4 missed with p 0.1, 0.3, 0.2, 0.4; eps 0.1 allows floor(1.0) = 1 miss,
    # so l_out may rise to the 2nd smallest missed p (0.2): at 0.2 only the 0.1 voxel is missed, above it two are
    prob, label = _two_class([0.9] * 6 + [0.1, 0.3, 0.2, 0.4] + [0.05] * 5, [1] * 10 + [0] * 5)
    need = volume_requirements(prob, label, epsilon=0.1)["class_1"]
    assert need["outer"] == pytest.approx(F32(0.2))
    # eps 0.3 allows 3 misses: the 4th smallest, 0.4; eps 0.4 allows all 4: any l_out (1.0)
    assert volume_requirements(prob, label, epsilon=0.3)["class_1"]["outer"] == pytest.approx(F32(0.4))
    assert volume_requirements(prob, label, epsilon=0.4)["class_1"]["outer"] == 1.0
    # the missed fraction at each grid threshold: #{missed p < l} / 10, nondecreasing
    loss = need["outer_loss"]
    assert loss[GRID.searchsorted(F32(0.25))] == pytest.approx(0.2) and loss[0] == 0 and loss[-1] == pytest.approx(0.4)
    assert np.all(np.diff(loss) >= 0)


def test_the_inner_requirement_by_hand():
    # predicted voxels by p: 0.9 (true), 0.8 (false), 0.7 (true), 0.6 (true); eps 0.25: the top 1 holds, the top 2
    # have 1 of 2 outside (> floor(0.5) = 0): l_in must exceed 0.8
    prob, label = _two_class([0.9, 0.8, 0.7, 0.6, 0.1], [1, 0, 1, 1, 1])
    need = volume_requirements(prob, label, epsilon=0.25)["class_1"]
    assert need["inner"] == float(np.nextafter(F32(0.8), F32(2)))
    # eps 0.5: top 2 (1 <= 1), top 3 (1 <= 1), all 4 (1 <= 2): the whole prediction, l_in = 0
    assert volume_requirements(prob, label, epsilon=0.5)["class_1"]["inner"] == 0.0
    # not monotone: 0.9 false, then three true; the top 1 fails, so every l_in up to 0.9 fails with eps 0.25
    prob, label = _two_class([0.9, 0.8, 0.7, 0.6], [0, 1, 1, 1])
    need = volume_requirements(prob, label, epsilon=0.25)["class_1"]
    assert need["inner"] == float(np.nextafter(F32(0.9), F32(2)))
    assert np.all(np.diff(need["inner_loss"]) <= 0) and need["inner_loss"][-1] == 0  # made monotone; empty holds


def test_an_absent_structure_follows_the_case_score():
    # absent from the label and not predicted: left out; absent but predicted: the inner contour must be empty
    prob, label = _two_class([0.1, 0.2, 0.3], [0, 0, 0])
    assert volume_requirements(prob, label)["class_1"] is None
    prob, label = _two_class([0.7, 0.2], [0, 0])
    need = volume_requirements(prob, label)["class_1"]
    assert need["outer"] == 1.0 and need["inner"] == float(np.nextafter(F32(0.7), F32(2)))


def _needs(outer: list[float], inner: list[float]) -> list[dict]:
    return [
        {"c": {"outer": o, "inner": i, "outer_loss": np.zeros(len(GRID)), "inner_loss": np.zeros(len(GRID))}}
        for o, i in zip(outer, inner)
    ]


def test_the_conformal_choice_by_subject():
    outer = [0.5, 0.3, 0.7, 0.2, 0.9, 0.4, 0.6, 0.8, 0.35]
    inner = [0.6, 0.9, 0.7, 0.55, 0.95, 0.8, 0.65, 0.75, 0.85]
    # 9 subjects, alpha 0.1: j = floor(0.1 * 10) = 1, k = ceil(10 * 0.9) = 9: the smallest l_out, the largest l_in
    margins = ContourMargins.from_validation(_needs(outer, inner), [f"s{i}" for i in range(9)], alpha=0.1)
    entry = margins.classes["c"]
    assert (entry["lambda_out"], entry["lambda_in"], entry["rank"], entry["subjects"]) == (0.2, 0.95, 9, 9)
    # 19 subjects: j = 2, k = 18: the 2nd smallest l_out and the 18th smallest (2nd largest) l_in
    outer19, inner19 = [i / 20 for i in range(1, 20)], [i / 20 for i in range(1, 20)]
    entry = ContourMargins.from_validation(_needs(outer19, inner19), [str(i) for i in range(19)]).classes["c"]
    assert (entry["lambda_out"], entry["lambda_in"], entry["rank"]) == (0.1, 0.9, 18)
    # a subject's worst volume: s0's two volumes count once, with the smaller l_out and the larger l_in
    twice = ContourMargins.from_validation(_needs(outer + [0.1], inner + [0.99]), [f"s{i}" for i in range(9)] + ["s0"])
    assert twice.classes["c"]["subjects"] == 9 and twice.classes["c"]["lambda_out"] == 0.1
    assert twice.classes["c"]["lambda_in"] == 0.99


def test_too_few_subjects_give_null_with_the_count():
    margins = ContourMargins.from_validation(_needs([0.5] * 8, [0.5] * 8), [str(i) for i in range(8)], alpha=0.1)
    entry = margins.classes["c"]
    assert entry["lambda_out"] is None and entry["lambda_in"] is None and entry["rank"] is None
    assert "needs at least 9" in entry["reason"] and "contour_alpha >= 0.111" in entry["reason"]
    expected = ContourMargins.from_validation(_needs([0.5] * 8, [0.5] * 8), list("abcdefgh"), risk="expected")
    assert expected.classes["c"]["lambda_out"] is None and "needs at least 9" in expected.classes["c"]["reason"]


@pytest.mark.parametrize("kwargs, words", [
    ({"alpha": 1.5}, ("contour_alpha", "> 0 and < 1", "1.5")),
    ({"epsilon": 0}, ("contour_epsilon", "> 0 and < 1", "got 0")),
    ({"risk": "mean"}, ("contour_risk", "per_case", "expected")),
])  # fmt: skip
def test_bad_settings_are_one_line(kwargs, words):
    with pytest.raises(ValueError) as raised:
        ContourMargins({}, **kwargs)
    assert all(w in str(raised.value) for w in words) and "\n" not in str(raised.value)


def _case(rng: np.random.Generator, size: int = 400) -> tuple[torch.Tensor, torch.Tensor]:
    """A calibrated synthetic case: a blob of high probability whose sharpness varies by case; the label drawn from
    the probabilities (so they are calibrated)."""
    x = np.linspace(-1, 1, size)
    centre, width, sharp = rng.uniform(-0.3, 0.3), rng.uniform(0.2, 0.5), rng.uniform(5, 40)
    p = 1 / (1 + np.exp(-sharp * (width - np.abs(x - centre))))
    label = (rng.random(size) < p).astype(np.int64)
    return torch.tensor(np.stack([1 - p, p]), dtype=torch.float32), torch.tensor(label)


def _holds(prob, label, entry, epsilon) -> tuple[bool, bool]:
    inner, outer = contour_masks(prob, {"class_1": entry})
    truth = label.bool()
    outer_ok = int((truth & ~outer[0].bool()).sum()) <= np.floor(epsilon * int(truth.sum()) + 1e-9)
    size = int(inner[0].sum())
    inner_ok = size == 0 or int((inner[0].bool() & ~truth).sum()) <= np.floor(epsilon * size + 1e-9)
    return outer_ok, inner_ok


def test_the_per_case_guarantee_holds_by_simulation():
    rng, alpha, epsilon, m = np.random.default_rng(0), 0.1, 0.05, 19
    fails, total = np.zeros(2), 0
    for _ in range(150):
        cases = [_case(rng) for _ in range(m)]
        needs = [volume_requirements(p, y, epsilon) for p, y in cases]
        entry = ContourMargins.from_validation(needs, [str(i) for i in range(m)], alpha, epsilon).classes["class_1"]
        for _ in range(10):
            fails += [not ok for ok in _holds(*_case(rng), entry, epsilon)]
            total += 1
    rate = fails / total
    noise = 3 * np.sqrt(alpha * (1 - alpha) / total)
    # at most alpha (plus binomial noise), and not trivially: the contours are tight enough to fail sometimes
    assert np.all(rate <= alpha + noise), rate
    assert np.all(rate >= 0.02), rate


def test_the_expected_rate_variant_controls_the_mean_missed_fraction():
    rng, alpha, m = np.random.default_rng(1), 0.1, 19
    missed = []
    for _ in range(100):
        needs = [volume_requirements(*_case(rng)) for _ in range(m)]
        margins = ContourMargins.from_validation(needs, [str(i) for i in range(m)], alpha, risk="expected")
        entry = margins.classes["class_1"]
        loss = np.array([n["class_1"]["outer_loss"] for n in needs])
        at = int(np.flatnonzero(GRID == F32(entry["lambda_out"]))[0])
        assert (loss[:, at].sum() + 1) / (m + 1) <= alpha + 1e-12  # the chosen threshold meets the bound
        assert at == len(GRID) - 1 or (loss[:, at + 1].sum() + 1) / (m + 1) > alpha  # and is the largest that does
        for _ in range(5):
            prob, label = _case(rng)
            _, outer = contour_masks(prob, {"class_1": entry})
            missed.append(float((label.bool() & ~outer[0].bool()).sum()) / max(int(label.sum()), 1))
    assert np.mean(missed) <= alpha + 3 * np.std(missed) / np.sqrt(len(missed))


def test_the_contours_are_nested():
    prob, _ = _case(np.random.default_rng(2))
    sizes = []
    for low in (0.1, 0.3, 0.6, 0.9):
        inner, outer = contour_masks(prob, {"class_1": {"lambda_out": low, "lambda_in": low}})
        pred = prob.argmax(0) == 1
        assert bool((inner[0].bool() <= pred).all()) and bool((pred <= outer[0].bool()).all())
        sizes.append((int(inner[0].sum()), int(outer[0].sum())))
    assert [s[1] for s in sizes] == sorted((s[1] for s in sizes), reverse=True)  # the outer shrinks as l_out rises
    assert [s[0] for s in sizes] == sorted((s[0] for s in sizes), reverse=True)  # so does the inner


def test_a_stored_set_is_refused_with_other_weights(tmp_path):
    weights, other = tmp_path / "model.pt", tmp_path / "other.pt"
    weights.write_bytes(b"weights")
    other.write_bytes(b"other weights")
    margins = ContourMargins.from_validation(_needs([0.2] * 9, [0.8] * 9), [str(i) for i in range(9)])
    path = write_measured(tmp_path / "contours.json", margins.record(), weights)
    read, why = read_contour_margins(tmp_path, weights)
    assert why == "" and read.classes["c"]["lambda_out"] == 0.2 and read.alpha == 0.1 and read.epsilon == 0.02
    assert json.loads(path.read_text())["guarantee"].startswith("for a new case")
    with pytest.raises(ValueError, match="a contour set from other weights .* run the bundle's calibrate step again"):
        read_contour_margins(path, other)
    assert read_contour_margins(tmp_path / "none.json")[0] is None


def _served(flag: bool | None, taken: bool = False) -> dict:
    prob = torch.zeros(3, 4, 4, 1)
    prob[0] = 1.0
    prob[:, :2, :2] = torch.tensor([0.1, 0.8, 0.1])[:, None, None, None]  # 4 voxels of class 1
    prob[:, 2:, :2] = torch.tensor([0.6, 0.35, 0.05])[:, None, None, None]  # 4 background voxels, p_1 0.35
    affine = torch.diag(torch.tensor([2.0, 2.0, 5.0, 1.0]))  # 20 uL a voxel
    entries = {
        "liver": {"lambda_out": 0.3, "lambda_in": 0.9, "subjects": 9},
        "kidney": {"lambda_out": None, "lambda_in": None, "subjects": 3, "reason": "too few"},
    }
    transform = ContourMarginsd("pred", ContourMargins(entries), label_names={"0": "bg", "1": "liver", "2": "kidney"})
    quality = {"review": {"flag": flag, "reasons": ["case score below the validated range"] if flag else []}}
    d = {"pred": MetaTensor(prob, affine=affine), "quality": quality}
    return transform(ConfidenceAndSegmentationd("pred")(d) if taken else d)


def test_the_served_contours_and_their_volumes():
    d = _served(False)
    contours = d["quality"]["contours"]
    liver = contours["classes"]["liver"]
    # outer: the 4 predicted voxels and the 4 with p 0.35 >= 0.3; inner: p 0.8 < 0.9: empty
    assert liver["predicted_ml"] == pytest.approx(4 * 0.02) and liver["outer_ml"] == pytest.approx(8 * 0.02)
    assert liver["inner_ml"] == 0 and liver["lambda_out"] == 0.3 and contours["alpha"] == 0.1
    assert d["contour_outer"].shape == (2, 4, 4, 1) and int(d["contour_outer"][1].sum()) == 0  # kidney: none
    assert contours["vouched"] is False and "too few" in contours["reason"]  # a structure without lambdas
    kidney = contours["classes"]["kidney"]  # no lambdas: no contour, so no contour volume (not 0 mL)
    assert kidney["inner_ml"] is None and kidney["outer_ml"] is None and kidney["predicted_ml"] == 0


def test_the_segmentation_taken_just_before_serves_as_the_argmax():
    # after ConfidenceAndSegmentationd (the served chain) the contours reuse its segmentation: the same answer
    alone, taken = _served(False), _served(False, taken=True)
    assert "segmentation" in taken and taken["quality"]["contours"] == alone["quality"]["contours"]
    for key in ("contour_inner", "contour_outer"):
        assert torch.equal(taken[key].as_tensor(), alone[key].as_tensor())


def test_a_flagged_case_is_not_vouched_for():
    contours = _served(True)["quality"]["contours"]
    assert contours["vouched"] is False and contours["reason"].startswith("not vouched for: the case lies outside")
    assert "case score below the validated range" in contours["reason"]


def test_the_morphological_margin():
    truth = np.zeros((12, 12), bool)
    truth[2:9, 2:9] = True
    pred = np.zeros((12, 12), bool)
    pred[3:8, 3:8] = True
    pred[10, 10] = True  # a stray voxel outside the truth: 1 of 26 predicted
    # dilated once (4-connected): the 7 x 7 square but its 4 corners; twice: all of it
    assert morphological_requirements(pred, truth, epsilon=0.0) == (2.0, 1.0)
    assert morphological_requirements(pred, truth, epsilon=0.1) == (1.0, 0.0)  # 4 of 49 missed; 1 of 26 outside
    inner, outer = morphological_contours(pred, 2, 1)
    assert bool((truth <= outer).all()) and not inner[10, 10] and int(inner.sum()) == 9
    assert choose_margin([1, 2, 0, 1, 3, 1, 2, 0, 1], alpha=0.1) == 3 and choose_margin([1] * 8, alpha=0.1) is None
