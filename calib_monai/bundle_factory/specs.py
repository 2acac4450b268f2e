"""What varies between the generated bundles: the methods (losses) and the data sets.

Hyper-parameters are the papers' (NACL journal Sec. 4.1 and CRaC Sec. 3): focal gamma 3, ECP 0.1, label smoothing
0.1, SVLS sigma 2 (3x3), MbLS margin 10 and lambda 0.1 (the MbLS and CRaC papers; the NACL journal used 5), NACL
lambda 0.1 with a 3x3 mean prior, CRaC with the authors' ALM settings and 75 epochs as in their code; hL1-ACE and
sL1-ACE as the average calibration losses' authors configure them (cai4cai/Average-Calibration-Losses,
``bundle_templates/configs/loss/{hard,soft}l1ace_dice_ce.yaml``): DiceCE (squared-probability Dice) plus mL1-ACE over
20 bins, the three terms weighted equally (0.33 each there, 1 each here), soft bins below a weight of 0.01 dropped.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from calib_monai.data.facts import DatasetFacts
from calib_monai.losses.crac import PRESETS

__all__ = ["DATASETS", "MEASURED", "METHODS", "Dataset", "Method"]


@dataclass(frozen=True)
class Method:
    title: str
    loss: dict[str, Any]  # config component; "@num_classes" is available
    references: tuple[str, ...]
    epochs: int = 100
    alm: bool = False  # CRaC: add the ALM outer-update handler and checkpoint the loss


@dataclass(frozen=True)
class Dataset:
    """A data set's bundle description. Its classes, channels and ROI are not repeated here: they are the component
    class's ``facts`` (``calib_monai.data.DatasetFacts``), read through the properties below."""

    title: str
    component: str  # calib_monai.data class
    modality: str
    data_source: str
    args: dict[str, Any] = field(default_factory=dict)  # extra constructor arguments
    demo: dict[str, Any] | None = None  # overrides of configs/demo.json (data sets with embedded demo data)

    @property
    def component_class(self) -> type:
        module, _, name = self.component.rpartition(".")
        return getattr(importlib.import_module(module), name)

    @property
    def facts(self) -> DatasetFacts:
        facts = self.component_class.facts
        if facts is None:
            raise ValueError(f"{self.component}.facts is None: a bundle's data set must state its classes, channels "
                             "and ROI (calib_monai.data.DatasetFacts) in the component class")  # fmt: skip
        return facts

    @property
    def label_names(self) -> dict[str, str]:
        return dict(self.facts.label_names)

    @property
    def num_classes(self) -> int:
        return self.facts.num_classes

    @property
    def in_channels(self) -> int:
        return self.facts.in_channels

    @property
    def channel_names(self) -> tuple[str, ...]:
        return tuple(self.facts.channel_names)

    @property
    def roi_size(self) -> tuple[int, int, int]:
        return tuple(self.facts.roi_size)

    @property
    def regions(self) -> dict[str, list[int]] | None:
        """Evaluation regions (unions of classes), e.g. BraTS ET/TC/WT."""
        regions = self.facts.regions
        return None if regions is None else {name: list(classes) for name, classes in regions.items()}


NACL_REFS = (
    "Murugesan B. et al., Trust your neighbours: Penalty-based constraints for model calibration, MICCAI 2023",
    "Murugesan B. et al., Neighbor-Aware Calibration of Segmentation Networks with Penalty-Based Constraints, "
    "Medical Image Analysis 2025 (arXiv:2401.14487)",
)

ACE_REFS = (
    "Barfoot T. et al., Average Calibration Losses for Reliable Uncertainty in Medical Image Segmentation, "
    "arXiv:2506.03942 (IEEE Transactions on Medical Imaging 2026); code: github.com/cai4cai/Average-Calibration-Losses",
    "Barfoot T. et al., Average Calibration Error: A Differentiable Loss for Improved Reliability in Image "
    "Segmentation, MICCAI 2024",
)

METHODS: dict[str, Method] = {
    "ce_dice": Method("cross-entropy + Dice", {"_target_": "calib_monai.losses.CEDiceLoss"}, NACL_REFS),
    "focal": Method(
        "focal loss (gamma 3)",
        {"_target_": "calib_monai.losses.FocalLoss", "gamma": 3.0},
        ("Lin T.-Y. et al., Focal Loss for Dense Object Detection, ICCV 2017",) + NACL_REFS,
    ),
    "ecp": Method(
        "cross-entropy with a confidence (entropy) penalty",
        {"_target_": "calib_monai.losses.ECPLoss", "alpha": 0.1},
        ("Pereyra G. et al., Regularizing Neural Networks by Penalizing Confident Output Distributions, ICLR-W 2017",),
    ),
    "ls": Method(
        "label smoothing (alpha 0.1)",
        {"_target_": "calib_monai.losses.LabelSmoothingLoss", "alpha": 0.1},
        ("Szegedy C. et al., Rethinking the Inception Architecture for Computer Vision, CVPR 2016",),
    ),
    "svls": Method(
        "spatially varying label smoothing (3x3, sigma 2)",
        {"_target_": "calib_monai.losses.SVLSLoss", "kernel_size": 3, "sigma": 2.0},
        ("Islam M., Glocker B., Spatially Varying Label Smoothing, IPMI 2021",),
    ),
    "mbls": Method(
        "margin-based label smoothing (margin 10, lambda 0.1)",
        {"_target_": "calib_monai.losses.MbLSLoss", "margin": 10.0, "alpha": 0.1},
        ("Murugesan B. et al., Calibrating Segmentation Networks with Margin-based Label Smoothing, MedIA 2023",),
    ),
    "nacl": Method(
        "neighbour-aware calibration (NACL: lambda 0.1, 3x3 mean prior)",
        {
            "_target_": "calib_monai.losses.NACLLoss",
            "classes": "@num_classes",
            "dim": 2,
            "kernel_size": 3,
            "kernel_ops": "mean",
            "distance_type": "l1",
            "alpha": 0.1,
        },
        NACL_REFS,
    ),
    "crac": Method(
        "class- and region-adaptive constraints (CRaC, Augmented Lagrangian)",
        # the "tolerance" preset (|tau - l| <= eps, so multipliers can fall), chosen by the CRaC ablation
        {"_target_": "calib_monai.losses.CRaCLoss", "classes": "@num_classes", "dim": 2, "kernel_size": 3,
         **PRESETS["tolerance"]},  # fmt: skip
        ("Murugesan B. et al., Class and Region-Adaptive Constraints for Network Calibration, MICCAI 2024",),
        epochs=75,
        alm=True,
    ),
    "hl1ace": Method(
        "DiceCE + hard-binned marginal L1 average calibration error (hL1-ACE, 20 bins, equal weights)",
        {"_target_": "calib_monai.losses.HardL1ACELoss", "num_bins": 20, "lambda_ace": 1.0, "lambda_dice": 1.0,
         "lambda_ce": 1.0},  # fmt: skip
        ACE_REFS,
    ),
    "sl1ace": Method(
        "DiceCE + soft-binned marginal L1 average calibration error (sL1-ACE, 20 bins, equal weights)",
        {"_target_": "calib_monai.losses.SoftL1ACELoss", "num_bins": 20, "lambda_ace": 1.0, "lambda_dice": 1.0,
         "lambda_ce": 1.0, "empty_weight": 0.01},  # fmt: skip
        ACE_REFS,
    ),
}

DATASETS: dict[str, Dataset] = {
    "flare": Dataset(
        title="FLARE abdominal CT (liver, kidney, spleen, pancreas)",
        component="calib_monai.data.FLARE",
        modality="CT",
        data_source="FLARE21/FLARE22 abdominal CT (https://flare22.grand-challenge.org/); synthetic phantoms "
        "generated by calib_monai.data.phantoms when no dataset_dir is given",
        # coarser spacing so that a 96 x 96 x 16 crop still holds the four organs (and runs 4x faster)
        demo={"epochs": 40, "roi_size": [96, 96, 16], "data#spacing": [3.2, 3.2, 12.0], "data#num_phantoms": 12},
    ),
    "acdc": Dataset(
        title="ACDC cardiac cine MRI (RV, myocardium, LV)",
        component="calib_monai.data.ACDC",
        modality="MR",
        data_source="ACDC 2017 training set (https://www.creatis.insa-lyon.fr/Challenge/acdc/), ED and ES frames, "
        "70/10/20 patients (splits/*.list when present)",
    ),
    "brats": Dataset(
        title="BraTS 2019 brain tumours (NCR/NET, edema, enhancing tumour; ET/TC/WT regions)",
        component="calib_monai.data.BraTS",
        modality="MR",
        data_source="BraTS 2019 training data (MICCAI_BraTS_2019_Data_Training/{HGG,LGG}), 235/35/65",
    ),
    "prostate": Dataset(
        title="MSD prostate (peripheral and transition zones)",
        component="calib_monai.data.Prostate",
        modality="MR",
        data_source="Medical Segmentation Decathlon Task05_Prostate (http://medicaldecathlon.com/), 22/3/7",
    ),
    "promise12": Dataset(
        title="PROMISE12 prostate MRI",
        component="calib_monai.data.PROMISE12",
        modality="MR",
        data_source="PROMISE12 training cases (https://promise12.grand-challenge.org/), 30/5/15",
    ),
    "kits": Dataset(
        title="KiTS19 kidney and kidney tumour CT",
        component="calib_monai.data.KiTS",
        modality="CT",
        data_source="KiTS19 (https://kits19.grand-challenge.org/), resampled to 3.22 x 1.62 x 1.62 mm, 150/25/40",
    ),
    "mrbrains": Dataset(
        title="MRBrainS18 brain tissue (GM, WM, CSF)",
        component="calib_monai.data.MRBrainS",
        modality="MR",
        data_source="MRBrainS18 training subjects (https://mrbrains18.isi.uu.nl/), leave-one-out over 7 subjects "
        "(data#fold 0..6)",
        args={"fold": 0},
    ),
    "hpc": Dataset(
        title="MSD hippocampus (anterior, posterior)",
        component="calib_monai.data.Hippocampus",
        modality="MR",
        data_source="Medical Segmentation Decathlon Task04_Hippocampus (http://medicaldecathlon.com/), 185/25/50",
    ),
    "busi": Dataset(
        title="BUSI breast ultrasound lesions (benign and malignant)",
        component="calib_monai.data.BUSI",
        modality="US",
        data_source="Breast Ultrasound Images (Al-Dhabyani et al. 2020), benign + malignant, 445/65/137; 2D images "
        "handled as volumes of depth 1",
    ),
}


# Results measured with the bundle (docs/README.md "Measured results"); a bundle not listed has none yet.
MEASURED: dict[str, str] = {
    "nacl_flare": (
        "Demo profile on the embedded phantoms (`configs/demo.json`: 12 phantoms at 3.2 x 3.2 x 12 mm, training "
        "volumes cropped around the organs to 96 x 96 x 16, validation and test phantoms scored whole, 120 x 120 x 20; "
        "split 8/1/3, 40 epochs), 2 CPU cores, 70 s for training (2026-11-23):\n\n"
        "| set | mean DSC | HD95 (mm) | ASD (mm) | ECE | CECE | TACE | ECE (pred or GT) | NLL | Brier |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        "| validation (1 volume, epoch 40) | 0.421 | | | 0.050 | | | | | |\n"
        "| test (3 volumes, `evaluate.json`) | 0.427 | 88.9 | 33.6 | 0.101 | 0.148 | 0.150 | 0.105 | 0.994 "
        "| 0.518 |\n\n"
        "Commands: the demo command above, then `evaluating` with "
        "`['.../train.json','.../demo.json','.../evaluate.json']`. Until 2026-11-22 the validation and test volumes "
        "were cropped around their labels like the training volumes (0.594 test DSC then); the same model as above "
        "scores 0.585 DSC, ECE 0.119 on test volumes cropped that way (`--validate#preprocessing "
        "%train#preprocessing`): the whole volumes add the slices and the body outside the organs' window, where "
        "inference also predicts. No FLARE data was available here: the papers' protocol on real FLARE has not been "
        "run with this bundle yet."
    ),
}
