"""Cross-conformal case scores: a served case is also scored by each cross-fitted fold's recalibration, and the
review rule compares validation volume i (scored by fold j(i)) with the case as fold j(i) scores it."""

from __future__ import annotations

import json
import math

import pytest
import torch

from calib_monai.metrics import estimated_dice
from calib_monai.recalibration import LocalTemperatureScaling, TemperatureScaling, temperature_maps
from calib_monai.recalibration.stored import (
    CalibrateLogitsd,
    case_score_offsets,
    load_calibrations,
    publish_calibration,
)
from calib_monai.review import ValidatedRange, read_validated_range

# two classes, four voxels in one slice; logit differences +-ln 3: at temperature T class 1's probability on its
# two predicted voxels is p = 3^(1/T) / (1 + 3^(1/T)) and 1 - p on the other two, so its estimated DSC is
# 2 * 2p / (2 + 2) = p: 0.75 at T = 1 (the full fit), sqrt 3 / (1 + sqrt 3) at T = 2 (fold 0), 0.9 at T = 0.5 (fold 1)
LOGITS = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, -1.0, -1.0]]).mul(math.log(3)).reshape(2, 2, 2, 1)
IMAGE = torch.zeros(1, 2, 2, 1)
T_FULL, T_FOLD0, T_FOLD1 = 0.75, math.sqrt(3) / (1 + math.sqrt(3)), 0.9
FULL, FOLDS = TemperatureScaling(1.0), [TemperatureScaling(2.0), TemperatureScaling(0.5)]


def test_the_offset_is_the_full_fits_score_minus_each_folds():
    with torch.no_grad():
        offsets = case_score_offsets(FULL(LOGITS), [fold(LOGITS) for fold in FOLDS], LOGITS.argmax(0))
    assert offsets == pytest.approx([T_FULL - T_FOLD0, T_FULL - T_FOLD1])  # [0.1160, -0.15]


def _range(**kwargs) -> ValidatedRange:
    # volumes 0-2 scored by fold 0, 3-5 by fold 1; alpha 0.2 with 6 volumes: k = 1
    scores = [0.65, 0.75, 0.80, 0.50, 0.52, 0.70]
    return ValidatedRange(scores, alpha=0.2, **kwargs)


def _case(score: float, offsets: list[float] | None) -> dict:
    quality = {"case_score": score, "classes": {}}
    return quality if offsets is None else {**quality, "case_score_offsets": offsets}


def test_each_volume_is_compared_with_the_case_as_its_fold_scores_it():
    # the case serves 0.60; fold 0 scores it 0.70 (offset -0.10), fold 1 0.55 (offset +0.05). Counted by hand, the
    # volumes at or below the case under their own fold: fold 0's 0.65 < 0.70, fold 1's 0.50 and 0.52 < 0.55: rank 4
    # of 7. Against the served score alone (the scores of another function) it would be 0.50 and 0.52: rank 3; with
    # the folds swapped, fold 1's two only: rank 3
    folded = _range(score_folds=[0, 0, 0, 1, 1, 1])
    verdict = folded.check(_case(0.60, [-0.10, 0.05]))
    assert verdict["signals"]["case_score"]["rank"] == 4 and verdict["rank"] == 4
    assert verdict["signals"]["case_score"]["value"] == pytest.approx(0.60)  # the served score, as users see it
    assert (
        _range().check(_case(0.60, [-0.10, 0.05]))["signals"]["case_score"]["rank"] == 3
    )  # one function: offsets unused
    swapped = _range(score_folds=[1, 1, 1, 0, 0, 0])
    assert swapped.check(_case(0.60, [-0.10, 0.05]))["signals"]["case_score"]["rank"] == 3
    # the case lowest under every fold: rank 1 and flagged (k = 1)
    low = folded.check(_case(0.45, [-0.10, 0.05]))
    assert low["signals"]["case_score"]["rank"] == 1 and low["flag"] is True


def test_a_case_without_its_fold_scores_cannot_be_judged_by_the_case_score():
    folded = _range(score_folds=[0, 0, 0, 1, 1, 1])
    for offsets in (None, [0.1]):
        verdict = folded.check(_case(0.10, offsets))
        assert verdict["flag"] is None and "case_score" not in verdict["signals"]
        assert "cross-fitted recalibrations" in verdict["reasons"][0] and "CalibrateLogitsd" in verdict["reasons"][0]
    bad = pytest.raises(ValueError, ValidatedRange, [0.5, 0.6], score_folds=[0])
    assert "score_folds" in str(bad.value) and "run calibrate again" in str(bad.value)


def test_calibrate_stores_the_folds_and_serving_applies_them(tmp_path):
    weights = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(1)}, weights)
    validated = _range(score_folds=[0, 0, 0, 1, 1, 1])
    publish_calibration(FULL, tmp_path / "calibration.pt", weights, validated, fold_modules=FOLDS)
    served, folds = load_calibrations(tmp_path / "calibration.pt", weights)
    assert float(served.temperature) == 1.0 and [float(f.temperature) for f in folds] == [2.0, 0.5]
    assert read_validated_range(tmp_path, weights)[0].score_folds == [0, 0, 0, 1, 1, 1]
    transform = CalibrateLogitsd("pred", tmp_path / "calibration.pt", weights)
    item = transform({"pred": LOGITS.clone(), "image": IMAGE})
    assert item["case_score_offsets"] == pytest.approx([T_FULL - T_FOLD0, T_FULL - T_FOLD1])
    # a plain split stores no folds: nothing to add
    plain = tmp_path / "plain"
    plain.mkdir()
    publish_calibration(FULL, plain / "calibration.pt", weights, _range())
    assert load_calibrations(plain, weights)[1] == []
    assert "case_score_offsets" not in CalibrateLogitsd("pred", plain, weights)({"pred": LOGITS, "image": IMAGE})


def _constant(temperature: float, classes: int = 2) -> LocalTemperatureScaling:
    """Local temperature scaling whose map is ``temperature`` everywhere: zero weights and biases, the last bias
    ``softplus^-1(temperature - 0.05)``."""
    module = LocalTemperatureScaling(classes, 1)
    with torch.no_grad():
        for conv in module.body[::2]:
            conv.weight.zero_(), conv.bias.zero_()
        module.body[-1].bias.fill_(math.log(math.expm1(temperature - 0.05)))
    return module.eval()


def _publish(tmp_path, served, folds):
    weights = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(1)}, weights)
    validated = _range(score_folds=[0, 0, 0, 1, 1, 1])
    publish_calibration(served, tmp_path / "calibration.pt", weights, validated, fold_modules=folds)
    return CalibrateLogitsd("pred", tmp_path / "calibration.pt", weights)


def test_local_temperature_fits_run_as_one_network_and_score_as_their_temperatures(tmp_path):
    # maps of 1, 2 and 0.5 everywhere: the three fits in one pass give those maps, and serving scores the case as
    # temperature scaling at those temperatures does (the hand-computed offsets above)
    served, folds = _constant(1.0), [_constant(2.0), _constant(0.5)]
    maps = temperature_maps([served, *folds], LOGITS.movedim(3, 0), IMAGE.movedim(3, 0))  # (slices, 3, H, W)
    assert maps.shape == (1, 3, 2, 2)
    assert torch.allclose(maps, torch.tensor([1.0, 2.0, 0.5]).reshape(1, 3, 1, 1).expand(1, 3, 2, 2), atol=1e-6)
    with torch.no_grad():
        item = _publish(tmp_path, served, folds)({"pred": LOGITS.clone(), "image": IMAGE})
    assert torch.allclose(item["pred"], LOGITS, atol=1e-6)  # the served map is 1
    assert item["case_score_offsets"] == pytest.approx([T_FULL - T_FOLD0, T_FULL - T_FOLD1], abs=1e-6)


def test_serving_the_fits_as_one_network_equals_applying_each_on_its_own(tmp_path):
    # fits whose maps vary over the slice: the served logits and the offsets against the straightforward computation,
    # each module on each 2D slice and each case score taken on its own (with the raw logits' argmax); slices of
    # 130 x 130 go through the stacked network 3 and 2 at a time
    torch.manual_seed(0)
    served, *folds = modules = [LocalTemperatureScaling(3, 1) for _ in range(3)]
    for module in modules:
        torch.nn.init.normal_(module.body[-1].weight, std=0.5)
        module.eval()
    logits, image = torch.randn(3, 130, 130, 5) * 4, torch.rand(1, 130, 130, 5)
    with torch.no_grad():
        item = _publish(tmp_path, served, folds)({"pred": logits.clone(), "image": image})
        by_module = [
            torch.stack([m(logits[None, ..., d], image[None, ..., d])[0] for d in range(5)], dim=-1) for m in modules
        ]
        scores = [float(estimated_dice(torch.softmax(z, 0), logits.argmax(0)).nanmean()) for z in by_module]
    assert torch.allclose(item["pred"], by_module[0], rtol=1e-5, atol=1e-6)
    assert item["case_score_offsets"] == pytest.approx([scores[0] - scores[1], scores[0] - scores[2]], abs=1e-6)
    assert len({round(s, 6) for s in scores}) == 3  # three fits that score the case differently
    mixed = [LocalTemperatureScaling(3, 1), LocalTemperatureScaling(3, 1, hidden=8)]
    with pytest.raises(ValueError, match=r"differ in \(num_classes, in_channels, hidden\).*one calibration.pt"):
        temperature_maps(mixed, logits.movedim(3, 0), image.movedim(3, 0))


def test_a_range_without_score_folds_is_refused_naming_the_fix(tmp_path):
    weights = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(1)}, weights)
    path = _range().save(tmp_path / "validated_range.json", weights)
    record = json.loads(path.read_text())
    del record["score_folds"]
    path.write_text(json.dumps(record))
    message = str(pytest.raises(ValueError, read_validated_range, path, weights).value)
    assert str(path) in message and "score_folds" in message and "calibrate step again" in message
