"""What varies between the generated bundles: the methods (losses) and the data sets.

Hyper-parameters are the papers' (NACL journal Sec. 4.1 and CRaC Sec. 3): focal gamma 3, ECP 0.1, label smoothing
0.1, SVLS sigma 2 (3x3), MbLS margin 10 and lambda 0.1 (the MbLS and CRaC papers; the NACL journal used 5), NACL
lambda 0.1 with a 3x3 mean prior, CRaC with the ``tolerance`` preset (``CRaCLoss.preset``: the constraint
``|tau - l| <= 2`` with rho0 1, chosen by the ablation in ``docs/results``) and 75 epochs as in the authors'
code; hL1-ACE and sL1-ACE as the average calibration losses' authors configure them (cai4cai/Average-Calibration-Losses,
``bundle_templates/configs/loss/{hard,soft}l1ace_dice_ce.yaml``): DiceCE (squared-probability Dice) plus mL1-ACE over
20 bins, the three terms weighted equally (0.33 each there, 1 each here), soft bins below a weight of 0.01 dropped.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from bundle_factory import licenses
from bundle_factory.licenses import DataTerms
from calib_monai.data.facts import DatasetFacts
from calib_monai.defaults import L1ACE_NUM_BINS
from calib_monai.losses.crac import PRESETS

__all__ = ["DATASETS", "METHODS", "RESULTS", "Dataset", "Method"]


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
    terms: DataTerms  # the data set's license and citations: docs/data_license.txt
    args: dict[str, Any] = field(default_factory=dict)  # extra constructor arguments
    demo: dict[str, Any] | None = None  # overrides of configs/demo.json (data sets with embedded demo data)
    review: dict[str, Any] = field(default_factory=dict)  # calibrate.json's review_* settings other than the library's

    @property
    def component_class(self) -> type:
        module, _, name = self.component.rpartition(".")
        return getattr(importlib.import_module(module), name)

    @property
    def facts(self) -> DatasetFacts:
        facts = self.component_class.facts
        if facts is None:
            raise ValueError(
                f"{self.component}.facts is None: a bundle's data set must state its classes, channels "
                "and ROI (calib_monai.data.DatasetFacts) in the component class"
            )
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
        {
            "_target_": "calib_monai.losses.CRaCLoss",
            "classes": "@num_classes",
            "dim": 2,
            "kernel_size": 3,
            **PRESETS["tolerance"],
        },
        ("Murugesan B. et al., Class and Region-Adaptive Constraints for Network Calibration, MICCAI 2024",),
        epochs=75,
        alm=True,
    ),
    "hl1ace": Method(
        "DiceCE + hard-binned marginal L1 average calibration error (hL1-ACE, 20 bins, equal weights)",
        {
            "_target_": "calib_monai.losses.HardL1ACELoss",
            "num_bins": L1ACE_NUM_BINS,
            "lambda_ace": 1.0,
            "lambda_dice": 1.0,
            "lambda_ce": 1.0,
        },
        ACE_REFS,
    ),
    "sl1ace": Method(
        "DiceCE + soft-binned marginal L1 average calibration error (sL1-ACE, 20 bins, equal weights)",
        {
            "_target_": "calib_monai.losses.SoftL1ACELoss",
            "num_bins": L1ACE_NUM_BINS,
            "lambda_ace": 1.0,
            "lambda_dice": 1.0,
            "lambda_ce": 1.0,
            "empty_weight": 0.01,
        },
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
        terms=licenses.FLARE,
        # coarser spacing so that a 96 x 96 x 16 crop still holds the four organs (and runs 4x faster)
        demo={
            "epochs": 40,
            "lr": 0.003,
            "lr_milestone": 32,
            "roi_size": [96, 96, 16],
            "data#spacing": [3.2, 3.2, 12.0],
            "data#num_phantoms": 16,
        },
    ),
    "acdc": Dataset(
        title="ACDC cardiac cine MRI (RV, myocardium, LV)",
        component="calib_monai.data.ACDC",
        modality="MR",
        data_source="ACDC 2017 training set (https://www.creatis.insa-lyon.fr/Challenge/acdc/), ED and ES frames, "
        "70/10/20 patients (splits/*.list when present)",
        terms=licenses.ACDC,
        # 10 validation patients: the review rule counts patients (two frames each are not exchangeable cases), and
        # at alpha 0.05 k = floor(0.05 x 11) = 0 cannot flag; at 0.1, k = 1 and the bound is 1 / 11 = 9.1%
        review={"review_alpha": 0.1},
    ),
    "brats": Dataset(
        title="BraTS 2019 brain tumours (NCR/NET, edema, enhancing tumour; ET/TC/WT regions)",
        component="calib_monai.data.BraTS",
        modality="MR",
        data_source="BraTS 2019 training data (MICCAI_BraTS_2019_Data_Training/{HGG,LGG}), 235/35/65",
        terms=licenses.BRATS,
    ),
    "prostate": Dataset(
        title="MSD prostate (peripheral and transition zones)",
        component="calib_monai.data.Prostate",
        modality="MR",
        data_source="Medical Segmentation Decathlon Task05_Prostate (http://medicaldecathlon.com/), 22/3/7",
        terms=licenses.MSD,
    ),
    "promise12": Dataset(
        title="PROMISE12 prostate MRI",
        component="calib_monai.data.PROMISE12",
        modality="MR",
        data_source="PROMISE12 training cases (https://promise12.grand-challenge.org/), 30/5/15",
        terms=licenses.PROMISE12,
    ),
    "kits": Dataset(
        title="KiTS19 kidney and kidney tumour CT",
        component="calib_monai.data.KiTS",
        modality="CT",
        data_source="KiTS19 (https://kits19.grand-challenge.org/), resampled to 3.22 x 1.62 x 1.62 mm, 150/25/40",
        terms=licenses.KITS,
    ),
    "mrbrains": Dataset(
        title="MRBrainS18 brain tissue (GM, WM, CSF)",
        component="calib_monai.data.MRBrainS",
        modality="MR",
        data_source="MRBrainS18 training subjects (https://mrbrains18.isi.uu.nl/), leave-one-out over 7 subjects "
        "(data#fold 0..6)",
        terms=licenses.MRBRAINS,
        args={"fold": 0},
    ),
    "hpc": Dataset(
        title="MSD hippocampus (anterior, posterior)",
        component="calib_monai.data.Hippocampus",
        modality="MR",
        data_source="Medical Segmentation Decathlon Task04_Hippocampus (http://medicaldecathlon.com/), 185/25/50",
        terms=licenses.MSD,
    ),
    "busi": Dataset(
        title="BUSI breast ultrasound lesions (benign and malignant)",
        component="calib_monai.data.BUSI",
        modality="US",
        data_source="Breast Ultrasound Images (Al-Dhabyani et al. 2020), benign + malignant, 445/65/137; 2D images "
        "handled as volumes of depth 1",
        terms=licenses.BUSI,
    ),
}


# The studies of docs/results (one folder each, the numbers and the commands there) and the bundles they trained:
# folder -> (data set, methods). The bundle READMEs point to them; no measured number is written in code.
_EIGHT = ("ce_dice", "focal", "ecp", "ls", "svls", "mbls", "nacl", "crac")
_CRAC_STUDY = ("ce_dice", "nacl", "crac")
RESULTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "hpc/main": ("hpc", _EIGHT),
    "hpc/noise": ("hpc", ("ce_dice", "nacl")),
    "hpc/calibrated": ("hpc", _EIGHT),
    "hpc/crac_ablation": ("hpc", _CRAC_STUDY),
    "hpc_18epochs/main": ("hpc", ("ce_dice", "nacl")),
    "hpc_18epochs/crac_ablation": ("hpc", _CRAC_STUDY),
    "hpc_crac_grid/crac_ablation": ("hpc", _CRAC_STUDY),
    "acdc/main": ("acdc", _EIGHT),
    "acdc/noise": ("acdc", ("ce_dice", "nacl")),
    "acdc/calibrated": ("acdc", _EIGHT),
    "acdc/crac_ablation": ("acdc", _CRAC_STUDY),
    "acdc_24epochs/crac_ablation": ("acdc", _CRAC_STUDY),
    "acdc_40epochs/crac_ablation": ("acdc", _CRAC_STUDY),
    "flare_demo": ("flare", ("nacl",)),
}
