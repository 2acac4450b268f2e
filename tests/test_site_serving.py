"""The site monitor on the serving path: ``inferring`` feeds ``<output_dir>/site.json`` case by case, and after the
alarm every case's answer says so (its flag, its reasons, ``quality.csv``, the NIfTI header); served again, an image
is not counted twice; ``calib-monai site show|reset``; a state that cannot be used is one ERROR line.

The bundle: nacl_flare trained for one epoch on tiny phantoms, with a temperature of 1 and a hand-made validated range
of 19 volumes that all scored 0.99: every case this tiny network segments ranks 1 by its case score (below all of
them), as a site the network does not know would."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
import torch

from calib_monai.bundle.outputs import SOURCE_META
from calib_monai.data.flare import FLARE22_TO_FLARE
from calib_monai.data.phantoms import generate_phantom
from calib_monai.recalibration import TemperatureScaling
from calib_monai.recalibration.stored import publish_calibration
from calib_monai.review import SITE_FILE, CaseQualityd, SiteMartingale, SiteMonitord, ValidatedRange
from calib_monai.review.site_monitor import ARCHIVE_FOLDER
from calib_monai.review.site_store import CASES_FILE
from conftest import REPO_ROOT, run_bundle_workflow

CONFIGS = REPO_ROOT / "bundles" / "nacl_flare" / "configs"
TINY = {"roi_size": [32, 32, 8], "batch_size": 8, "data#num_phantoms": 6, "data#spacing": [12.0, 12.0, 30.0]}
SCORES = [0.99] * 19


def _cases_to_alarm(m: int = 19) -> int:
    return SiteMartingale(m, ("case_score",)).fewest_cases()


# ------------------------------------------------------------------------------------------ the transform, by hand


def _item(value: float, score: float = 0.2) -> dict:
    image = torch.full((1, 4, 4, 2), value)
    quality = {"case_score": score, "review": {"flag": False, "reasons": [], "rank": 1, "signals": {}}}
    quality["review"]["signals"] = {"case_score": {"value": score, "rank": 1}}
    source = {"weights_sha256": "a" * 64, "validated_range_sha256": "b" * 64}
    segmentation = torch.zeros(1, 4, 4, 2)
    from monai.data import MetaTensor

    return {
        "image": image,
        "quality": quality,
        "calib_monai_source": source,
        "segmentation": MetaTensor(segmentation, meta={SOURCE_META: dict(source)}),
    }


def test_every_case_after_the_alarm_is_flagged_with_it_and_a_repeat_is_not_counted(tmp_path):
    transform = SiteMonitord("quality", tmp_path, CaseQualityd("pred", ValidatedRange(SCORES, {})))
    needed = _cases_to_alarm()
    assert 2 <= needed <= 10
    for i in range(needed - 1):
        out = transform(_item(float(i)))
        assert out["quality"]["review"]["flag"] is False and not out["quality"]["site"]["alarm"]
    again = transform(_item(0.0))  # the first image once more: not counted, the stream unchanged
    assert again["quality"]["site"]["counted"] is False and again["quality"]["site"]["cases"] == needed - 1
    alarmed = transform(_item(float(needed)))
    site, review = alarmed["quality"]["site"], alarmed["quality"]["review"]
    assert site["alarm"] and site["cases"] == needed and site["evidence"]["signal_that_moved"] == "case_score"
    assert review["flag"] is True and review["reasons"][0] == site["message"]
    assert "not vouched for at this site" in site["message"] and "calib-monai site reset" in site["message"]
    assert alarmed["quality"]["source"]["site_alarm"] is True
    assert alarmed["segmentation"].meta[SOURCE_META]["site_alarm"] is True
    later = transform(_item(0.0))  # an ordinary, already seen image after the alarm: flagged too
    assert later["quality"]["review"]["flag"] is True and later["quality"]["site"]["counted"] is False


def test_a_case_without_a_range_is_not_counted_and_says_why(tmp_path):
    transform = SiteMonitord("quality", tmp_path, CaseQualityd("pred", None))
    out = transform(_item(1.0))
    assert out["quality"]["site"] == {
        "monitored": False,
        "why": "no validated range is applied to these outputs (run calibrate)",
    }
    assert not (tmp_path / SITE_FILE).exists()
    off = SiteMonitord("quality", "", CaseQualityd("pred", ValidatedRange(SCORES, {})))(_item(1.0))
    assert off["quality"]["site"]["why"] == "no site folder (site_dir) was given"


# ---------------------------------------------------------------------------------------------- through inferring


@pytest.fixture(scope="module")
def site_bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    models = root / "models"
    run_bundle_workflow(
        CONFIGS,
        ["train.json"],
        "run",
        epochs=1,
        output_dir=str(models),
        **TINY,
        **{"data#cache_dir": str(root / "phantoms")},
    )
    publish_calibration(
        TemperatureScaling(1.0), models / "calibration.pt", models / "model.pt", ValidatedRange(SCORES, {})
    )
    images = root / "site_images"
    images.mkdir()
    for i in range(_cases_to_alarm() + 2):
        image, _, affine = generate_phantom(seed=40, index=i, shape=(40, 36, 10), spacing=(4.0, 4.0, 10.0))
        nib.save(nib.Nifti1Image(image, affine), str(images / f"site_{i:02d}.nii.gz"))
    return root


def _infer(root, out, **overrides):
    settings = {k: v for k, v in TINY.items()}
    run_bundle_workflow(
        CONFIGS,
        ["train.json", "inference.json"],
        "inferring",
        **settings,
        model_path=str(root / "models" / "model.pt"),
        dataset_dir=str(root / "site_images"),
        output_dir=str(out),
        **overrides,
    )


def _messages(err: BaseException) -> str:
    """The messages of an exception and its causes (the bundle runner wraps a transform's error)."""
    out = []
    while err is not None:
        out.append(str(err))
        err = err.__cause__ or err.__context__
    return " | ".join(out)


def _command(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "calib_monai.cli", *args], capture_output=True, text=True, timeout=120)


def test_inferring_alarms_at_a_site_and_every_answer_after_says_so(site_bundle, tmp_path):
    out = tmp_path / "out"
    _infer(site_bundle, out)
    needed, total = _cases_to_alarm(), _cases_to_alarm() + 2
    with open(out / "quality.csv") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: r["case"])
    assert len(rows) == total
    for i, row in enumerate(rows):
        quality = json.loads((out / f"{row['case']}_quality.json").read_text())
        assert quality["site"]["cases"] == i + 1 and quality["site"]["alarm"] == (i + 1 >= needed)
        if i + 1 >= needed:
            assert row["review"] == "yes" and row["reasons"].startswith("site alarm (")
            assert quality["review"]["reasons"][0].startswith("site alarm (")
            header = nib.load(str(out / f"{row['case']}_seg.nii.gz")).header
            assert header["descrip"].tobytes().decode().rstrip("\x00").endswith(" site=ALARM")
    # served again: nothing counted twice, the alarm stays
    _infer(site_bundle, out)
    shown = _command("site", "show", str(out))
    assert (
        shown.returncode == 0 and f"cases:          {total}" in shown.stdout and "alarm:          true" in shown.stdout
    )
    cleared = _command("site", "reset", str(out))
    assert cleared.returncode == 0 and f"cleared_cases: {total}" in cleared.stdout
    assert not (out / SITE_FILE).exists() and not (out / CASES_FILE).exists()


def test_a_corrupt_state_is_one_error_line_and_another_models_is_archived(site_bundle, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / SITE_FILE).write_text("{not json")
    with pytest.raises(Exception) as info:
        _infer(site_bundle, out)
    assert f"site state {out / SITE_FILE} is corrupt" in _messages(info.value)
    assert f"calib-monai site reset {out}" in _messages(info.value)
    shutil.rmtree(out)
    _infer(site_bundle, out)
    state = json.loads((out / SITE_FILE).read_text())
    logged = [json.loads(line) for line in (out / CASES_FILE).read_text().splitlines()]
    state["weights_sha256"] = "0" * 64  # a record of other weights (a model trained since): archived, a new one starts
    (out / SITE_FILE).write_text(json.dumps(state))
    _infer(site_bundle, out)
    archived = json.loads((out / ARCHIVE_FOLDER / f"site_{'0' * 12}_{state['range_sha256'][:12]}.json").read_text())
    assert archived == {**state, "case_log": logged} and len(logged) == state["cases"] > 0
    assert json.loads((out / SITE_FILE).read_text())["cases"] == state["cases"]  # the same images, anew


def test_site_labels_from_a_folder_re_anchor_what_inferring_serves_next(site_bundle, tmp_path):
    out, labels = tmp_path / "out", tmp_path / "labels"
    _infer(site_bundle, out)
    labels.mkdir()
    for i in range(2):
        image, label, affine = generate_phantom(seed=40, index=i, shape=(40, 36, 10), spacing=(4.0, 4.0, 10.0))
        raw = labels / f"site_{i:02d}.nii.gz"
        if i == 0:  # in FLARE22's values first: refused, naming the file and the values it needs
            nib.save(nib.Nifti1Image(label.astype("uint8"), affine), str(raw))
            refused = _command("site", "label", str(out), str(labels))
            assert refused.returncode == 2 and f"{raw}: the label holds the value 13" in refused.stderr
        mapped = np.vectorize(FLARE22_TO_FLARE.get)(label).astype("uint8")  # the bundle's values, as delivered
        nib.save(nib.Nifti1Image(mapped, affine), str(raw))
    added = _command("site", "label", str(out), str(labels))
    assert added.returncode == 0, added.stderr
    state = json.loads((out / SITE_FILE).read_text())
    errors = []
    for entry in state["labels"]:  # the truth worked out here: each foreground class's DSC, present ones averaged
        seg = nib.load(str(out / f"{entry['case']}_seg.nii.gz")).get_fdata()
        label = nib.load(str(labels / f"{entry['case']}.nii.gz")).get_fdata()
        dice = [
            2 * ((seg == c) & (label == c)).sum() / ((seg == c).sum() + (label == c).sum())
            for c in range(1, 5)
            if (label == c).any()
        ]
        assert entry["truth"] == pytest.approx(sum(dice) / len(dice), abs=1e-6)
        served = json.loads((out / f"{entry['case']}_quality.json").read_text())
        assert entry["score"] == pytest.approx(served["case_score"])  # the raw score it was served with
        errors.append(entry["score"] - entry["truth"])
    assert [e["case"] for e in state["labels"]] == ["site_00", "site_01"]
    _infer(site_bundle, out)  # served again: every answer re-anchored from the two labels
    again = json.loads((out / "site_03_quality.json").read_text())
    assert again["level"]["offset"] == pytest.approx(-sum(errors) / 2)
    assert again["case_score"] == pytest.approx(max(0.0, again["level"]["raw_case_score"] - sum(errors) / 2))
    missing = _command("site", "label", str(out), str(tmp_path))
    assert missing.returncode == 2 and "no label in" in missing.stderr
