"""The MSD tasks of the papers: Hippocampus (Task04, MbLS "HPC") and Prostate (Task05, NACL "PROSTATE")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field

from calib_monai.data.facts import DatasetFacts
from calib_monai.data.msd import MSDDataset
from calib_monai.data.volumes import data_component

__all__ = ["Hippocampus", "Prostate"]


@data_component
class Hippocampus(MSDDataset):
    """MSD Task04_Hippocampus (the MbLS paper's HPC): anterior (1) and posterior (2) hippocampus in T1 MRI crops;
    1 input channel; 260 cases split at random 185/25/50 (MbLS). Preprocessing: RAS (1 mm isotropic, no
    resampling), per-volume min-max scaling to [0, 1], axial slices centre padded to 64x64, every slice kept.

    Citation: Antonelli M. et al., "The Medical Segmentation Decathlon", Nat. Commun. 13, 4128, 2022; Simpson A.L.
    et al., arXiv:1902.09063, 2019.

    Args:
        dataset_dir: the Task04_Hippocampus folder; None: preprocessing only.
        others: see ``VolumeSegmentationData``.
    """

    source = "hippocampus"
    task = "Task04_Hippocampus"
    facts = DatasetFacts(
        {"0": "background", "1": "Anterior", "2": "Posterior"}, channel_names=("image",), roi_size=(64, 64, -1)
    )
    preprocessing_args = ()

    roi_size: Sequence[int] = facts.roi_size
    split: Sequence[int] = (185, 25, 50)
    # the MbLS setup, not arguments: no resampling, min-max scaling, centre crop/pad
    spacing: Sequence[float] | None = field(default=None, init=False)
    intensity: str = field(default="minmax", init=False)
    crop_foreground: bool = field(default=False, init=False)


@data_component
class Prostate(MSDDataset):
    """MSD Task05_Prostate (the NACL journal's PROSTATE): peripheral (PZ 1) and transition zone (TZ 2) in
    multi-parametric MRI; T2 and ADC as 2 input channels (a 4D file); 32 cases split at random 22/3/7 (NACL).
    Preprocessing: RAS, per-channel min-max scaling to [0, 1], axial slices centre cropped/padded to ``roi_size``.

    Citation: Antonelli M. et al., "The Medical Segmentation Decathlon", Nat. Commun. 13, 4128, 2022.

    Args:
        dataset_dir: the Task05_Prostate folder; None: preprocessing only.
        others: see ``VolumeSegmentationData``.
        spacing: voxel spacing (mm) to resample to; None (default): none, as the paper (about 0.6 mm in-plane).
    """

    source = "prostate"
    task = "Task05_Prostate"
    facts = DatasetFacts(
        {"0": "background", "1": "PZ", "2": "TZ"}, channel_names=("T2", "ADC"), roi_size=(320, 320, -1)
    )
    preprocessing_args = ("spacing", "intensity")

    roi_size: Sequence[int] = facts.roi_size
    split: Sequence[int] = (22, 3, 7)
    crop_foreground: bool = field(default=False, init=False)  # the NACL setup: centre crop/pad
