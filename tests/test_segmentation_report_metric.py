"""SegmentationReportMetric, its handler and its saver: the same rows and files as the SegmentationReport handler.

The reference rows are built here from the public functions (``segmentation_metrics_per_volume``,
``calibration_errors``), the definition the report has always had; the saver's files are compared byte for byte
with the ones ``SegmentationReport`` writes for the same volumes by hand (the experiment harness's path).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import warnings

import numpy as np
import pytest
import torch
from ignite.engine import Engine, Events
from monai.data import MetaTensor

from calib_monai.handlers import SegmentationReport, SegmentationReportMetricHandler, SegmentationReportSaver
from calib_monai.metrics import (
    SegmentationReportMetric,
    SegmentationReportTable,
    calibration_errors,
    cece_all,
    ml1ace,
    segmentation_metrics_per_volume,
)
from calib_monai.metrics.report_table import case_name, voxel_spacing

NAMES = {"0": "background", "1": "outer", "2": "inner"}
REGIONS = {"core": [2], "whole": [1, 2]}


def _volume(seed: int, spacing: float) -> dict:
    """A (3, 8, 8, 4) probability volume, its one-hot prediction and the label map (as in test_report_handler)."""
    g = torch.Generator().manual_seed(seed)
    label = torch.zeros(1, 8, 8, 4, dtype=torch.int64)
    label[:, 2:6, 2:6] = 1
    label[:, 3:5, 3:5, 1:3] = 2
    noise = torch.randn(3, 8, 8, 4, generator=g)
    logits = 3 * torch.nn.functional.one_hot(label[0], 3).permute(3, 0, 1, 2).float() + noise
    prob = logits.softmax(0)
    pred = torch.nn.functional.one_hot(prob.argmax(0), 3).permute(3, 0, 1, 2).float()
    image = MetaTensor(
        torch.rand(1, 8, 8, 4),
        affine=torch.diag(torch.tensor([spacing, spacing, spacing, 1.0])),
        meta={"filename_or_obj": f"/data/case_{seed}.nii.gz"},
    )
    return {"image": image, "prob": prob, "pred": pred, "label": label}


def _volumes() -> list[dict]:
    vols = [_volume(0, 1.0), _volume(1, 2.0), _volume(2, 1.0)]
    no_inner = _volume(3, 1.5)
    no_inner["label"][no_inner["label"] == 2] = 1  # class 2 absent from the ground truth: NaN columns
    empty = _volume(4, 1.0)
    empty["label"][:] = 0  # no foreground at all: NaN calibration, zero bins
    return vols + [no_inner, empty]


def _reference_row(vol: dict, regions: dict | None = None) -> dict[str, float]:
    """The report's row by its definition: MONAI's DSC / HD95 / ASD on the prediction, the calibration functions."""
    prob, label, pred = vol["prob"][None], vol["label"][None], vol["pred"][None]
    spacing = [float(v) for v in torch.linalg.norm(vol["image"].affine[:3, :3].double(), dim=0)]
    row: dict[str, float] = {}
    for metric, values in segmentation_metrics_per_volume(pred, label, num_classes=3, spacing=spacing).items():
        row.update({f"{metric}_{name}": float(v) for name, v in zip(("outer", "inner"), values[0])})
        row[f"mean_{metric}"] = float(np.nanmean(values[0])) if np.isfinite(values[0]).any() else math.nan
    for region, classes in (regions or {}).items():
        binary = [torch.isin(m, torch.tensor(classes)).long() for m in (pred.argmax(1, keepdim=True), label)]
        seg = segmentation_metrics_per_volume(*binary, num_classes=2, spacing=spacing)
        row.update({f"{metric}_{region}": float(values[0, 0]) for metric, values in seg.items()})
    with warnings.catch_warnings():  # the volume without foreground warns (tested below)
        warnings.simplefilter("ignore")
        gt = calibration_errors(prob, label, ("ece", "cece", "tace", "ml1ace", "nll", "brier"))
    union = calibration_errors(prob, label, ("ece", "cece", "tace", "ml1ace"), foreground="union")
    row.update({c: gt[c] for c in ("ece", "cece", "tace")})
    row.update({f"{c}_union": union[c] for c in ("ece", "cece", "tace")})
    row["ml1ace_gt"], row["ml1ace_gt_union"] = gt["ml1ace"], union["ml1ace"]  # the formula on those voxels
    row["ml1ace"], row["cece_all"] = ml1ace(prob, label), cece_all(prob, label)  # the papers' definitions
    row["nll"], row["brier"] = gt["nll"], gt["brier"]
    row.update(_reference_quality(vol, spacing))
    return row


def _reference_quality(vol: dict, spacing: list[float], radius: int = 3, threshold: float = 0.8) -> dict[str, float]:
    """The label-free columns by their definitions, in NumPy float64 (scipy's dilation for the band)."""
    from scipy.ndimage import binary_dilation

    p = vol["prob"].double().numpy()
    pred = vol["pred"].argmax(0).numpy()
    y = vol["label"][0].numpy()
    ml = float(np.prod(spacing)) / 1000.0
    row: dict[str, float] = {}
    for k, name in ((1, "outer"), (2, "inner")):
        mine = pred == k
        row[f"est_dice_{name}"] = 2 * p[k][mine].sum() / (mine.sum() + p[k].sum())
        row[f"volume_{name}"] = (y == k).sum() * ml
        row[f"volume_pred_{name}"] = mine.sum() * ml
        row[f"volume_prob_{name}"] = p[k].sum() * ml
        half = 1.959963984540054 * np.sqrt((p[k] * (1 - p[k])).sum())
        row[f"volume_prob_low_{name}"] = max(p[k].sum() - half, 0) * ml
        row[f"volume_prob_high_{name}"] = (p[k].sum() + half) * ml
        row[f"low_conf_{name}"] = (p.max(0)[mine] < threshold).mean() if mine.any() else math.nan
    row["est_mean_dice"] = (row["est_dice_outer"] + row["est_dice_inner"]) / 2
    row["ece_all"] = calibration_errors(vol["prob"][None], vol["label"][None], ("ece",), foreground="all")["ece"]
    band = binary_dilation((pred > 0) | (y > 0), np.ones((2 * radius + 1,) * 3))
    inside = torch.from_numpy(band.reshape(-1))
    row["ece_band"] = calibration_errors(
        vol["prob"].reshape(3, -1)[:, inside][None], vol["label"].reshape(-1)[inside][None], ("ece",), foreground="all"
    )["ece"]
    return row


def _run(vols: list[dict], *handlers) -> Engine:
    engine = Engine(lambda e, batch: batch)
    for handler in handlers:
        if isinstance(handler, SegmentationReportMetricHandler):
            handler.attach(engine, "report")
        else:
            handler.attach(engine)
    with pytest.warns(UserWarning, match="no foreground voxels"):  # the volume without foreground says so
        engine.run([vols[:2], vols[2:]], max_epochs=1)  # batches are lists of volumes, as decollated
    return engine


def test_metric_table_equals_the_report_rows():
    vols = _volumes()
    metric = SegmentationReportMetric(NAMES, regions=REGIONS)
    assert metric.columns[:4] == ("dice_outer", "dice_inner", "mean_dice", "hd95_outer")
    assert {"dice_core", "asd_whole", "tace_union", "ml1ace", "ml1ace_gt_union", "cece_all", "nll", "brier"} <= set(
        metric.columns
    )
    spacings = [[float(v) for v in torch.linalg.norm(v["image"].affine[:3, :3].double(), dim=0)] for v in vols]
    with pytest.warns(UserWarning):
        metric([v["prob"] for v in vols], [v["label"] for v in vols], pred=[v["pred"] for v in vols], spacing=spacings)
    table = metric.aggregate()
    assert table.shape == (len(vols), len(metric.columns)) and table.dtype == torch.float64
    report = SegmentationReportTable(NAMES, regions=REGIONS)
    with pytest.warns(UserWarning):
        rows = [
            report.add(v["prob"], v["label"], v["pred"], voxel_spacing(v), case_name(v, i)) for i, v in enumerate(vols)
        ]
    for values, row, vol in zip(table.tolist(), rows, vols):
        reference = _reference_row(vol, REGIONS)
        # the metric's columns after the case, then only the report table's review columns (report_table.py)
        columns = list(row)[1:]
        assert columns[: len(metric.columns)] == list(metric.columns) and set(reference) == set(metric.columns)
        assert all(c.startswith("review_") for c in columns[len(metric.columns) :])
        for column, value in zip(metric.columns, values):
            assert value == pytest.approx(reference[column], rel=1e-12, nan_ok=True), column
            assert value == pytest.approx(row[column], rel=0, abs=0, nan_ok=True), column  # the very same numbers
    assert math.isnan(table[3, metric.columns.index("dice_inner")])  # absent class: NaN
    assert math.isnan(table[4, metric.columns.index("ece")])  # no foreground: NaN
    # a batch-first tensor with one spacing for all volumes gives the rows of the list form
    batch = SegmentationReportMetric(NAMES)
    batch(
        torch.stack([v["prob"] for v in vols[:3]]),
        torch.stack([v["label"] for v in vols[:3]]),
        pred=torch.stack([v["pred"] for v in vols[:3]]),
        spacing=[1.0, 1.0, 1.0],
    )
    listed = SegmentationReportMetric(NAMES)
    listed(
        [v["prob"] for v in vols[:3]],
        [v["label"] for v in vols[:3]],
        pred=[v["pred"] for v in vols[:3]],
        spacing=[[1.0, 1.0, 1.0]] * 3,
    )
    torch.testing.assert_close(batch.aggregate(), listed.aggregate(), equal_nan=True)


def test_saver_files_equal_the_report_written_by_hand(tmp_path, caplog):
    vols = _volumes()
    handler = SegmentationReportMetricHandler(label_names=NAMES, regions=REGIONS)
    saver = SegmentationReportSaver(tmp_path / "engine", metric_name="report")
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        engine = _run(vols, handler, saver)
    assert "evaluated 5 volume(s), mean over 5 volumes" in caplog.text

    by_hand = SegmentationReportTable(NAMES, regions=REGIONS)
    with pytest.warns(UserWarning):
        for v in vols:
            by_hand.add(v["prob"], v["label"], v["pred"], voxel_spacing(v), case_name(v, len(by_hand)))
    by_hand.write(tmp_path / "hand")
    for name in ("metrics.csv", "summary.json", "reliability.png", "risk_coverage.png"):
        assert (tmp_path / "engine" / name).read_bytes() == (tmp_path / "hand" / name).read_bytes(), name

    with open(tmp_path / "engine" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["case"] for r in rows] == [f"case_{i}.nii.gz" for i in range(5)]
    for row, vol in zip(rows, vols):
        reference = _reference_row(vol, REGIONS)
        assert {c: float(v) for c, v in row.items() if c != "case"} == pytest.approx(reference, rel=1e-12, nan_ok=True)
    summary = json.loads((tmp_path / "engine" / "summary.json").read_text())
    assert summary["settings"]["volumes"] == 5 and summary["settings"]["reduction"] == "mean over volumes"
    eces = [float(r["ece"]) for r in rows if not math.isnan(float(r["ece"]))]
    assert summary["metrics"]["ece"] == {
        "mean": pytest.approx(np.mean(eces)),
        "std": pytest.approx(np.std(eces)),
        "volumes": 4,
    }
    # the state the saver read: the means under the handler's name, the table in the details
    means = engine.state.metrics["report"]
    assert means["ece"] == pytest.approx(summary["metrics"]["ece"]["mean"], rel=1e-12)
    assert means["pooled_ece"] == summary["pooled"]["pooled_ece"]
    details = engine.state.metric_details["report"]
    assert details["cases"] == [r["case"] for r in rows] and details["table"].shape == (5, len(details["columns"]))


def test_pooled_section_equals_calibration_errors_on_the_concatenated_volumes(tmp_path):
    vols = _volumes()
    report = SegmentationReport(tmp_path, NAMES, surface_distances=False)
    _run(vols, report)
    pooled = json.loads((tmp_path / "summary.json").read_text())["pooled"]
    probs, labels = torch.stack([v["prob"] for v in vols]), torch.stack([v["label"] for v in vols])
    expected = calibration_errors(probs, labels, ("ece", "cece", "nll", "brier"))  # pooled over all volumes given
    assert pooled == pytest.approx({f"pooled_{k}": v for k, v in expected.items()}, rel=1e-12)
    # the mean over volumes is another number (the reduction the columns are named for)
    mean = json.loads((tmp_path / "summary.json").read_text())["metrics"]["ece"]["mean"]
    assert mean != pytest.approx(pooled["pooled_ece"])
    # the diagram's bins are the pooled ECE's bins
    data = report.table.reliability_data()
    assert data["count"].sum() == int((labels > 0).sum())
    ece = np.nansum(data["count"] * np.abs(data["accuracy"] - data["confidence"])) / data["count"].sum()
    assert ece == pytest.approx(pooled["pooled_ece"], rel=1e-12)
    assert [r["case"] for r in report.table.rows] == [f"case_{i}.nii.gz" for i in range(5)]  # rows of the run


def test_handlers_change_nothing_until_attached_and_run(tmp_path):
    engine = Engine(lambda e, batch: batch)
    before = {event: len(engine._event_handlers[event]) for event in Events}
    report = SegmentationReport(tmp_path / "out", NAMES)
    handler = SegmentationReportMetricHandler(label_names=NAMES)
    saver = SegmentationReportSaver(tmp_path / "saver")
    assert {event: len(engine._event_handlers[event]) for event in Events} == before
    assert not (tmp_path / "out").exists() and not (tmp_path / "saver").exists()
    assert not hasattr(engine.state, "metric_details") and engine.state.metrics == {}
    assert report.table.rows == [] and handler.metric_fn.aggregate().shape == (0, len(handler.metric_fn.columns))
    report.attach(engine)
    assert len(engine._event_handlers[Events.COMPLETED]) == before[Events.COMPLETED] + 2  # the saver, the rows
    assert not (tmp_path / "out").exists() and saver.metric_name == "segmentation_report"


@pytest.mark.parametrize("empty_class", ["nan", "papers"])
def test_an_absent_structure_has_the_same_estimate_and_truth_convention(empty_class):
    # class 2 absent from the label, the prediction and the probabilities: its DSC and estimated DSC are both NaN
    # ("nan": left out of mean_dice and of the case score) or both 1 ("papers")
    vol = _volume(5, 1.0)
    vol["label"][vol["label"] == 2] = 1
    prob = vol["prob"].clone()
    prob[1] += prob[2]
    prob[2] = 0
    pred = torch.nn.functional.one_hot(prob.argmax(0), 3).permute(3, 0, 1, 2).float()
    metric = SegmentationReportMetric(NAMES, empty_class=empty_class, surface_distances=False)
    metric([prob], [vol["label"]], pred=[pred], spacing=[[1.0, 1.0, 1.0]])
    row = dict(zip(metric.columns, metric.aggregate()[0].tolist()))
    assert math.isnan(row["dice_inner"]) == math.isnan(row["est_dice_inner"]) == (empty_class == "nan")
    if empty_class == "papers":
        assert row["dice_inner"] == row["est_dice_inner"] == 1.0
    expected_score = np.nanmean([row["est_dice_outer"], row["est_dice_inner"]])
    assert row["est_mean_dice"] == pytest.approx(expected_score, abs=1e-12)
