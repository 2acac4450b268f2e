"""2-fold cross-fitting of the recalibration: each range volume scored by the fit that did not see it, the served
fit on all; the plain split as the option; the range's network features stored whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calib_monai.metrics import case_quality
from calib_monai.recalibration.fitting import (
    ValidationVolume,
    case_score_error,
    cross_fit,
    measure_validated_range,
    range_features,
    score_minus_truth,
    split_volumes,
)
from calib_monai.recalibration.settings import RecalibrationSettings
from calib_monai.recalibration.stored import calibrate_volume, load_calibrations

TEMPERATURE = RecalibrationSettings(method="temperature", voxels="all")


def _volumes(n: int) -> list[ValidationVolume]:
    """Overconfident logits (labels drawn from softmax(logits / 3)) of ``n`` small 2-class volumes."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        logits = 6 * torch.randn(2, 6, 6, 3, generator=g)
        prob = torch.softmax(logits / 3, 0).movedim(0, -1).reshape(-1, 2)
        label = torch.multinomial(prob, 1, generator=g).reshape(6, 6, 3)
        out.append(ValidationVolume(logits, label, torch.rand(1, 6, 6, 3, generator=g), 1.0, f"case{i}"))
    return out


def test_each_range_volume_is_scored_by_the_fit_that_did_not_see_it():
    volumes = _volumes(6)
    split = split_volumes(6, seed=0, crossfit=True)
    module, stats, scorers = cross_fit(volumes, split, TEMPERATURE)
    (a, b), (b2, a2) = split.folds
    # the served temperature is fitted on all six, each half's on its three; each scorer scores the other half
    assert stats["volumes"] == 6 and [s["volumes"] for s in stats["folds"]] == [3, 3]
    assert [scored for _, scored in scorers] == [b, a] and sorted(a + b) == list(range(6))
    temperatures = [float(m.temperature) for m, _ in scorers]
    assert temperatures[0] != temperatures[1] and float(module.temperature) > 1  # overconfident: T > 1
    assert stats["range_volumes_nll_after"] < stats["range_volumes_nll_before"]
    assert stats["split"]["crossfit"] and "approximate" in stats["split"]["exchangeability"]
    review = {"alpha": 0.2, "volume_factor": 0.0, "input_check": True, "feature_check": False}
    validated = measure_validated_range(scorers, volumes, split, review, ["bg", "a"], spatial_dim=2)
    assert validated.n == 6 and validated.rank == 1  # floor(0.2 * 7) = 1
    # volume 0's score is the case score of its probabilities under the fit on the other half
    scorer = next(m for m, scored in scorers if 0 in scored)
    with torch.no_grad():
        prob = torch.softmax(calibrate_volume(scorer, volumes[0].logits, volumes[0].image, 2), 0)
    assert validated.scores[0] == pytest.approx(case_quality(prob, class_names=["bg", "a"])["case_score"])
    # and its error: that score minus the DSC of its argmax (temperatures do not move the argmax: the raw logits')
    label = volumes[0].label
    predicted = volumes[0].logits.argmax(0) == 1
    truth = 2 * float((predicted & (label == 1)).sum()) / float(predicted.sum() + (label == 1).sum())
    error = validated.info["case_score_error"]
    assert error["volumes"] == 6 and error["values"][0] == pytest.approx(validated.scores[0] - truth, abs=1e-6)
    assert error["mean"] == pytest.approx(np.mean(error["values"]), abs=1e-6)


def test_the_case_score_error_is_the_score_minus_the_delivered_dsc():
    # 4 voxels, class 1 true on voxels 1 and 2; the argmax says voxels 1 and 3: DSC 2 * 1 / (2 + 2) = 0.5. A third
    # class absent from both the label and the argmax is left out of the truth, as of the case score
    prob = torch.tensor([[0.8, 0.1, 0.6, 0.3], [0.2, 0.9, 0.4, 0.6], [0.0, 0.0, 0.0, 0.1]])
    label = torch.tensor([0, 1, 1, 0])
    assert score_minus_truth({"case_score": 0.7}, prob, label) == pytest.approx(0.2)
    assert np.isnan(score_minus_truth({"case_score": None}, prob, label))
    summary = case_score_error([0.2, -0.1, float("nan"), 0.05])
    assert summary["volumes"] == 3 and summary["mean"] == pytest.approx(0.05) and summary["median"] == 0.05
    assert summary["mean_absolute"] == pytest.approx(0.35 / 3) and (summary["lowest"], summary["highest"]) == (
        -0.1,
        0.2,
    )
    assert summary["per_volume"] == [0.2, -0.1, None, 0.05]  # aligned with the volumes: the served bound's
    assert case_score_error([float("nan")]) == {"volumes": 0, "per_volume": [None]}


def test_the_plain_split_scores_the_range_with_the_served_fit():
    volumes = _volumes(6)
    split = split_volumes(6, 0.5, seed=0)
    module, stats, scorers = cross_fit(volumes, split, TEMPERATURE)
    assert scorers == [(module, split.range)] and stats["volumes"] == 3 and "folds" not in stats
    review = {"alpha": 0.2, "volume_factor": 0.0, "input_check": False}
    plain = measure_validated_range(scorers, volumes, split, review)
    assert plain.n == 3 and plain.score_folds == []  # one function scores the range and a served case


def test_the_range_features_are_stored_whole_or_left_out_with_why():
    rng = np.random.default_rng(0)
    stored, why = range_features(list(rng.normal(size=(5, 40))))
    assert why == "" and stored["components"] is None and np.asarray(stored["reference"]).shape == (5, 40)
    assert range_features([rng.normal(size=4), None, rng.normal(size=4)]) == (
        None,
        "1 of 3 validation volumes have no network features",
    )
    stored, why = range_features([np.full(3, np.nan)] * 4)
    assert stored is None and "NaN or infinite" in why


def test_recalibrate_is_a_plain_function_no_engine_needed(tmp_path):
    # what the calibrate step's handler calls: the same fit and range as cross_fit + measure_validated_range, published
    import json

    from calib_monai.recalibration import recalibrate
    from calib_monai.review import load_validated_range

    volumes = _volumes(6)
    weights = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(1)}, weights)
    review = {"alpha": 0.2, "volume_factor": 0.0, "input_check": True, "feature_check": False}
    fit = RecalibrationSettings(method="temperature", voxels="all", review_alpha=0.2, review_feature_check=False)
    module, stats, validated = recalibrate(
        volumes, tmp_path / "calibration.pt", weights, fit, class_names=["bg", "a"],
        validated_range_path=tmp_path / "validated_range.json",
    )  # fmt: skip
    split = split_volumes(6, seed=0, crossfit=True)
    expected_module, _, scorers = cross_fit(volumes, split, TEMPERATURE)
    expected = measure_validated_range(scorers, volumes, split, review, ["bg", "a"], spatial_dim=2)
    assert float(module.temperature) == float(expected_module.temperature)
    assert validated.scores == expected.scores and validated.n == 6
    stored = load_validated_range(tmp_path / "validated_range.json", weights)
    assert stored.scores == pytest.approx(expected.scores)
    # the fold recalibrations that scored the range are stored with the served one, and each volume's fold named
    served, folds = load_calibrations(tmp_path / "calibration.pt", weights)
    assert [float(f.temperature) for f in folds] == [float(m.temperature) for m, _ in scorers]
    assert stored.score_folds == [next(j for j, (_, scored) in enumerate(scorers) if i in scored) for i in range(6)]
    assert json.loads((tmp_path / "calibration.json").read_text())["method"] == "temperature"
    # without a range path: the calibration alone, no range
    assert recalibrate(volumes, tmp_path / "alone" / "calibration.pt", weights, fit)[2] is None
    assert (tmp_path / "alone" / "calibration.pt").is_file()
