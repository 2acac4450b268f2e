"""SegmentationReport on a real Ignite engine: per-volume rows, summary and diagram agree with direct computation."""

from __future__ import annotations

import csv
import json
import logging

import numpy as np
import pytest
import torch
from ignite.engine import Engine
from monai.data import MetaTensor

from calib_monai.handlers import SegmentationReport
from calib_monai.metrics import SegmentationReportTable, cece, ece, tace
from calib_monai.metrics.report_table import case_name, voxel_spacing


def _add(table: SegmentationReportTable, vol: dict) -> dict:
    """One volume into the table, as the harness adds it (spacing from the image affine, name from its meta)."""
    return table.add(
        vol["prob"], vol["label"], pred=vol["pred"], spacing=voxel_spacing(vol), case=case_name(vol, len(table))
    )


def _volume(seed: int, spacing: float) -> dict:
    """A (3, 8, 8, 4) probability volume, its one-hot prediction and the label map; image affine of ``spacing`` mm."""
    g = torch.Generator().manual_seed(seed)
    label = torch.zeros(1, 8, 8, 4, dtype=torch.int64)
    label[:, 2:6, 2:6] = 1
    label[:, 3:5, 3:5, 1:3] = 2
    logits = 3 * torch.nn.functional.one_hot(label[0], 3).permute(3, 0, 1, 2).float() + torch.randn(
        3, 8, 8, 4, generator=g
    )
    prob = logits.softmax(0)
    pred = torch.nn.functional.one_hot(prob.argmax(0), 3).permute(3, 0, 1, 2).float()
    image = MetaTensor(
        torch.rand(1, 8, 8, 4),
        affine=torch.diag(torch.tensor([spacing, spacing, spacing, 1.0])),
        meta={"filename_or_obj": f"/data/case_{seed}.nii.gz"},
    )
    return {"image": image, "prob": prob, "pred": pred, "label": label}


def test_report_rows_match_direct_metrics(tmp_path):
    volumes = [_volume(0, 1.0), _volume(1, 2.0), _volume(2, 1.0)]
    engine = Engine(lambda e, batch: batch)
    report = SegmentationReport(tmp_path, {"0": "background", "1": "outer", "2": "inner"})
    report.attach(engine)
    engine.run([[volumes[0], volumes[1]], [volumes[2]]], max_epochs=1)  # batches are lists of volumes, as decollated

    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["case"] for r in rows] == ["case_0.nii.gz", "case_1.nii.gz", "case_2.nii.gz"]
    for row, vol in zip(rows, volumes):
        prob, label = vol["prob"][None], vol["label"][None]
        assert float(row["ece"]) == pytest.approx(ece(prob, label))
        assert float(row["cece"]) == pytest.approx(cece(prob, label))
        assert float(row["tace_union"]) == pytest.approx(tace(prob, label, foreground="union"))
        # DSC of the argmax, by hand: 2|P & G| / (|P| + |G|) for class 1
        p, g = vol["pred"][1].bool(), vol["label"][0] == 1
        assert float(row["dice_outer"]) == pytest.approx(
            2 * (p & g).sum().item() / (p.sum() + g.sum()).item(), rel=1e-5
        )
    assert {"hd95_outer", "asd_inner", "mean_hd95", "nll", "brier", "ece_union"} <= set(rows[0])

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["settings"]["volumes"] == 3
    assert summary["metrics"]["ece"]["mean"] == pytest.approx(np.mean([float(r["ece"]) for r in rows]))
    assert (tmp_path / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_distances_are_in_mm_from_the_affine(tmp_path):
    one, two = _volume(0, 1.0), _volume(0, 2.0)  # same arrays, spacing 1 mm and 2 mm
    report = SegmentationReportTable({"0": "background", "1": "outer", "2": "inner"})
    row1, row2 = _add(report, one), _add(report, two)
    assert row2["dice_outer"] == row1["dice_outer"]
    assert row2["hd95_outer"] == pytest.approx(2 * row1["hd95_outer"])
    assert row2["asd_inner"] == pytest.approx(2 * row1["asd_inner"])


def test_empty_run_writes_nothing_and_says_so(tmp_path, caplog):
    report = SegmentationReportTable({"0": "background", "1": "a"})
    report.write(tmp_path / "out")
    assert not (tmp_path / "out" / "metrics.csv").exists()
    assert "no volumes were evaluated" in caplog.text


def test_regions_are_scored_as_binary_unions_of_classes(tmp_path):
    vol = _volume(0, 1.0)
    report = SegmentationReportTable(
        {"0": "background", "1": "outer", "2": "inner"}, regions={"core": [2], "whole": [1, 2]}
    )
    row = _add(report, vol)
    # "core" is class 2 alone: the same DSC as the per-class column
    assert row["dice_core"] == pytest.approx(row["dice_inner"])
    # "whole" is classes 1 and 2 together, by hand
    p, g = vol["pred"][1:].sum(0).bool(), vol["label"][0] > 0
    assert row["dice_whole"] == pytest.approx(2 * (p & g).sum().item() / (p.sum() + g.sum()).item(), rel=1e-5)


def test_summary_names_its_reductions_and_the_log_says_mean_over_volumes(tmp_path, caplog):
    volumes = [_volume(0, 1.0), _volume(1, 2.0)]
    engine = Engine(lambda e, batch: batch)
    report = SegmentationReport(tmp_path, {"0": "background", "1": "outer", "2": "inner"}, surface_distances=False)
    report.attach(engine)
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        engine.run([volumes], max_epochs=1)
    assert "mean over 2 volumes" in caplog.text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["settings"]["reduction"] == "mean over volumes"
    assert set(summary["pooled"]) == {"pooled_ece", "pooled_cece", "pooled_nll", "pooled_brier"}
    probs, labels = torch.stack([v["prob"] for v in volumes]), torch.stack([v["label"] for v in volumes])
    assert summary["pooled"]["pooled_ece"] == pytest.approx(ece(probs, labels), rel=1e-12)  # ece() pools volumes
    assert summary["pooled"]["pooled_cece"] == pytest.approx(cece(probs, labels), rel=1e-12)
