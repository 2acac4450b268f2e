"""Evaluate a finished training run on whole 3D volumes: test metrics, noisy inputs, temperatures, logits.

The run's bundle config (with the run's overrides) builds, through ``calib_monai.bundle.TrainedBundle``, the network
with the best checkpoint ``models/model.pt``, the data component and the validation inferer exactly as training used
them. Each volume goes through the bundle's ``SliceInferer`` once; the metrics are the bundle's own
report table (:class:`calib_monai.metrics.SegmentationReportTable`: DSC, HD95, ASD per class, ECE / CECE / TACE on
ground-truth foreground, NLL, Brier, the label-free case quality; the mean over volumes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from calib_monai.bundle import TrainedBundle, locate_bundle
from calib_monai.defaults import NUM_BINS
from calib_monai.metrics.report_table import SegmentationReportTable, case_name, voxel_spacing
from studies.runs import read_record

__all__ = ["EvaluatedVolume", "TrainedRun", "add_gaussian_noise", "evaluate_run", "score_volumes"]


@dataclass
class EvaluatedVolume:
    """One preprocessed volume and the network's logits on it (CPU tensors)."""

    case: str
    image: torch.Tensor  # (C_in, H, W, D), MetaTensor with the affine
    label: torch.Tensor | None  # (1, H, W, D) int64; None for an image without a label
    logits: torch.Tensor  # (C, H, W, D) float32


def add_gaussian_noise(image: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """``image + N(0, sigma^2)`` with a seeded generator (the robustness study; images are scaled to [0, 1])."""
    if sigma <= 0:
        return image
    generator = torch.Generator().manual_seed(int(seed))
    return image + sigma * torch.randn(image.shape, generator=generator, dtype=image.dtype)


class TrainedRun:
    """A finished run folder (``studies.runs.train``) ready for inference.

    Args:
        run_dir: the run folder (``run.json``, ``models/model.pt``).
        device: torch device for inference (default: the CPU).
        checkpoint: the network weights in ``models/``: ``model.pt`` (best validation DSC) or a snapshot
            ``epoch_<e>.pt``.
    """

    def __init__(self, run_dir: str | os.PathLike, device: str = "cpu", checkpoint: str = "model.pt") -> None:
        self.run_dir = Path(run_dir)
        record = read_record(self.run_dir)
        if record is None or record.get("status") != "finished":
            state = "no run.json" if record is None else f"status {record.get('status')!r}"
            raise ValueError(
                f"{self.run_dir} is not a finished run ({state}); train it first (the study command "
                "trains the runs it needs and resumes stopped ones)"
            )
        self.record = record
        checkpoint = self.run_dir / "models" / checkpoint
        if not checkpoint.is_file():
            raise ValueError(
                f"{checkpoint} is missing although {self.run_dir / 'run.json'} says finished; delete "
                "the run folder and train it again"
            )
        # the bundle's train.json and the run's overlays with its overrides, as the training command had them
        self.bundle = TrainedBundle(
            locate_bundle(record["bundle"]),
            ("train.json", *record.get("extra_configs", ())),
            {"output_dir": str(self.run_dir / "models"), **record["overrides"]},
            device=device,
            weights=checkpoint,
        )
        self.parser = self.bundle.parser
        self.device = self.bundle.device
        self.network = self.bundle.network  # plain, module.-prefixed (older multi-GPU runs) or {"model": ...}
        self.data = self.bundle.get("data")
        self.inferer = self.bundle.inferer  # validate#inferer
        self.label_names: dict[str, str] = dict(self.bundle.get("label_names"))

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    def dataset(self, subset: str):
        preprocessing = self.bundle.get("validate#preprocessing")  # the run's evaluation chain, overrides included
        return {"test": self.data.test_dataset, "validation": self.data.val_dataset}[subset](preprocessing)

    @torch.no_grad()
    def volumes(
        self, subset: str = "test", noise_sigma: float = 0.0, noise_seed: int = 0, corrupt: Callable | None = None
    ) -> Iterator[EvaluatedVolume]:
        """The volumes of ``subset`` ("test" or "validation") with their logits; ``noise_sigma`` adds seeded
        Gaussian noise to each preprocessed image first (volume i uses seed ``noise_seed * 100003 + i``);
        ``corrupt(image, label, i) -> (image, label)`` shifts the preprocessed pair first
        (:func:`studies.corruptions.corruption`)."""
        for index, item in enumerate(self.dataset(subset)):
            image = add_gaussian_noise(item["image"], noise_sigma, noise_seed * 100003 + index)
            label = torch.as_tensor(item["label"]).long()
            if corrupt is not None:
                image, label = corrupt(image, label, index)
            logits = self.inferer(image[None].to(self.device), self.network)[0].float().cpu()
            yield EvaluatedVolume(case_name(item, index), image, label, torch.as_tensor(logits))

    @torch.no_grad()
    def foreign_volumes(self, images: Iterable[str]) -> Iterator[EvaluatedVolume]:
        """Images of another data set through this run's image-only preprocessing (as ``inferring`` reads them),
        with their logits; no label (``label`` is None)."""
        preprocessing = self.data.inference_preprocessing()
        for index, path in enumerate(images):
            item = preprocessing({"image": path})
            logits = self.inferer(item["image"][None].to(self.device), self.network)[0].float().cpu()
            yield EvaluatedVolume(case_name(item, index), item["image"], None, torch.as_tensor(logits))


def evaluate_run(
    run: TrainedRun,
    subset: str = "test",
    noise_sigma: float = 0.0,
    calibrate: Callable[[EvaluatedVolume], torch.Tensor] | None = None,
    output_dir: str | os.PathLike | None = None,
    on_volume: Callable[[EvaluatedVolume, torch.Tensor], None] | None = None,
    num_bins: int = NUM_BINS,
    surface_distances: bool = True,
) -> SegmentationReportTable:
    """Per-volume metrics of ``run`` on ``subset``: the report table the bundle's ``evaluating`` run writes.

    Args:
        calibrate: maps a volume to its probabilities ``(C, H, W, D)`` (post-hoc calibration); default softmax.
        output_dir: when given, the report writes ``metrics.csv``, ``summary.json`` and ``reliability.png`` there.
        on_volume: called with each volume and its probabilities (figures, logit statistics).
        surface_distances: False skips HD95 and ASD (DSC and calibration only; much faster).
    Returns:
        the table: ``.rows`` (one dict per volume), ``.summary()``, ``.reliability_data()``, ``.case_quality()``.
    """
    return score_volumes(
        run.volumes(subset, noise_sigma=noise_sigma),
        run.label_names,
        output_dir or run.run_dir / "eval",
        calibrate,
        write=output_dir is not None,
        on_volume=on_volume,
        num_bins=num_bins,
        surface_distances=surface_distances,
    )


def score_volumes(
    volumes: Iterable[EvaluatedVolume],
    label_names: dict[str, str],
    output_dir: str | os.PathLike,
    calibrate: Callable[[EvaluatedVolume], torch.Tensor] | None = None,
    write: bool = False,
    on_volume: Callable[[EvaluatedVolume, torch.Tensor], None] | None = None,
    num_bins: int = NUM_BINS,
    surface_distances: bool = True,
) -> SegmentationReportTable:
    """:func:`evaluate_run` on volumes whose logits are already computed (one inference, several calibrations)."""
    table = SegmentationReportTable(label_names, num_bins=num_bins, surface_distances=surface_distances)
    for vol in volumes:
        prob = calibrate(vol) if calibrate is not None else torch.softmax(vol.logits, dim=0)
        table.add(prob, vol.label, spacing=voxel_spacing({"image": vol.image}), case=vol.case)
        if on_volume is not None:
            on_volume(vol, prob)
    if write:
        table.write(output_dir)
    return table


def case_table(report: SegmentationReportTable, columns: list[str]) -> np.ndarray:
    """``(cases, len(columns))`` float64 per-volume values of a report (NaN where absent)."""
    return np.array([[float(row.get(c, np.nan)) for c in columns] for row in report.rows], dtype=np.float64)
