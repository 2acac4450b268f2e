"""The FLARE abdominal CT component (NACL journal, Murugesan et al.; MbLS, Liu et al.), with a phantom default."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from calib_monai.data import phantoms
from calib_monai.data import preprocessing as steps
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.layouts import find_flare_cases, read_dataset_json
from calib_monai.data.volumes import VolumeSegmentationData, data_component

__all__ = ["FLARE", "FLARE_LABEL_NAMES", "FLARE22_TO_FLARE"]

logger = logging.getLogger("calib_monai.data")

FLARE_LABEL_NAMES = {"0": "background", "1": "liver", "2": "kidney", "3": "spleen", "4": "pancreas"}
# FLARE22 (13 organs) -> the four FLARE21 organs: 1 liver, 2 right kidney, 3 spleen, 4 pancreas keep their values,
# 13 left kidney joins 2 (kidney); 5 aorta, 6 IVC, 7/8 adrenal glands, 9 gallbladder, 10 esophagus, 11 stomach,
# 12 duodenum become background. On FLARE21 labels (0..4) this mapping is the identity.
FLARE22_TO_FLARE = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0, 11: 0, 12: 0, 13: 2}
_FLARE22_NAMES = {1: ("liver",), 2: ("kidney",), 3: ("spleen",), 4: ("pancreas",), 13: ("kidney",)}


@data_component
class FLARE(VolumeSegmentationData):
    """FLARE abdominal organ segmentation: liver, kidney, spleen, pancreas (plus background: 5 classes).

    Reads FLARE21 (labels 0..4) and FLARE22 / MSD-style folders (13 organs, mapped by ``FLARE22_TO_FLARE``;
    ``FLARE_LAYOUTS``). Preprocessing (NACL journal: "resampled to the same space and cropped to 192 x 192 x 30";
    240/40/80 split): RAS, resampling to ``spacing``, the CT ``window`` scaled to [0, 1], and for training volumes a
    ``roi_size`` window centred on the organs (validation and test volumes are scored whole). The paper gives
    neither spacing nor window: 1.6 x 1.6 x 6 mm and W400/L40 fit an adult abdomen into 192 x 192 x 30 voxels.

    With ``dataset_dir=""`` (the bundle default) it trains on ``num_phantoms`` synthetic CT phantoms
    (``calib_monai.data.phantoms``), cached in the FLARE22 layout.

    Args:
        dataset_dir: a FLARE download, or "" / None for the phantoms.
        others: see ``VolumeSegmentationData``.
        roi_size: preprocessed size (H, W, D) of the training volumes.
        cache_dir: where phantoms are cached; None: ``$CALIB_MONAI_CACHE`` or ``~/.cache/calib_monai``.
        num_phantoms: number of phantoms (when ``dataset_dir`` is empty).
        phantom_shape: phantom grid size; None: the grid that covers the phantom field of view at ``spacing`` (no
            resampling), else the field of view sampled by ``shape`` voxels and resampled like real data.
        phantom_seed: seed of the phantom generator.
    """

    facts = DatasetFacts(FLARE_LABEL_NAMES, channel_names=("image",), roi_size=(192, 192, 30))
    preprocessing_args = ("spacing", "window")
    crop_foreground = True

    dataset_dir: str | os.PathLike | None = ""
    output_dir: str | os.PathLike = ""
    roi_size: Sequence[int] = facts.roi_size
    cache_dir: str | os.PathLike | None = None
    spacing: Sequence[float] | None = (1.6, 1.6, 6.0)
    split: Sequence[int] = (240, 40, 80)
    num_phantoms: int = 24
    phantom_shape: Sequence[int] | None = None
    phantom_seed: int = 0
    window: Sequence[float] = (-160.0, 240.0)

    def __post_init__(self) -> None:
        self.num_phantoms, self.phantom_seed = int(self.num_phantoms), int(self.phantom_seed)
        self.cache_dir = Path(self.cache_dir).expanduser() if self.cache_dir else phantoms.default_cache_dir()
        super().__post_init__()

    def _read_dataset(self) -> None:
        if self.phantom_shape is not None:
            self.phantom_shape = tuple(int(s) for s in self.phantom_shape)
            self.phantom_spacing = phantoms.phantom_spacing(self.phantom_shape)
        else:
            self.phantom_spacing = self.spacing or phantoms.phantom_spacing((128, 128, 48))
            self.phantom_shape = phantoms.phantom_shape(self.phantom_spacing)
        self.dataset_dir = str(self.dataset_dir or "")
        self.root = Path(self.dataset_dir).expanduser().resolve() if self.dataset_dir else self.phantom_root
        if self.dataset_dir:
            self.source = "flare"
            self.layout, self._cases = find_flare_cases(self.dataset_dir)  # fails early on a wrong folder
            self._check_dataset_json_labels()
            logger.info("FLARE: %d cases in %s (%s layout)", len(self._cases), self.dataset_dir, self.layout)
        else:
            self.source, self.layout, self._cases = "phantom", "flare22", None
            if self.num_phantoms < 3:
                raise ValueError(f"num_phantoms must be >= 3 (one case per subset), got {self.num_phantoms}")

    @property
    def phantom_root(self) -> Path:
        shape = "x".join(str(s) for s in self.phantom_shape)
        spacing = "x".join(f"{s:g}" for s in self.phantom_spacing)
        name = f"v{phantoms.PHANTOM_VERSION}_seed{self.phantom_seed}_{shape}_{spacing}mm"
        return self.cache_dir / "flare_phantoms" / name

    def _find_cases(self) -> list[dict[str, str]]:
        if self._cases is None:  # phantoms: generated on first use, reused from the cache afterwards
            logger.info(
                "FLARE: no dataset_dir given, so the data are %d synthetic abdominal CT phantoms, cached in %s. To "
                "train on real FLARE data pass --dataset_dir /path/to/FLARE22 (imagesTr/ + labelsTr/) or "
                "/path/to/FLARE21 (TrainingImg/ + TrainingMask/).",
                self.num_phantoms,
                self.phantom_root,
            )
            phantoms.write_phantom_dataset(
                self.phantom_root, self.num_phantoms, self.phantom_seed, self.phantom_shape, self.phantom_spacing
            )
            self._cases = find_flare_cases(self.phantom_root)[1]
        return self._cases

    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        """FLARE21 labels go through ``FLARE22_TO_FLARE`` unchanged (0..4 map to themselves)."""
        return [
            *steps.read_as_ras(FLARE22_TO_FLARE),
            steps.resample(),
            steps.window(),
            steps.crop_around_label(),
            steps.pad_or_crop(phases=(steps.TRAINING,)),
        ]

    @property
    def raw_label_values(self) -> list[int]:
        return list(range(5)) if self.layout == "flare21" else sorted(FLARE22_TO_FLARE)

    def _label_convention(self) -> str:
        if self.layout == "flare21":
            return "FLARE21 labels: 0 background, 1 liver, 2 kidney, 3 spleen, 4 pancreas"
        return "FLARE22 labels 0..13: 1 liver, 2 right kidney, 3 spleen, 4 pancreas, ..., 13 left kidney"

    def _check_dataset_json_labels(self) -> None:
        """A dataset.json naming other organs at 1..4 (e.g. AMOS, BTCV) is not FLARE: refuse rather than mislabel."""
        description = read_dataset_json(self.dataset_dir) if self.layout == "flare22" else None
        labels = (description or {}).get("labels")
        if not isinstance(labels, dict):
            return
        names = {str(k): str(v).lower() for k, v in labels.items()}
        if not all(str(k).isdigit() for k in labels):  # nnU-Net v2: name -> value
            names = {str(v): str(k).lower() for k, v in labels.items()}
        for value, expected in _FLARE22_NAMES.items():
            name = names.get(str(value))
            if name is not None and not any(e in name for e in expected):
                raise ValueError(
                    f"{Path(self.dataset_dir) / 'dataset.json'} names label {value} {name!r}, but FLARE "
                    f"has {expected[0]!r} there: this is not FLARE data; use calib_monai.data.MSDDataset "
                    "for other label conventions"
                )
