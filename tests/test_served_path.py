"""One path: every bundle validates and evaluates the images exactly as it serves them (the inference chain plus the
label's own steps), and evaluating scores each case with the transform inferring runs."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from bundle_factory import DATASETS, render_bundle
from calib_monai.data.preprocessing import image_only
from calib_monai.metrics import SegmentationReportTable


def _label_only(step: dict) -> bool:
    """The label's checks and value mapping: they change no image."""
    return step["_target_"].endswith("ValidateSegmentationd") or step.get("keys") in ("label", ["label"])


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_the_scored_volumes_go_through_the_served_chain(name):
    files = render_bundle(f"nacl_{name}")
    train, evaluate = json.loads(files["configs/train.json"]), json.loads(files["configs/evaluate.json"])
    inference = json.loads(files["configs/inference.json"])
    assert train["validate"]["preprocessing"]["transforms"] == "%train#deterministic_transforms"  # a copy of them
    scored = train["train"]["deterministic_transforms"]
    # less the label's own steps (its checks and value mapping), the image sees the inference chain, step for step
    assert [image_only(t) for t in scored if not _label_only(t)] == inference["preprocessing"]["transforms"]
    assert "ResizeWithPadOrCropd" not in [t["_target_"] for t in scored]
    assert train["validate"]["dataloader"]["batch_size"] == 1  # whole volumes of any size, one at a time
    # evaluating runs inference's CaseQualityd on the calibrated softmax, against the range next to model.pt
    assert evaluate["case_quality"]["_target_"] == inference["case_quality"]["_target_"]
    assert {k: v for k, v in evaluate["case_quality"].items() if k not in ("keys", "weights")} == {
        k: v for k, v in inference["case_quality"].items() if k not in ("keys", "weights")
    }
    assert "@case_quality" in evaluate["validate#postprocessing"]["transforms"]
    assert evaluate["validated_range_path"] == "$@output_dir + '/validated_range.json'"


def test_the_report_writes_the_flag_beside_the_true_dice(tmp_path):
    """Three hand-made volumes (a 2 x 2 square of class 1): predicted exactly (DSC 1), with 2 voxels too many
    (2 * 4 / (4 + 6) = 0.8) and half of it (2 * 2 / (2 + 4) = 2 / 3); flagged, passed and not judged."""
    label = torch.zeros(1, 4, 4, 1)
    label[0, 1:3, 1:3] = 1
    predicted = [label[0].clone(), label[0].clone(), label[0].clone()]
    predicted[1][0, 0:2] = 1  # two voxels outside the square
    predicted[2][2, 1:3] = 0  # half the square
    reviews = [
        {"flag": True, "reasons": ["estimated mean DSC 0.100 is below"], "bound": 0.1, "alpha": 0.05},
        {"flag": False, "reasons": [], "bound": 0.1, "alpha": 0.05},
        {"flag": None, "reasons": ["cannot judge: no validated range"]},
    ]
    table = SegmentationReportTable({"0": "background", "1": "a"}, surface_distances=False)
    for i, (fg, review) in enumerate(zip(predicted, reviews)):
        prob = torch.stack([1 - 0.9 * fg, 0.9 * fg])
        table.add(prob, label, case=f"v{i}", review=review)
    table.write(tmp_path)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["mean_dice"]) for r in rows] == [pytest.approx(1.0), pytest.approx(0.8), pytest.approx(2 / 3)]
    assert [r["review_flag"] for r in rows] == ["yes", "no", ""]
    assert [r["review_reasons"] for r in rows] == [reviews[0]["reasons"][0], "", reviews[2]["reasons"][0]]
    review = json.loads((tmp_path / "summary.json").read_text())["review"]
    assert review["flagged"] == {"volumes": 1, "mean_dice": pytest.approx(1.0)}
    assert review["passed"] == {"volumes": 1, "mean_dice": pytest.approx(0.8)}
    assert review["not_judged"] == {"volumes": 1, "mean_dice": pytest.approx(2 / 3)}
    assert review["bound"] == 0.1
    # a table without verdicts (the studies') has no review columns
    plain = SegmentationReportTable({"0": "background", "1": "a"}, surface_distances=False)
    assert "review_flag" not in plain.add(torch.stack([1 - 0.9 * label[0], 0.9 * label[0]]), label)
    assert "review_flag" not in plain.rows[0] and plain.review_summary() == {}
