"""The contours of ``calibrate_probabilities`` (issue 49 item 2): lambdas chosen on the calibration set cross-fitted,
each evaluated case's inner and outer contour in inferring's format, ``contours.csv`` and its coverage.

Files are nnU-Net's real format (``_save_nnunet`` of ``tests/test_external_probabilities.py``). Two classes: temperature
scaling is monotone in ``p_1``, so which voxels a contour holds follows from the raw probabilities once they are far
from the thresholds. Fit case ``i`` of 9 misses one true voxel at ``p_1 = a_i = 0.20 + 0.02 i`` and predicts one false
voxel at ``b_i = 0.64 + 0.02 i``; the rest is 12 voxels at 0.9 (true) and 18 at 0.1 (background). With 32 voxels and
epsilon 0.02 no voxel may be wrong, so case ``i`` requires ``l_out = s(a_i)`` and ``l_in`` just above ``s(b_i)``
(``s``: the fold's temperature scaling). At contour_alpha 0.2, ``j = floor(0.2 * 10) = 2``: ``lambda_out`` is the 2nd
smallest requirement (``a = 0.22``) and ``lambda_in`` the 8th smallest (``b = 0.78``), so a new case's outer contour
holds its voxels at ``p_1 = 0.30`` and not those at 0.12, and its inner contour holds those at 0.9 and not those at 0.6.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from test_external_probabilities import _affine, _peaked, _random_label, _save_label, _save_nnunet

from calib_monai.export.slicer_contours import contour_stack
from calib_monai.recalibration import calibrate_probabilities
from calib_monai.review.contours import GRID

SHAPE = (4, 4, 2)
NAMES = {"labels": {"background": 0, "organ": 1}}


def _case(p1: list[float], label: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(prob (2, *SHAPE), label SHAPE)`` from 32 voxels in C order."""
    p = np.array(p1, dtype=np.float32).reshape(SHAPE)
    return np.stack([1 - p, p]), np.array(label).reshape(SHAPE)


def _fit_case(i: int) -> tuple[np.ndarray, np.ndarray]:
    return _case([0.20 + 0.02 * i, 0.64 + 0.02 * i] + [0.9] * 12 + [0.1] * 18, [1, 0] + [1] * 12 + [0] * 18)


def _eval_case(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Voxel 0 at 0.30 (true), 1 at 0.12, 2 at 0.60 (predicted), 3-10 at 0.9 (true), 11 at 0.95, the rest 0.05.
    Case 0: voxel 2 true (outer holds: it is predicted; inner inside). Case 1: voxel 1 true (the outer misses it).
    Case 2: voxel 11 false (the inner holds it: 1 of 9 outside)."""
    p1 = [0.30, 0.12, 0.60] + [0.9] * 8 + [0.95 if k == 2 else 0.05] + [0.05] * 20
    label = [1, int(k == 1), int(k == 0)] + [1] * 8 + [0] * 21
    return _case(p1, label)


def _write(folder: Path, labels: Path, cases: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    for name, (prob, label) in cases.items():
        _save_nnunet(folder, name, prob)
        _save_label(labels, name, label)
    (folder / "dataset.json").write_text(json.dumps(NAMES))


def _scaled(prob: np.ndarray, temperature: float) -> np.ndarray:
    """``softmax(log p / T)`` in float64, then float32 as the command compares."""
    z = np.log(np.maximum(prob.astype(np.float64), 1e-12)) / temperature
    e = np.exp(z - z.max(0))
    return (e / e.sum(0)).astype(np.float32)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture
def sets(tmp_path):
    fit, evaluated, labels = tmp_path / "fit", tmp_path / "eval", tmp_path / "labelsTr"
    _write(fit, labels, {f"fit_{i}": _fit_case(i) for i in range(9)})
    _write(evaluated, labels, {f"eval_{k}": _eval_case(k) for k in range(3)})
    return fit, evaluated, labels


def _run(sets, out: Path, **kwargs):
    fit, evaluated, labels = sets
    return calibrate_probabilities(
        str(evaluated), str(labels), str(out), str(fit), str(labels), surface_distances=False, **kwargs
    )


def test_lambdas_are_the_conformal_quantile_of_the_cross_fitted_requirements(sets, tmp_path, caplog):
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        result = _run(sets, out, contour_alpha=0.2)
    record = json.loads((out / "contours" / "contours.json").read_text())
    assert record["alpha"] == 0.2 and record["epsilon"] == 0.02 and record["risk"] == "per_case"
    info, organ = record["info"], record["classes"]["organ"]
    temperature = json.loads((out / "temperature.json").read_text())["temperature"]
    assert info["temperature"] == temperature and info["fitted_on"] == [f"fit_{i}" for i in range(9)]
    # two folds that partition the fit cases, each scored by a temperature fitted on the other
    folds = info["folds"]
    assert len(folds) == 2 and sorted(sum((f["scored"] for f in folds), [])) == info["fitted_on"]
    assert all(set(f["fit"]) == set(info["fitted_on"]) - set(f["scored"]) for f in folds)
    # each case's requirement worked out from its fold's temperature: the missed voxel a_i, the false one b_i
    need_out, need_in = [], []
    for fold in folds:
        for name in fold["scored"]:
            prob, _ = _fit_case(int(name.split("_")[1]))
            p = _scaled(prob, fold["temperature"])[1].reshape(-1)
            need_out.append(float(p[0]))
            need_in.append(float(np.nextafter(p[1], np.float32(2))))
    assert organ["subjects"] == 9 and organ["rank"] == 8  # k = 10 - floor(0.2 * 10)
    assert organ["lambda_out"] == pytest.approx(sorted(need_out)[1], abs=1e-6)
    assert organ["lambda_in"] == pytest.approx(sorted(need_in)[7], abs=1e-6)

    for k in range(3):
        prob, label = _eval_case(k)
        outer = nib.load(str(out / "contours" / f"eval_{k}_outer.nii.gz"))
        inner = nib.load(str(out / "contours" / f"eval_{k}_inner.nii.gz"))
        assert outer.get_data_dtype() == np.uint8 and outer.shape == SHAPE  # one structure: 3D, as inferring
        np.testing.assert_allclose(outer.affine, _affine())
        o, i = (np.asarray(m.dataobj).reshape(-1) for m in (outer, inner))
        # by hand: the outer holds voxel 0 (0.30), the predicted ones (2-10, and 11 in case 2), not 1 (0.12)
        assert o[[0, 2, *range(3, 11)]].all() and o[1] == 0 and o[12:].sum() == 0 and o[11] == (k == 2)
        assert i[3:11].all() and i[:3].sum() == 0 and i[11] == (k == 2) and i[12:].sum() == 0
        # and exactly the thresholds of the record on the probabilities scaled by the served temperature
        p = _scaled(prob, temperature)[1]
        pred = p >= 0.5
        np.testing.assert_array_equal(o.reshape(SHAPE), pred | (p >= np.float32(organ["lambda_out"])))
        np.testing.assert_array_equal(i.reshape(SHAPE), pred & (p >= np.float32(organ["lambda_in"])))

    rows = _rows(out / "contours" / "contours.csv")
    assert [r["case"] for r in rows] == ["eval_0", "eval_1", "eval_2"] and {r["structure"] for r in rows} == {"organ"}
    voxel_ml = 0.8 * 0.8 * 2.5 / 1000
    # coverage counted again with numpy on the written masks and the labels
    holds, inside = [], []
    for k, row in enumerate(rows):
        _, label = _eval_case(k)
        truth = label == 1
        o = np.asarray(nib.load(str(out / "contours" / f"eval_{k}_outer.nii.gz")).dataobj) > 0
        i = np.asarray(nib.load(str(out / "contours" / f"eval_{k}_inner.nii.gz")).dataobj) > 0
        holds.append((truth & ~o).sum() <= math.floor(0.02 * truth.sum()))
        inside.append((i & ~truth).sum() <= math.floor(0.02 * i.sum()))
        assert row["outer_holds"] == str(holds[-1]) and row["inner_inside"] == str(inside[-1])
        assert float(row["outer_ml"]) == pytest.approx(o.sum() * voxel_ml)
        assert float(row["inner_ml"]) == pytest.approx(i.sum() * voxel_ml)
        assert float(row["true_ml"]) == pytest.approx(truth.sum() * voxel_ml)
        assert float(row["predicted_ml"]) == pytest.approx((_eval_case(k)[0][1] >= 0.5).sum() * voxel_ml)
    assert holds == [True, False, True] and inside == [True, True, False]  # the construction's
    assert result["contours"]["organ"] == {
        "cases": 3,
        "outer_holds": 2,
        "inner_inside": 2,
        "outer_missed": pytest.approx((0 + 1 / 10 + 0) / 3),  # case 1: voxels 0, 1, 3-10 true
        "inner_outside": pytest.approx((0 + 0 + 1 / 9) / 3),
    }
    assert "in 2 of 3 case(s) (67%)" in caplog.text and "1 - contour_alpha = 80%" in caplog.text


def test_too_few_fit_cases_give_null_lambdas_and_the_reason(tmp_path):
    fit, evaluated, labels = tmp_path / "fit", tmp_path / "eval", tmp_path / "labelsTr"
    _write(fit, labels, {f"fit_{i}": _fit_case(i) for i in range(3)})
    _write(evaluated, labels, {"eval_0": _eval_case(0)})
    out = tmp_path / "out"
    result = calibrate_probabilities(
        str(evaluated), str(labels), str(out), str(fit), str(labels), surface_distances=False
    )
    organ = json.loads((out / "contours" / "contours.json").read_text())["classes"]["organ"]
    assert organ["lambda_out"] is None and organ["lambda_in"] is None and organ["subjects"] == 3
    assert (
        "cannot vouch at contour_alpha = 0.1 with 3 validation subjects having organ: needs at least 9"
        in (organ["reason"])
    )
    assert sorted(p.name for p in (out / "contours").iterdir()) == ["contours.csv", "contours.json"]
    row = _rows(out / "contours" / "contours.csv")[0]
    assert row["outer_ml"] == row["outer_holds"] == "" and float(row["true_ml"]) > 0
    assert result["contours"] == {}


def test_without_a_fit_set_nothing_is_vouched_for(tmp_path, caplog):
    _write(tmp_path / "eval", tmp_path / "labels", {"eval_0": _eval_case(0)})
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        calibrate_probabilities(str(tmp_path / "eval"), str(tmp_path / "labels"), str(tmp_path / "out"))
    record = json.loads((tmp_path / "out" / "contours" / "contours.json").read_text())
    organ = record["classes"]["organ"]
    assert organ["lambda_out"] is None and "no calibration set" in organ["reason"] and "in-sample" in organ["reason"]
    assert record["info"]["in_sample_cases"] == ["eval_0"]
    assert "contours: not vouched for: no calibration set" in caplog.text


def test_the_expected_rate(sets, tmp_path, caplog):
    """``contour_risk="expected"``: each fit case misses 1 of its 13 true voxels once ``l_out`` passes its ``s(a_i)``
    (and has 1 of 13 inner voxels outside while ``l_in`` is at most ``s(b_i)``). Conformal risk control at 0.15 over
    9 cases allows a summed loss of ``0.15 * 10 - 1 = 0.5``: 6 cases, not 7. So ``lambda_out`` is the largest grid
    value at most the 7th smallest ``s(a_i)`` and ``lambda_in`` the smallest above the 3rd smallest ``s(b_i)``."""
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        result = _run(sets, tmp_path / "out", contour_alpha=0.15, contour_risk="expected")
    record = json.loads((tmp_path / "out" / "contours" / "contours.json").read_text())
    organ = record["classes"]["organ"]
    assert record["risk"] == "expected" and organ["rank"] is None
    need_out, need_in = sorted(organ["required_out"]), sorted(organ["required_in"])  # s(a_i), just above s(b_i)
    assert organ["lambda_out"] == pytest.approx(float(GRID[GRID <= np.float32(need_out[6])].max()))
    assert organ["lambda_in"] == pytest.approx(float(GRID[GRID >= np.float32(need_in[2])].min()))
    assert 0 < organ["lambda_out"] < 0.5 < organ["lambda_in"] < 1
    assert result["contours"]["organ"]["cases"] == 3 and "(expected rate)" in caplog.text


def test_contours_off_writes_nothing(sets, tmp_path):
    result = _run(sets, tmp_path / "out", contours=False)
    assert result["contours"] is None and not (tmp_path / "out" / "contours").exists()


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("contour_alpha", 1.5, "--contour_alpha 1.5 is not valid: it must be a number in (0, 1)"),
        ("contour_alpha", 0, "--contour_alpha 0 is not valid"),
        ("contour_epsilon", "x", "--contour_epsilon 'x' is not valid"),
        ("contour_risk", "per-case", "Did you mean 'per_case'?"),
        ("contours", "false", "--contours 'false' is not valid: pass --contours=False"),
    ],
)
def test_bad_options_are_one_line(sets, tmp_path, option, value, words):
    with pytest.raises(ValueError) as err:
        _run(sets, tmp_path / "out", **{option: value})
    assert words in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()  # refused before any file is read


def test_several_structures_one_volume_each_in_the_label_files_order(tmp_path):
    """Three classes: the files are 4D, structure ``c`` in volume ``c - 1`` (Slicer's reader of inferring's files
    reads them), in the label file's voxel order when nnU-Net worked on the RAS-reoriented image (x flipped)."""
    fit, evaluated, labels = tmp_path / "fit", tmp_path / "eval", tmp_path / "labelsTr"
    rng = np.random.default_rng(0)
    for i in range(4):  # noisy peaked probabilities: argmax the label on 80% of the voxels
        label = _random_label((5, 6, 7), 3, seed=20 + i)
        noisy = np.where(rng.random(label.shape) < 0.8, label, (label + 1) % 3)
        prob = 0.7 * _peaked(noisy, 3) + 0.3 * rng.dirichlet(np.ones(3), size=label.shape).transpose(3, 0, 1, 2)
        _save_nnunet(fit, f"fit_{i}", prob.astype(np.float32))
        _save_label(labels, f"fit_{i}", label)
    label = _random_label((5, 6, 7), 3, seed=30)
    affine = np.diag([-1.0, 1.0, 2.0, 1.0])
    reoriented = nib.Nifti1Image(label.astype(np.uint8), affine).as_reoriented(np.array([[0, -1], [1, 1], [2, 1]]))
    props = {"nibabel_stuff": {"original_affine": affine, "reoriented_affine": reoriented.affine}}
    _save_nnunet(evaluated, "eval_r", _peaked(label[::-1], 3), properties=props)
    _save_label(labels, "eval_r", label, affine)
    out = tmp_path / "out"
    calibrate_probabilities(
        str(evaluated), str(labels), str(out), str(fit), str(labels), surface_distances=False, contour_alpha=0.2
    )
    record = json.loads((out / "contours" / "contours.json").read_text())
    assert all(record["classes"][n]["lambda_out"] is not None for n in ("class_1", "class_2"))
    for kind in ("inner", "outer"):
        image = nib.load(str(out / "contours" / f"eval_r_{kind}.nii.gz"))
        assert image.shape == (5, 6, 7, 2) and image.get_data_dtype() == np.uint8
        np.testing.assert_allclose(image.affine, affine)
        stack = contour_stack(image, label.shape, affine, kind)  # (2, x, y, z) in the label file's order
        for c in (1, 2):
            if kind == "outer":
                assert stack[c - 1][label == c].all()  # the prediction (= the label) lies inside the outer contour
            else:
                assert not stack[c - 1][label != c].any()  # the inner one inside the prediction
        temperature = record["info"]["temperature"]
        p = _scaled(_peaked(label, 3), temperature)  # the label file's order
        for c in (1, 2):
            entry = record["classes"][f"class_{c}"]
            pred = label == c
            expected = (
                pred | (p[c] >= np.float32(entry["lambda_out"]))
                if kind == "outer"
                else pred & (p[c] >= np.float32(entry["lambda_in"]))
            )
            np.testing.assert_array_equal(stack[c - 1], expected)
