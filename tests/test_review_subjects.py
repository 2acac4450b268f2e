"""The review rule counts subjects, not volumes: a patient's two frames are one exchangeable unit. Worked by hand, by
simulation (the volume count overstates the guarantee; the subject count keeps it), through the split of the
calibrate step, a stored range and the ACDC datalist."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from calib_monai.recalibration.fitting import split_volumes
from calib_monai.recalibration.recalibrate import exact_scheme_hint
from calib_monai.review import ValidatedRange
from calib_monai.review.conformal import draw_bound
from calib_monai.review.validated_range import read_validated_range


def _case(score: float) -> dict:
    return {"case_score": score, "classes": {}}


def test_a_subject_counts_once_by_its_most_extreme_volume():
    # 10 patients x 2 frames at alpha 0.1: m = 10, k = floor(0.1 x 11) = 1, bound 1 / 11 (counted as 20 volumes it
    # would be k = floor(0.1 x 21) = 2 and 2 / 21). Patient p0's frames score 0.30 and 0.32, the others 0.60-0.87.
    scores = [0.30, 0.32] + [0.60 + 0.03 * i for i in range(18)]
    subjects = [f"p{i // 2}" for i in range(20)]
    by_patient = ValidatedRange(scores, alpha=0.1, subjects=subjects)
    by_volume = ValidatedRange(scores, alpha=0.1)
    assert (by_patient.m, by_patient.rank, by_patient.bound) == (10, 1, pytest.approx(1 / 11))
    assert (by_volume.m, by_volume.rank, by_volume.bound) == (20, 2, pytest.approx(2 / 21))
    # 0.31 lies between p0's two frames: beyond one validation volume, but not beyond the patient p0, whose most
    # extreme frame (0.30) is lower: rank 2 of 11 patients, not flagged at k = 1; counted by volume, rank 2 of 21 <= 2
    verdict = by_patient.check(_case(0.31))
    assert verdict["flag"] is False and verdict["rank"] == 2 and verdict["k"] == 1
    assert verdict["validation_subjects"] == 10 and verdict["validation_volumes"] == 20
    assert by_volume.check(_case(0.31))["flag"] is True
    # below every patient: rank 1 of 11, flagged
    low = by_patient.check(_case(0.29))
    assert low["flag"] is True and low["rank"] == 1
    # the signal's rank in the reason is among volumes, and says so (the flag's is among subjects)
    assert (
        "(rank 1 of 21 volumes," in low["reasons"][0] and "(rank 1 of 21," in by_volume.check(_case(0.29))["reasons"][0]
    )
    # given the draw of the 10 patients the flag rate is Beta(1, 10): below 1 - 0.1^(1/10) = 20.6% for 90% of draws
    assert by_patient.draw_bound == pytest.approx(1 - 0.1 ** (1 / 10))
    assert "below 20.6% for 90% of them" in by_patient.describe()
    assert "m = 10 validation subjects (20 volumes)" in by_patient.describe()
    assert "among the 1 largest of the 11 subjects" in by_patient.describe()
    # at alpha 0.05 ten patients cannot flag: k = floor(0.05 x 11) = 0, and the words say what is needed
    few = ValidatedRange(scores, alpha=0.05, subjects=subjects)
    verdict = few.check(_case(0.01))
    assert few.rank == 0 and verdict["flag"] is None
    assert verdict["reasons"][0] == (
        "cannot judge at alpha = 0.05 with m = 10 validation subjects (20 volumes): needs at least 19 subjects (or "
        "review_alpha >= 0.0909); the case is ranked 1 of 11"
    )
    with pytest.raises(ValueError, match="3 subjects for 20 scores"):
        ValidatedRange(scores, subjects=["a", "b", "c"])


def test_counted_by_volume_near_copies_break_the_bound_counted_by_subject_it_holds():
    """10 validation patients with two nearly equal frames each, and a frame of a new patient from the same
    distribution. Counted by volume at alpha 0.05 (n = 20, k = 1) the rule states 1 / 21 = 4.8%, but a case beyond
    all 20 volumes is one beyond all 10 patients: it flags about 1 / 11. Counted by subject the same flag is the
    rule at alpha 0.1 (m = 10, k = 1), which states 1 / 11 = 9.1%, and holds."""
    rng = np.random.default_rng(0)
    trials, by_volume, by_subject = 3000, 0, 0
    subjects = [f"p{i // 2}" for i in range(20)]
    for _ in range(trials):
        patients = rng.normal(size=11)
        frames = list(np.repeat(patients[:10], 2) + 0.01 * rng.normal(size=20))
        case = _case(float(patients[10] + 0.01 * rng.normal()))
        volume_rule = ValidatedRange(frames, alpha=0.05)
        subject_rule = ValidatedRange(frames, alpha=0.1, subjects=subjects)
        by_volume += volume_rule.check(case)["flag"] is True
        by_subject += subject_rule.check(case)["flag"] is True
    spread = 3 * math.sqrt(0.09 * 0.91 / trials)
    assert volume_rule.bound == pytest.approx(1 / 21) and subject_rule.bound == pytest.approx(1 / 11)
    assert by_volume / trials > 1 / 21 + spread  # the stated 4.8% does not hold
    assert abs(by_volume / trials - 1 / 11) < spread
    assert abs(by_subject / trials - 1 / 11) < spread  # the stated 9.1% holds


def test_the_draw_bound_is_the_beta_quantile():
    # P(Beta(k, m + 1 - k) <= x) = P(Binomial(m, x) >= k): at the 0.9 quantile, 90% of draws
    from scipy.stats import binom

    for k, m in ((1, 25), (2, 30), (3, 60)):
        assert binom.sf(k - 1, m, draw_bound(k, m)) == pytest.approx(0.9)
    assert ValidatedRange([0.5] * 13, alpha=0.05).draw_bound is None  # k = 0: no rate to bound


def test_the_split_keeps_a_subjects_volumes_on_one_side():
    subjects = [f"p{i // 2}" for i in range(20)]
    cross = split_volumes(20, seed=0, crossfit=True, subjects=subjects)
    (a, b), _ = cross.folds
    assert sorted(a + b) == list(range(20)) and len(a) == len(b) == 10
    assert {subjects[i] for i in a}.isdisjoint(subjects[i] for i in b)  # no frame scored by a fit on its twin
    assert "cross-fitting of the validation subjects (20 volumes)" in cross.rule
    plain = split_volumes(20, 0.5, seed=0, subjects=subjects)
    assert {subjects[i] for i in plain.fit}.isdisjoint(subjects[i] for i in plain.range)
    assert len(plain.fit) == len(plain.range) == 10
    # one volume per subject: the same split as without subjects (earlier ranges and other data sets unchanged)
    names = [f"case{i}" for i in range(25)]
    assert (
        split_volumes(25, seed=3, crossfit=True, subjects=names).folds == split_volumes(25, seed=3, crossfit=True).folds
    )
    assert split_volumes(25, 0.5, seed=3, subjects=names).fit == split_volumes(25, 0.5, seed=3).fit
    assert split_volumes(4, crossfit=True, subjects=["p"] * 4).in_sample  # one patient cannot be split
    with pytest.raises(ValueError, match="3 subjects for 4 validation volumes"):
        split_volumes(4, subjects=["a", "b", "c"])


def test_the_hint_for_an_exact_bound_names_the_fewest_subjects_a_held_out_split_needs():
    subjects = [f"p{i // 2}" for i in range(40)]  # 20 patients x 2 frames
    for alpha, fewest in ((0.1, 17), (0.05, 37)):  # a range of ceil(1 / alpha - 1) = 9 or 19 subjects
        rule = ValidatedRange([0.5 + 0.01 * i for i in range(40)], alpha=alpha, subjects=subjects)
        hint = exact_scheme_hint(rule, 0.5)
        assert f"needs at least {fewest} validation subjects at alpha {alpha:g}" in hint
        assert "fitted on all 20 subjects" in hint and "approximate" in hint
        for m, reaches in ((fewest, True), (fewest - 1, False)):  # what split_volumes then leaves for the range
            held_out = split_volumes(m, 0.5, seed=0).range
            assert (ValidatedRange([0.5] * len(held_out), alpha=alpha).rank >= 1) is reaches, (alpha, m)


def test_k_fold_cross_fitting_scores_every_volume_once_by_a_fit_without_its_subject():
    subjects = [f"p{i // 2}" for i in range(22)]  # 11 patients: 5 folds of 3, 2, 2, 2, 2 patients
    five = split_volumes(22, seed=1, crossfit=True, subjects=subjects, folds=5)
    scored = [i for _, group in five.folds for i in group]
    assert sorted(scored) == list(range(22))  # every volume scored exactly once
    assert [len(group) for _, group in five.folds] == [4, 4, 4, 4, 6]  # fold i scores group i + 1: 6, 4, 4, 4, 4
    for fit, group in five.folds:
        assert sorted(fit + group) == list(range(22))  # fitted on all the others
        assert {subjects[i] for i in fit}.isdisjoint(subjects[i] for i in group)
    assert five.rule.startswith("5-fold cross-fitting of the validation subjects (22 volumes)")
    assert "folds of 6, 4, 4, 4 and 4 volumes" in five.rule
    # one subject per fold (leave one subject out); more folds than subjects cannot be honoured: refused, not run
    # with fewer folds than the manifest would record
    assert len(split_volumes(6, crossfit=True, subjects=subjects[:6], folds=3).folds) == 3
    with pytest.raises(ValueError, match=r"calibration_folds 10 is more than the 3 validation subjects \(6 volumes\)"):
        split_volumes(6, crossfit=True, subjects=subjects[:6], folds=10)
    with pytest.raises(ValueError, match="calibration_folds must be an integer >= 2, got 1"):
        split_volumes(6, crossfit=True, folds=1)


def test_a_stored_range_keeps_its_subjects_and_one_without_them_is_refused(tmp_path):
    weights = tmp_path / "model.pt"
    torch.save({}, weights)
    scores = [0.5 + 0.02 * i for i in range(20)]
    subjects = [f"p{i // 2}" for i in range(20)]
    path = ValidatedRange(scores, alpha=0.1, subjects=subjects).save(tmp_path / "validated_range.json", weights)
    loaded, why = read_validated_range(path, weights)
    assert why == "" and loaded.subjects == subjects and loaded.m == 10
    record = json.loads(Path(path).read_text())
    del record["subjects"]  # an older layout: refused in one line naming the file, the field and the fix
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"lacks \['subjects'\] .*run the bundle's calibrate step again$") as error:
        read_validated_range(path, weights)
    assert str(path) in str(error.value) and "\n" not in str(error.value)
    # a hand-edited file: a string is not read as one subject per character, a short list is not padded, null is
    # not "unknown"
    for bad, words in (
        ("p0p1", "must be a list of one name per validation volume, got str"),
        (["p0"], "1 subjects"),
        (None, "must be a list of one name per validation volume, got NoneType"),
    ):
        record["subjects"] = bad
        path.write_text(json.dumps(record))
        with pytest.raises(ValueError, match=words) as error:
            read_validated_range(path, weights)
        assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_the_acdc_datalist_names_each_frames_patient(acdc_dir, tmp_path):
    from calib_monai.data import ACDC

    datalist = ACDC(acdc_dir, output_dir=tmp_path).datalist()
    for subset in ("training", "validation", "test"):
        assert all(item["subject"] == Path(item["image"]).parent.name for item in datalist[subset])
    assert len({item["subject"] for item in datalist["validation"]}) == 10  # 20 frames, 10 patients
    # a datalist stored before items had a subject gets one when read back
    stored = json.loads((tmp_path / "datalist.json").read_text())
    assert all("subject" not in item for item in stored["validation"])
    again = ACDC(acdc_dir, output_dir=tmp_path).datalist()
    assert again["validation"][0]["subject"] == Path(again["validation"][0]["image"]).parent.name


def test_the_calibrate_step_reads_each_volumes_subject_from_its_item(tmp_path):
    """An Ignite engine hands RecalibrationFitter items with "subject" (as a datalist of ACDC frames does): the range
    stores them, its folds keep a patient's frames together and its bound counts the 2 patients."""
    from ignite.engine import Engine

    from calib_monai.handlers import RecalibrationFitter
    from calib_monai.recalibration import RecalibrationSettings

    g = torch.Generator().manual_seed(0)
    volumes = []
    for subject in ("p0", "p0", "p1", "p1"):
        logits = 3 * torch.randn(3, 16, 16, 4, generator=g)
        label = logits.argmax(0, keepdim=True)
        volumes.append(
            {"pred": logits, "label": label, "image": torch.rand(1, 16, 16, 4, generator=g), "subject": subject}
        )
    weights = tmp_path / "model.pt"
    torch.save({}, weights)
    path = tmp_path / "validated_range.json"
    engine = Engine(lambda e, batch: [batch])
    settings = RecalibrationSettings(method="temperature")
    fitter = RecalibrationFitter(tmp_path / "c.pt", weights, settings, validated_range_path=path)
    fitter.attach(engine)
    engine.run(volumes, max_epochs=1)
    validated = read_validated_range(path, weights)[0]
    assert validated.subjects == ["p0", "p0", "p1", "p1"] and validated.m == 2 and validated.n == 4
    folds = json.loads(path.read_text())["info"]["split"]["folds"]
    assert [sorted(f["scored"]) for f in folds] in (
        [["volume_0000", "volume_0001"], ["volume_0002", "volume_0003"]],
        [["volume_0002", "volume_0003"], ["volume_0000", "volume_0001"]],
    )
