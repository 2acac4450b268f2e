"""SegmentationCalibrationError handler on a real SupervisedEvaluator; the metric class's reductions and inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.bundle import ConfigParser
from monai.data import DataLoader
from monai.engines import SupervisedEvaluator
from monai.handlers import CheckpointSaver
from monai.transforms import Activationsd

from calib_monai.handlers import SegmentationCalibrationError
from calib_monai.metrics import SegmentationCalibrationMetric, segmentation_calibration

HANDLER_CONFIG = {
    "_target_": "calib_monai.handlers.SegmentationCalibrationError",
    "metric_name": "ece",
    "num_bins": 15,
    "foreground": "gt",
    "output_transform": "$monai.handlers.from_engine(['pred', 'label'])",
}


class Temperature(torch.nn.Module):
    """The "network": its input image already holds logits; dividing by a temperature changes the calibration."""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = torch.nn.Parameter(torch.ones(()), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.temperature


def _dataset(num_cases=4, num_classes=3, shape=(6, 5, 4), seed=0):
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for _ in range(num_cases):
        label = torch.randint(0, num_classes, (1, *shape), generator=gen)
        logits = torch.randn((num_classes, *shape), generator=gen) + 3.0 * torch.nn.functional.one_hot(
            label[0], num_classes
        ).movedim(-1, 0)
        cases.append({"image": logits, "label": label})
    return cases


def _evaluator(cases, net, metric_cmp_fn=None, handlers=None):
    config = ConfigParser({"metric": HANDLER_CONFIG, "cmp": "$lambda current, best: current < best"})
    kwargs = {"metric_cmp_fn": metric_cmp_fn or config.get_parsed_content("cmp")}
    return SupervisedEvaluator(
        device=torch.device("cpu"),
        val_data_loader=DataLoader(cases, batch_size=2),
        network=net,
        postprocessing=Activationsd(keys="pred", softmax=True),
        key_val_metric={"val_ece": config.get_parsed_content("metric")},
        additional_metrics={
            "val_cece_pooled": SegmentationCalibrationError(
                "cece",
                reduction="pooled",
                output_transform=lambda out: ([o["pred"] for o in out], [o["label"] for o in out]),
            )
        },
        val_handlers=handlers,
        **kwargs,
    )


def test_handler_from_bundle_config_gives_the_papers_mean_ece():
    cases = _dataset()
    net = Temperature()
    evaluator = _evaluator(cases, net)
    evaluator.run()
    probs = torch.softmax(torch.stack([c["image"] for c in cases]), dim=1)
    labels = torch.stack([c["label"] for c in cases])
    expected = segmentation_calibration(probs, labels, "ece", 15, "gt", "mean")
    # independent check of that mean: per volume, a float64 per-bin loop over (lo, hi] bins, then the plain mean
    per_volume = []
    for p, y in zip(probs.double(), labels[:, 0]):
        conf, pred = p.max(dim=0)
        fg = y > 0
        conf, correct = conf[fg], (pred[fg] == y[fg]).double()
        edges = torch.linspace(0, 1, 16, dtype=torch.float64)
        per_volume.append(
            sum(
                float(m.sum()) * abs(float(correct[m].mean()) - float(conf[m].mean()))
                for m in ((conf > lo) & (conf <= hi) for lo, hi in zip(edges[:-1], edges[1:]))
                if m.any()
            )
            / conf.numel()
        )
    assert expected == pytest.approx(float(np.mean(per_volume)), abs=1e-12)
    # the evaluator's float32 softmax runs on batches of 2, ours on all 4: values agree to float32 rounding
    assert evaluator.state.metrics["val_ece"] == pytest.approx(expected, abs=1e-7)
    assert evaluator.state.metrics["val_cece_pooled"] == pytest.approx(
        segmentation_calibration(probs, labels, "cece", 15, "gt", "pooled"), abs=1e-7
    )
    values, stats = evaluator.state.metric_details["val_ece"]  # per-volume values and bin statistics
    np.testing.assert_allclose(values[:, 0].numpy(), per_volume, atol=1e-7)
    assert stats.shape == (4, 15 * 3)


def test_ece_key_metric_is_lower_is_better_with_checkpoint_negative_sign(tmp_path):
    cases = _dataset(seed=1)
    net = Temperature()
    saver = CheckpointSaver(
        save_dir=str(tmp_path), save_dict={"net": net}, save_key_metric=True, key_metric_negative_sign=True
    )
    evaluator = _evaluator(cases, net, handlers=[saver])
    probs_logits = torch.stack([c["image"] for c in cases])
    labels = torch.stack([c["label"] for c in cases])
    eces = {}
    for epoch, temperature in enumerate([0.3, 1.0, 3.0], start=1):  # 3 "epochs" with different calibration
        net.temperature.fill_(temperature)
        evaluator.run(global_epoch=epoch)
        eces[epoch] = evaluator.state.metrics["val_ece"]
        assert eces[epoch] == pytest.approx(
            segmentation_calibration(torch.softmax(probs_logits / temperature, 1), labels, "ece", 15, "gt"), abs=1e-7
        )
    best_epoch = min(eces, key=eces.get)
    assert len(set(eces.values())) == 3 and best_epoch != 3  # the lowest is not simply the last epoch
    assert evaluator.state.best_metric_epoch == best_epoch
    assert evaluator.state.best_metric == pytest.approx(eces[best_epoch])
    saved = list(tmp_path.glob("*.pt"))
    assert len(saved) == 1
    # ignite names the file by the score it maximises, -ECE: the kept checkpoint is the lowest ECE
    assert f"{-eces[best_epoch]:.4f}" in saved[0].name


def test_metric_class_reductions_inputs_and_errors():
    cases = _dataset(num_cases=3)
    probs = torch.softmax(torch.stack([c["image"] for c in cases]), dim=1)
    labels = torch.stack([c["label"] for c in cases])
    onehot = torch.nn.functional.one_hot(labels[:, 0], 3).movedim(-1, 1)
    for metric_name in ("ece", "cece", "tace", "ace", "ml1ace", "nll", "brier"):
        metric = SegmentationCalibrationMetric(metric_name=metric_name, num_bins=10, foreground="union")
        metric(y_pred=probs[:2], y=onehot[:2])  # one-hot labels, batch-first
        metric(y_pred=[probs[2]], y=[labels[2]])  # list of channel-first tensors
        per_volume = segmentation_calibration(probs, labels, metric_name, 10, "union", "none")
        np.testing.assert_allclose(metric.aggregate("none").numpy(), per_volume, atol=1e-12)
        assert float(metric.aggregate()) == pytest.approx(float(np.mean(per_volume)), abs=1e-12)
        if metric_name not in ("tace", "ace"):
            pooled = segmentation_calibration(probs, labels, metric_name, 10, "union", "pooled")
            assert float(metric.aggregate("pooled")) == pytest.approx(pooled, abs=1e-12)
    with pytest.raises(ValueError, match="reduction='pooled'"):
        SegmentationCalibrationMetric(metric_name="tace", reduction="pooled")
    with pytest.raises(ValueError, match="metric_name"):
        SegmentationCalibrationError(metric_name="mce")
    with pytest.raises(ValueError, match="one-hot"):
        SegmentationCalibrationMetric()(y_pred=probs, y=onehot * 2)
