"""Dataset components that bundle configs name, all on ``VolumeSegmentationData`` (datalist -> MONAI preprocessing
-> cached volumes -> 2D slices), and inference on unlabelled images (``image_datalist``,
``segmentation_and_confidence``)."""

from __future__ import annotations

from calib_monai.data.acdc import ACDC
from calib_monai.data.brats import BraTS
from calib_monai.data.busi import BUSI, LoadBUSId
from calib_monai.data.facts import DatasetFacts
from calib_monai.data.flare import FLARE, FLARE22_TO_FLARE, FLARE_LABEL_NAMES
from calib_monai.data.inference import (
    ClipProbabilityRoundingd,
    ConfidenceAndSegmentationd,
    image_datalist,
    inference_preprocessing,
    segmentation_and_confidence,
)
from calib_monai.data.input_grid import ToInputGridd
from calib_monai.data.kits import KiTS
from calib_monai.data.layouts import FLARE_LAYOUTS, find_flare_cases, find_msd_cases, split_cases, split_sizes
from calib_monai.data.mrbrains import MRBRAINS18_TO_TISSUE, MRBrainS
from calib_monai.data.msd import MSDDataset
from calib_monai.data.msd_tasks import Hippocampus, Prostate
from calib_monai.data.phantoms import generate_phantom, write_phantom_dataset
from calib_monai.data.promise12 import PROMISE12
from calib_monai.data.transforms import (
    ChannelFirstd,
    CheckedLoadImaged,
    CropAroundForegroundd,
    KeepInputLabeld,
    ScaleIntensityToUnitd,
    ValidateSegmentationd,
)
from calib_monai.data.volumes import SliceDataset, VolumeSegmentationData
