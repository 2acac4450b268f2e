"""Shared machinery of the dataset components: datalist -> MONAI preprocessing -> cached 3D volumes -> 2D slices.

The papers (NACL, MbLS, CRaC) train 2D networks on axial slices and evaluate on whole volumes: a component
preprocesses every case once (``CacheDataset``) and serves training slices ``{"image": (C, H, W), "label": (1, H,
W)}`` along the last axis, and whole validation/test volumes as MetaTensors (for ``SliceInferer`` and ``Invertd``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from monai.data import CacheDataset
from monai.transforms import Compose
from torch.utils.data import Subset

from calib_monai.atomic import check_folder
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.inference import nifti_items
from calib_monai.data.layouts import given_datalist, layout_error, load_or_create_datalist, split_cases, unless_given
from calib_monai.data.preprocessing import EVALUATION, INFERENCE, TRAINING, compose, phase_of_subset, phase_transforms
from calib_monai.data.slices import SliceDataset, cached_volumes
from calib_monai.data.transforms import intensity_scaling

__all__ = ["SliceDataset", "VolumeSegmentationData", "data_component"]

logger = logging.getLogger("calib_monai.data")

# One constructor generated from the fields (what bundle configs, ``--data#<name>`` overrides and ``bundle_factory``
# read); identity equality, as components are cached and hashed by object; the base's repr.
data_component = dataclass(eq=False, repr=False)


@data_component
class VolumeSegmentationData:
    """Base of the dataset components: a seeded datalist and the MONAI preprocessing of (image, label) volumes.

    A subclass is a ``data_component`` that declares its fields, sets ``source``, ``facts``, ``layouts``,
    ``preprocessing_steps()`` (``calib_monai.data.preprocessing``) and ``preprocessing_args``, and lists its cases in
    ``_read_cases``. Built with ``dataset_dir=None`` it serves ``inference_preprocessing`` only.

    Args:
        dataset_dir: the data set folder; None: no data set, a preprocessing-only component for inference.
        output_dir: the run's output folder; ``<output_dir>/datalist.json`` stores the split (re-read if present).
        roi_size: spatial size ``(H, W, D)`` of the preprocessed volumes; ``-1`` keeps an axis' size.
        seed: seed of the split.
        cache_rate: fraction of volumes ``CacheDataset`` preprocesses up front (uncached training slices are slow).
        num_workers: threads ``CacheDataset`` uses to preprocess.

    A subclass' settings: ``split`` (counts ``(train, val, test)``, or their ratios for another number of cases),
    ``spacing`` (mm, or None), ``crop_foreground`` (training windows centred on the label), ``intensity``
    (``intensity_scaling``), ``window`` (CT HU).
    """

    dataset_dir: str | os.PathLike | None
    output_dir: str | os.PathLike
    roi_size: Sequence[int]
    seed: int = 0
    cache_rate: float = 1.0
    num_workers: int = 0

    spacing = None
    crop_foreground = False
    drop_empty_training_slices: ClassVar[bool] = False
    source: ClassVar[str] = ""
    facts: ClassVar[DatasetFacts | None] = None  # None: the classes come from the data (MSDDataset's dataset.json)
    preprocessing_args: ClassVar[tuple[str, ...]] = ()  # constructor arguments that preprocessing_steps() reads
    layouts: ClassVar[tuple[str, ...]] = ()  # the folder layouts the component reads, listed by its errors
    label_mapping: ClassVar[dict[int, int] | None] = None  # the files' label values -> classes, when they differ

    def __post_init__(self) -> None:
        if not self.output_dir:
            raise ValueError("output_dir must name the run's output folder (the datalist.json of the split goes there)")
        self.output_dir = check_folder(Path(self.output_dir).expanduser(), "output_dir")  # not a file, nor under one
        roi_size, self.roi_size = self.roi_size, tuple(int(r) for r in self.roi_size)
        if len(self.roi_size) != 3 or any(r == 0 or r < -1 for r in self.roi_size):
            raise ValueError(f"roi_size must be three positive sizes (or -1 to keep an axis), got {tuple(roi_size)}")
        spacing, self.spacing = self.spacing, None if self.spacing is None else tuple(float(s) for s in self.spacing)
        if self.spacing is not None and (len(self.spacing) != 3 or not all(0 < s < math.inf for s in self.spacing)):
            raise ValueError(
                f"spacing must be three positive finite voxel sizes in mm (or None), got {tuple(spacing)}: pass e.g. "
                '--data#spacing "[1.5,1.5,3.0]"'
            )
        if hasattr(self, "intensity"):
            intensity_scaling(self.intensity)  # fails early on a bad value
        if hasattr(self, "window"):  # a CT window in HU
            window, self.window = self.window, tuple(float(w) for w in self.window)
            if len(self.window) != 2 or not -math.inf < self.window[0] < self.window[1] < math.inf:
                raise ValueError(
                    f"window must be (low, high) finite HU with low < high, got {tuple(window)}: pass e.g. "
                    '--data#window "[-160,240]"'
                )
        self.split = tuple(int(s) for s in self.split)
        self.seed = int(self.seed)
        self.crop_foreground = bool(self.crop_foreground)
        if not 0.0 <= float(self.cache_rate) <= 1.0:
            raise ValueError(f"cache_rate must be in [0, 1], got {self.cache_rate}")
        self.cache_rate = float(self.cache_rate)
        self.num_workers = int(self.num_workers)
        self.root: Path | None = None  # the data set folder; None: preprocessing only
        self._cases: list[dict] = []
        self._datalist: dict[str, list[dict]] | None = None
        self._volumes: dict[str, tuple[Callable, CacheDataset]] = {}  # subset -> (its chain, its cached volumes)
        self._given: dict[str, Callable] = {}  # phase -> the chain a dataset method was given (bundles: the config's)
        self._built: dict[str, Compose] = {}  # phase -> the chain built from preprocessing_steps()
        self._read_dataset()

    # ---- subclass hooks -------------------------------------------------------------------------------------------
    @classmethod
    def preprocessing_steps(cls) -> list[dict]:
        """The deterministic preprocessing as MONAI config items (``calib_monai.data.preprocessing``)."""
        raise NotImplementedError

    @property
    def label_names(self) -> dict[str, str]:
        """Class value (``"0"`` .. ``"C-1"``) -> name (default: ``facts.label_names``)."""
        return dict(self.facts.label_names)

    @property
    def channel_names(self) -> tuple[str, ...] | None:
        """One name per input channel, or None when the data decide (``MSDDataset``)."""
        return None if self.facts is None else tuple(self.facts.channel_names)

    @property
    def raw_label_values(self) -> list[int]:
        """Label values the files may contain (before remapping); others are an error (``ValidateSegmentationd``)."""
        return list(self.label_mapping) if self.label_mapping else [int(v) for v in self.label_names]

    @property
    def label_description(self) -> str:
        """How the label files encode classes, appended to ``ValidateSegmentationd``'s errors."""
        return f" of {self.source} ({self._label_convention()})"

    def _read_dataset(self) -> None:
        """Read ``dataset_dir``: nothing for None, or for an empty one with a given datalist."""
        dataset_dir = unless_given(self.dataset_dir, self.datalist_path)
        if dataset_dir is None:
            return
        if not dataset_dir:  # a forgotten --dataset_dir
            raise ValueError("dataset_dir is empty; expected:\n  - " + "\n  - ".join(self.layouts))
        self.root = Path(dataset_dir).expanduser().resolve()  # _read_cases may move it into a release's inner folder
        if not self.root.is_dir():
            raise self._layout_error(self.root, "does not exist or is not a folder")
        self._cases = self._read_cases(self.root)

    def _read_cases(self, root: Path) -> list[dict]:
        """The labelled cases of the existing folder ``root`` (a one-line error for a folder in none of ``layouts``)."""
        raise NotImplementedError

    def _layout_error(self, path: str | os.PathLike, problem: str) -> ValueError:
        return layout_error(path, problem, self.layouts)

    def _input_files(self, path: Path, is_input: Callable[[Path], bool], not_input: str, none: str) -> list[Path]:
        """``[path]`` for an input file (else a ValueError: ``path`` is not ``not_input``), or the input files under the
        folder ``path`` (searched recursively, hidden files skipped; none: a layout error saying ``none``)."""
        if path.is_file():
            if not is_input(path):
                raise ValueError(f"{path} is not {not_input}")
            return [path]
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".") and is_input(p))
        if not files:
            raise self._layout_error(path, none)
        return files

    def _find_cases(self) -> list[dict]:
        """The cases the split draws from (read at construction, by default)."""
        return self._cases

    def _dataset_root(self) -> str | None:
        """The data set folder (stored in ``datalist.json``), or None for a preprocessing-only component."""
        return None if self.root is None else str(self.root)

    def _split_cases(self, cases: list[dict], split: Sequence[int], seed: int) -> dict[str, list[dict]]:
        """The train/validation/test split of ``cases`` (default: a seeded shuffle of the cases)."""
        return split_cases(cases, split, seed)

    def subject_of(self, case: dict) -> str | None:
        """The subject (patient) of a case when a subject has several cases (ACDC's two frames), else None; the
        calibrate step ranks validation subjects, the exchangeable units of the review rule."""
        return None

    def _datalist_info(self) -> dict:
        """Entries stored in ``datalist.json`` beside the lists; a stored datalist that disagrees is an error."""
        return {"source": self.source, "dataset_dir": self._dataset_root()}

    # ---- public API -----------------------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        """Number of classes including background (channels of the network output)."""
        return len(self.label_names)

    @property
    def datalist_path(self) -> Path:
        return self.output_dir / "datalist.json"

    @property
    def inference_only(self) -> bool:
        """True when built with ``dataset_dir=None``: image preprocessing only, no datalist or datasets."""
        return self._dataset_root() is None

    def datalist(self) -> dict[str, list[dict[str, str]]]:
        """``{"training", "validation", "test"}`` lists of ``{"image", "label"}`` paths, kept in
        ``<output_dir>/datalist.json`` so a resumed run uses the same split (or a given one: ``given_datalist``)."""
        if self._datalist is None:
            self._datalist = given_datalist(self.datalist_path)
        if self._datalist is None:
            if self.inference_only:
                name = type(self).__name__
                raise ValueError(
                    f"{name} was built without a dataset_dir (dataset_dir=None: for inference only, it gives "
                    "the image preprocessing but has no cases to list, train, validate or test on); pass "
                    f"dataset_dir=<the {name} data set folder> (bundles: --dataset_dir /path/to/data) to "
                    "train or evaluate on the data set"
                )
            self._datalist = load_or_create_datalist(
                self.datalist_path, self._find_cases(), self.split, self.seed, self._datalist_info(), self._split_cases
            )
            for item in (i for items in self._datalist.values() for i in items if "subject" not in i):
                subject = self.subject_of(item)  # also on a datalist stored before items had one
                if subject is not None:
                    item["subject"] = subject
        return self._datalist

    def preprocessing(self, subset: str = "training") -> Compose:
        """The deterministic chain from file paths to the preprocessed volumes of ``subset`` (validation and test share
        the evaluation chain): the one given to the dataset methods (a bundle's), else the one built from
        ``preprocessing_steps()``. Always the instance the datasets apply, so ``Invertd(keys,
        transform=data.preprocessing(subset), orig_keys="label")`` can map a prediction back (MONAI matches ids)."""
        phase = phase_of_subset(subset)
        return self._given[phase] if phase in self._given else self._built_chain(phase)

    def inference_preprocessing(self) -> Compose:
        """Image-only preprocessing for unlabelled images (no label checks, no crop), the ``inference`` chain of
        ``preprocessing_steps()`` (bundle ``inference.json``'s ``preprocessing``); one instance, for ``Invertd``."""
        return self._built_chain(INFERENCE)

    def _built_chain(self, phase: str) -> Compose:
        if phase not in self._built:
            steps = self.preprocessing_steps()
            if phase == EVALUATION and phase_transforms(steps, EVALUATION) == phase_transforms(steps, TRAINING):
                self._built[phase] = self._built_chain(TRAINING)
            else:
                self._built[phase] = compose(steps, phase, self)
        return self._built[phase]

    def inference_items(self, path: Path) -> list[dict]:
        """The unlabelled inputs to segment at ``path`` (a file or a folder), for ``image_datalist``:
        ``{"image": path or [paths, one per channel], "case": name}`` (``"case"`` optional: it names the outputs).
        Default: NIfTI files (``calib_monai.data.inference.nifti_items``)."""
        return nifti_items(Path(path))

    def inference_case(self, image) -> str | None:
        """The case name of a datalist ``image`` entry for output file names, or None to use the (first) file's."""
        return None

    def volume_dataset(self, subset: str, preprocessing: Callable | None = None) -> CacheDataset:
        """The cached preprocessed 3D volumes of ``subset``, built once per chain; ``preprocessing``: the chain to
        apply (a bundle's), which becomes ``preprocessing(subset)``; None: the chain given before, else the own one."""
        phase = phase_of_subset(subset)  # a ValueError for another subset
        self.datalist()  # the data set's, or a given datalist.json; else the error that says what to pass
        if preprocessing is not None:
            if not callable(preprocessing):
                raise TypeError(
                    f"preprocessing of the {subset} volumes must be a transform chain (e.g. a MONAI "
                    f"Compose), got {type(preprocessing).__name__}"
                )
            self._given[phase] = preprocessing
        chain = self.preprocessing(subset)
        if subset not in self._volumes or self._volumes[subset][0] is not chain:
            items = self.datalist()[subset]
            if not items:
                raise ValueError(
                    f"the {subset} subset of {self.datalist_path} is empty; use more cases or a split "
                    "with a non-zero count for it"
                )
            logger.info("%s: preprocessing %d %s volume(s)", self.source, len(items), subset)
            self._volumes[subset] = (chain, cached_volumes(items, chain, self.cache_rate, self.num_workers))
        return self._volumes[subset][1]

    def train_dataset(
        self, transform: Callable | None = None, fraction: float = 1.0, preprocessing: Callable | None = None
    ) -> SliceDataset:
        """All axial slices of the training volumes: ``{"image": (C, H, W), "label": (1, H, W)}`` float32; ``transform``
        applied to each slice dict; ``fraction`` in (0, 1] keeps the first ``round(fraction * n)`` training volumes
        (at least one) of the seeded split; ``preprocessing``: as ``volume_dataset``."""
        fraction = float(fraction)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction (bundle key train_fraction) must be in (0, 1], got {fraction}")
        volumes = self.volume_dataset("training", preprocessing)
        if fraction < 1.0:
            volumes = Subset(volumes, range(max(1, round(fraction * len(volumes)))))
        return SliceDataset(volumes, transform=transform, drop_empty=self.drop_empty_training_slices)

    def val_dataset(self, preprocessing: Callable | None = None) -> CacheDataset:
        """Whole validation volumes ``{"image": (C, H, W, D), "label": (1, H, W, D)}`` with their meta data."""
        return self.volume_dataset("validation", preprocessing)

    def test_dataset(self, preprocessing: Callable | None = None) -> CacheDataset:
        """Whole test volumes ``{"image": (C, H, W, D), "label": (1, H, W, D)}`` with their meta data."""
        return self.volume_dataset("test", preprocessing)

    def _label_convention(self) -> str:
        """How the label files encode classes, for error messages."""
        return ", ".join(f"{k} {v}" for k, v in self.label_names.items())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(source={self.source!r}, dataset_dir={self._dataset_root()!r}, "
            f"num_classes={self.num_classes}, roi_size={self.roi_size}, spacing={self.spacing})"
        )
