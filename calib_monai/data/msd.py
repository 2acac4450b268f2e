"""A dataset component for any Medical Segmentation Decathlon style task folder (users' own data)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from calib_monai.data import preprocessing as steps
from calib_monai.data.layouts import find_msd_cases, read_dataset_json_labels, unless_given
from calib_monai.data.volumes import VolumeSegmentationData, data_component

__all__ = ["MSDDataset"]

logger = logging.getLogger("calib_monai.data")


@data_component
class MSDDataset(VolumeSegmentationData):
    """Cases listed by an MSD ``dataset.json`` (``labels`` and ``training``, or ``imagesTr/`` + ``labelsTr/``).

    Classes come from ``dataset.json`` ``labels`` (MSD ``{"0": "background", ...}`` or nnU-Net v2 ``{"background":
    0, ...}``); label values outside them are an error. Intensities are scaled per volume and channel
    (``intensity_scaling``), as MSD tasks mix dtypes and scanners.

    Args:
        dataset_dir: the task folder (holds ``dataset.json``); None: preprocessing only, for a subclass whose class
            names its labels (``expected_labels``: ``Hippocampus``, ``Prostate``).
        others: see ``VolumeSegmentationData``.
        crop_foreground: centre the ``roi_size`` window of the training volumes on the label foreground (scored
            volumes are always centre cropped/padded).
    """

    source = "msd"
    task = ""  # a known task's folder name (Task04_Hippocampus), for error messages
    preprocessing_args = ("spacing", "intensity", "crop_foreground")

    roi_size: Sequence[int] = (64, 64, -1)
    spacing: Sequence[float] | None = None
    split: Sequence[int] = (70, 10, 20)
    intensity: str | Sequence[float] = "minmax"
    crop_foreground: bool = False

    @property
    def expected_labels(self) -> dict[str, str]:
        """The classes a known task must have (``facts``); none for the generic component (from dataset.json)."""
        return {} if self.facts is None else dict(self.facts.label_names)

    def _read_dataset(self) -> None:
        dataset_dir = self.dataset_dir
        if self.expected_labels:  # a known task: its classes need no dataset.json, so a given datalist is enough
            dataset_dir = unless_given(dataset_dir, self.datalist_path)
        elif dataset_dir is None:
            raise ValueError(
                f"{type(self).__name__} reads its classes from the task's dataset.json, so it needs "
                "dataset_dir (an MSD task folder with dataset.json, imagesTr/, labelsTr/) even for "
                "inference; dataset_dir=None (no data set) works for the tasks whose classes are known "
                "(calib_monai.data.Hippocampus, Prostate)"
            )
        if dataset_dir is not None and not dataset_dir:
            raise ValueError("dataset_dir must name an MSD task folder (with dataset.json, imagesTr/, labelsTr/)")
        self.root = self.dataset_dir = None if dataset_dir is None else Path(dataset_dir).expanduser().resolve()
        if self.dataset_dir is None:  # preprocessing only: the classes come from the class
            self.description, self._label_names = {}, dict(self.expected_labels)
            return
        self.description, self._cases = find_msd_cases(self.dataset_dir)
        where = self.dataset_dir / "dataset.json"
        self._label_names = read_dataset_json_labels(self.description, str(where))
        logger.info("MSD: %d cases in %s, classes %s", len(self._cases), self.dataset_dir, self._label_names)
        if not self.expected_labels:
            return
        # a known task: dataset.json must name its classes and modalities
        names, expected = ({k: v.lower() for k, v in d.items()} for d in (self._label_names, self.expected_labels))
        if names != expected:
            raise ValueError(
                f"{where} has labels {self._label_names}, but {self.task} has {self.expected_labels}: "
                "this is not that data set; use calib_monai.data.MSDDataset for other tasks"
            )
        modality = self.description.get("modality")
        if isinstance(modality, dict) and len(modality) != len(self.channel_names):
            raise ValueError(
                f"{where} lists modalities {modality}, but {self.task} has {len(self.channel_names)} "
                f"({', '.join(self.channel_names)})"
            )

    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        """Every MSD task, known or not: resampling when ``spacing`` is set, the label-centred window (training
        only) with ``crop_foreground``."""
        return [
            *steps.read_as_ras(),
            steps.resample(),
            steps.scale_to_unit(),
            steps.crop_around_label(disabled="$not @data.crop_foreground"),
            steps.pad_or_crop(),
        ]

    @property
    def label_names(self) -> dict[str, str]:
        return dict(self._label_names)

    @property
    def channel_names(self) -> tuple[str, ...] | None:
        """The known task's channels, else those of ``dataset.json`` (MSD ``modality`` or nnU-Net v2
        ``channel_names``: ``{"0": "MRI"}``); None when it names none."""
        if self.facts is not None:
            return tuple(self.facts.channel_names)
        channels = self.description.get("channel_names", self.description.get("modality"))
        if isinstance(channels, dict) and channels and all(str(k).isdigit() for k in channels):
            return tuple(str(channels[k]) for k in sorted(channels, key=int))
        return None
