"""The case-quality study through the serving path: its figures from hand-made records, its shifted images, and one
real run on phantoms (train, the bundle's own calibrate, TrainedBundle on inference.json) whose served answers equal
what ``monai.bundle run inferring`` writes for the same image."""

from __future__ import annotations

import csv
import gzip
import json
import math
import subprocess

import nibabel as nib
import numpy as np
import pytest

from conftest import REPO_ROOT, SMALL_DEMO, bundle_command
from studies import StudySetup
from studies.quality import quality_study, shifted_items
from studies.quality_report import ID, condition_rows, verdict_lines


def _record(case, condition, dice, est, flag, strength=""):
    return {
        "seed": 0,
        "method": "m",
        "condition": condition,
        "strength": strength,
        "case": case,
        "mean_dice": dice,
        "est_mean_dice": est,
        "flag": flag,
        "seconds": 0.5,
        "volume_covered": 1.0 if case != "d" else 0.5,
        "mean_confidence": 1 - est,  # the reverse order of the estimate
        "reasons": "image unlike the training images (...)" if flag == 1.0 else "",
    }


NO_SCORE = {"review_score_check": False}


def test_condition_figures_by_hand():
    nan = float("nan")
    records = [
        _record("a", ID, 0.9, 0.85, 0.0),
        _record("b", ID, 0.8, 0.82, 0.0),
        _record("c", ID, 0.7, 0.75, 1.0),
        _record("d", ID, 0.6, 0.50, nan),  # cannot judge: neither flagged nor silent
        _record("a", "gamma", 0.5, 0.8, 0.0, "strong"),
        _record("b", "gamma", 0.4, 0.6, 1.0, "strong"),
        _record("c", "gamma", 0.3, 0.35, 0.0, "strong"),
    ]
    rows = {(r["condition"], r["strength"]): r for r in condition_rows(records)}
    ident, gamma = rows[(ID, "")], rows[("gamma", "strong")]
    assert (ident["volumes"], ident["flagged"], ident["cannot_judge"], ident["flag_rate"]) == (4, 1, 1, 0.25)
    # estimates 0.85, 0.82, 0.75, 0.50 against 0.9, 0.8, 0.7, 0.6: the same order; errors -.05, .02, .05, -.1
    assert ident["spearman"] == pytest.approx(1.0) and ident["mae"] == pytest.approx(0.055)
    assert ident["signed_error"] == pytest.approx(-0.02) and ident["aurc_gap"] == pytest.approx(1.0)
    # not flagged: a and b, errors -0.05 and +0.02
    assert ident["signed_error_unflagged"] == pytest.approx(-0.015)
    assert ident["volume_coverage"] == pytest.approx(0.875) and ident["seconds"] == pytest.approx(0.5)
    # the flag came from the input signal; the mean confidence here ranks the cases exactly the wrong way round: it
    # opens the gap by as much as the oracle closes it
    assert (ident["by_input"], ident["by_case_score"], ident["by_features"]) == (1, 0, 0)
    assert ident["spearman_confidence"] == pytest.approx(-1.0) and ident["aurc_gap_confidence"] == pytest.approx(-1.0)
    # under the shift: +0.3, +0.2, +0.05; the silent ones a and c: (+0.3 + 0.05) / 2
    assert gamma["flag_rate"] == pytest.approx(1 / 3) and gamma["signed_error"] == pytest.approx(0.55 / 3)
    assert gamma["signed_error_unflagged"] == pytest.approx(0.175) and "volume_coverage" not in gamma
    assert gamma["true_dice"] == pytest.approx(0.4) and gamma["est_dice"] == pytest.approx(1.75 / 3)


def test_shifted_images_are_written_once_beside_the_originals(tmp_path):
    rng = np.random.default_rng(0)
    affine = np.diag([1.5, 1.5, 4.0, 1.0])
    items = []
    for i in range(2):
        path = tmp_path / f"case{i}.nii.gz"
        nib.save(nib.Nifti1Image(rng.random((8, 8, 10)).astype(np.float32), affine), path)
        items.append({"image": str(path), "label": f"label{i}.nii.gz"})
    shifted = shifted_items(items, "resolution", "strong", tmp_path / "shifted")
    assert [s["label"] for s in shifted] == ["label0.nii.gz", "label1.nii.gz"]
    image = nib.load(shifted[0]["image"])
    original = np.asarray(nib.load(items[0]["image"]).dataobj)
    data = np.asarray(image.dataobj)
    assert data.shape == original.shape and np.allclose(image.affine, affine)
    # a 5x thicker slice: two slices along the last axis, linearly interpolated back: smoother along it
    assert np.abs(np.diff(data, axis=2)).mean() < 0.5 * np.abs(np.diff(original, axis=2)).mean()
    # written once: a second call reuses the file (no rewrite), and no partial file is left
    stamp = (tmp_path / "shifted" / "case0.nii.gz").stat().st_mtime_ns
    shifted_items(items, "resolution", "strong", tmp_path / "shifted")
    assert (tmp_path / "shifted" / "case0.nii.gz").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in (tmp_path / "shifted").iterdir()) == ["case0.nii.gz", "case1.nii.gz"]
    with pytest.raises(ValueError, match="one image file per case"):
        shifted_items([{"image": ["a.nii.gz", "b.nii.gz"]}], "gamma", "mild", tmp_path / "x")


def test_quality_study_end_to_end_through_the_served_chain(tmp_path):
    setup = StudySetup(
        "flare",
        demo=True,
        overrides=SMALL_DEMO,
        epochs=2,
        results_dir=str(tmp_path / "results"),
        runs_dir=str(tmp_path / "runs"),
        split_seed=0,
    )
    quality_study(setup, ["ce_dice"], seeds=[0], shifts=["gamma"], strengths=["strong"])
    out = tmp_path / "results" / "quality"
    with gzip.open(out / "per_volume.csv.gz", "rt", newline="") as f:
        volumes = list(csv.DictReader(f))
    test = [v for v in volumes if v["condition"] == ID]
    assert len(volumes) == 2 * len(test) and len(test) >= 2  # the test phantoms, as they are and shifted
    rule = list(csv.DictReader(open(out / "rule.csv")))
    assert len(rule) == 1 and rule[0]["method"] == "ce_dice" and float(rule[0]["bound"]) >= 0
    # the run's own calibrate published the served set; inferring on one test image writes the same answer
    run = tmp_path / "runs" / "seed0" / "ce_dice_flare"
    models = run / "models"
    assert (models / "validated_range.json").is_file() and (models / "manifest.json").is_file()
    datalist = json.loads((models / "datalist.json").read_text())
    image = datalist["test"][0]["image"]
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "case.nii.gz").symlink_to(image)
    config = [str(REPO_ROOT / "bundles" / "ce_dice_flare" / "configs" / "inference.json")]
    overrides = {"dataset_dir": str(folder), "model_path": str(models / "model.pt"), "output_dir": str(tmp_path / "o")}
    subprocess.run(bundle_command("inferring", config, {**overrides, "device": "cpu"}), check=True, cwd=REPO_ROOT)
    served = json.loads((tmp_path / "o" / "case_quality.json").read_text())
    (mine,) = [v for v in test if v["case"] == image.split("/")[-1].split(".")[0]]
    assert float(mine["est_mean_dice"]) == pytest.approx(served["case_score"], abs=1e-9)
    flag = served["review"]["flag"]
    assert (math.isnan(float(mine["flag"])) and flag is None) or float(mine["flag"]) == float(bool(flag))
    assert mine["reasons"] == "; ".join(served["review"]["reasons"])
    readme = (out / "README.md").read_text()
    assert "Against issue 29's targets" in readme and "data split of seed 0" in readme
    # calibrate's own settings: a range made with others is made again, then reused while they stay
    quality_study(setup, ["ce_dice"], [0], shifts=["gamma"], strengths=["strong"], calibrate_settings=NO_SCORE)
    runs = [line for line in (run / "calibrate.log").read_text().splitlines() if line.startswith("$ ")]
    assert len(runs) == 2 and runs[-1].endswith("--review_score_check False")
    assert json.loads((models / "validated_range.json").read_text())["signals"] == ["input", "features"]
    assert json.loads((run / "calibrated.json").read_text()) == {"settings": NO_SCORE}
    quality_study(setup, ["ce_dice"], [0], shifts=["gamma"], strengths=["strong"], calibrate_settings=NO_SCORE)
    assert (run / "calibrate.log").read_text().count("\n$ ") == 2


def test_the_verdict_against_the_targets_by_hand():
    nan = float("nan")
    records = [_record(c, ID, 0.8, 0.8, f) for c, f in zip("abcd", (0.0, 0.0, 1.0, nan))]
    records += [_record(c, "gamma", 0.5, 0.8, 0.0, "strong") for c in "abc"]  # +0.3, nothing flagged
    lines = verdict_lines(condition_rows(records), [{"method": "m", "seed": 0, "bound": 0.25}], "acdc")
    # 1 of 4 at a stated bound of 25%: P(X >= 1) = 1 - 0.75^4 = 0.68; 25% is within the bound but above 5%
    assert lines[0] == (
        "- **m**: ordinary cases flagged 1 of 4 (25.0%; seeds 1/4) against the stated bound 25.0% "
        "(P(at least 1 | bound) = 0.68; target: within it and at most 5%): **missed**"
    )
    # two frames of patient p1 flagged, p2 and p3 not: the bound counts subjects, 1 of 3 at 40%:
    # P(X >= 1) = 1 - 0.6^3 = 0.78
    dice = (0.3, 0.5, 0.8, 0.9)  # p1's two frames were the poor segmentations: flagged 0.4 on average, the rest 0.85
    paired = [
        {**_record(c, ID, d, 0.8, f), "subject": s}
        for c, d, f, s in zip("abcd", dice, (1, 1, 0, 0), "p1 p1 p2 p3".split())
    ]
    (row,) = condition_rows(paired)
    assert (row["subjects"], row["subjects_flagged"], row["subject_flag_rate"]) == (3, 1, pytest.approx(1 / 3))
    assert row["true_dice_flagged"] == pytest.approx(0.4) and row["true_dice_unflagged"] == pytest.approx(0.85)
    line = verdict_lines([row], [{"method": "m", "seed": 0, "bound": 0.4}], "acdc")[0]
    assert line == (
        "- **m**: ordinary cases flagged 2 of 4 (50.0%; seeds 2/4); subjects with a flag 1 of 3 (33.3%; seeds 1/3) "
        "against the stated bound 40.0% (P(at least 1 | bound) = 0.78; target: within it and at most 5%): **missed**"
    )
    assert "gamma (strong): flagged at least 0%, mean estimate off by at most 0.300: **missed**" in lines[1]
    assert lines[2] == "  - largest mean optimism without a flag under a shift: +0.300: **missed**"
