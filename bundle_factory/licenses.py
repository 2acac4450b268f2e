"""The terms of each data set, written to every bundle as ``docs/data_license.txt`` (the model zoo asks for that file
whenever the data a bundle uses carry license conditions).

Each entry says what the data set's own source states, and says so when a license could not be confirmed from
that source: then the file names where to check. The bundles ship no data; these terms bind whoever downloads a data
set, and may also reach the weights trained on it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

__all__ = ["DataTerms", "ACDC", "BRATS", "BUSI", "FLARE", "KITS", "MRBRAINS", "MSD", "PROMISE12"]


@dataclass(frozen=True)
class DataTerms:
    title: str
    sources: tuple[str, ...]  # where the data and their terms are published
    license: str  # one line, for the bundle README
    terms: str  # what the source states, and what could not be confirmed
    citations: tuple[str, ...]

    def text(self) -> str:
        """``docs/data_license.txt``."""
        wrap = textwrap.TextWrapper(width=100, break_on_hyphens=False, break_long_words=False)
        lines = ["Third-party data terms", "", self.title, *("  " + s for s in self.sources), ""]
        lines += ["License: " + self.license, ""]
        lines += wrap.wrap(self.terms) + [""]
        lines += ["Cite when you use the data:"]
        cite = textwrap.TextWrapper(
            width=100, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
        )
        for citation in self.citations:
            lines += cite.wrap(citation)
        lines += [
            "",
            *wrap.wrap(
                "This bundle ships no data: the data set is downloaded from its source, under its terms. Weights "
                "trained on it (models/model.pt, written by the bundle's training run) may be bound by the same "
                "terms. This file summarises the terms as the sources state them; it does not replace them."
            ),
        ]
        return "\n".join(lines) + "\n"


MSD = DataTerms(
    title="Medical Segmentation Decathlon (MSD): Task04_Hippocampus (Vanderbilt University Medical Center) and "
    "Task05_Prostate",
    sources=("http://medicaldecathlon.com/",),
    license="CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/)",
    terms="The MSD home page releases all its data under the Creative Commons Attribution-ShareAlike 4.0 "
    "International license: the data may be shared and adapted, also commercially, with attribution, and "
    "adaptations are shared under the same license.",
    citations=(
        'Antonelli M. et al., "The Medical Segmentation Decathlon", Nature Communications 13, 4128, 2022.',
        'Simpson A.L. et al., "A large annotated medical image dataset for the development and evaluation of '
        'segmentation algorithms", arXiv:1902.09063, 2019 (the citation the MSD home page asks for).',
    ),
)

FLARE = DataTerms(
    title="FLARE abdominal CT: FLARE 2021 and FLARE 2022 (MICCAI challenges)",
    sources=("https://flare.grand-challenge.org/", "https://flare22.grand-challenge.org/"),
    license="not confirmed: no license is stated on the challenge pages read",
    terms="No license for the FLARE images and labels was found on the challenge pages read for this file. The "
    "FLARE 2022 rules forbid redistributing or transferring the data or their download link and ask participants "
    "to use the data only themselves; they say the data become free to use after the challenge summary paper "
    "(31 January 2023). Many FLARE cases come from earlier public data sets with their own terms. Check the "
    "challenge pages before you download or use the data. Without --dataset_dir the bundle trains on synthetic "
    "phantoms made by calib_monai.data.phantoms: no third-party data, under the bundle's own LICENSE.",
    citations=(
        'Ma J. et al., "Fast and low-GPU-memory abdomen CT organ segmentation: the FLARE challenge", Medical Image '
        "Analysis 82, 102616, 2022 (FLARE 2021).",
        'Ma J. et al., "Unleashing the strengths of unlabeled data in pan-cancer abdominal organ quantification: '
        'the FLARE22 challenge", arXiv, 2023 (FLARE 2022).',
    ),
)

ACDC = DataTerms(
    title="ACDC: Automated Cardiac Diagnosis Challenge (MICCAI 2017), University Hospital of Dijon",
    sources=("https://www.creatis.insa-lyon.fr/Challenge/acdc/", "https://humanheart-project.creatis.insa-lyon.fr/"),
    license="not confirmed from the organisers' pages; mirrors declare CC BY-NC-SA 4.0",
    terms="The organisers require that any use of the ACDC database cites Bernard et al. 2018 (below). A license "
    "was not found on the organisers' pages read for this file; copies of the data set elsewhere declare "
    "CC BY-NC-SA 4.0 (non-commercial, share-alike). Check the terms on the download page (the Human Heart "
    "Project) before use.",
    citations=(
        'Bernard O., Lalande A., Zotti C., Cervenansky F. et al., "Deep learning techniques for automatic MRI '
        'cardiac multi-structures segmentation and diagnosis: is the problem solved?", IEEE Transactions on '
        "Medical Imaging 37(11), 2514-2525, 2018, doi:10.1109/TMI.2018.2837502.",
    ),
)

BRATS = DataTerms(
    title="BraTS 2019: Multimodal Brain Tumor Segmentation Challenge 2019 (CBICA, University of Pennsylvania)",
    sources=("https://www.med.upenn.edu/cbica/brats2019/data.html",),
    license="use in research with the BraTS citations (data usage agreement)",
    terms="The data are obtained through the organisers' registration and data request. The BraTS data usage "
    "agreement, as the BraTS 2018 data page states it (quoted in the MONAI model zoo's brats_mri_segmentation "
    "bundle), lets you use and refer to the BraTS data sets in your own research provided you always cite the "
    "BraTS manuscripts, and asks for the TCIA data citations where the venue allows. The BraTS 2019 page itself "
    "was not read for this file: check it before use. Part of the data come from The Cancer Imaging Archive "
    "collections TCGA-GBM and TCGA-LGG, which have their own terms.",
    citations=(
        'Menze B.H. et al., "The Multimodal Brain Tumor Image Segmentation Benchmark (BRATS)", IEEE Transactions on '
        "Medical Imaging 34(10), 1993-2024, 2015, doi:10.1109/TMI.2014.2377694.",
        'Bakas S. et al., "Advancing The Cancer Genome Atlas glioma MRI collections with expert segmentation labels '
        'and radiomic features", Nature Scientific Data 4, 170117, 2017, doi:10.1038/sdata.2017.117.',
        'Bakas S. et al., "Identifying the best machine learning algorithms for brain tumor segmentation, '
        'progression assessment, and overall survival prediction in the BRATS challenge", arXiv:1811.02629, 2018.',
        'Bakas S. et al., "Segmentation labels and radiomic features for the pre-operative scans of the TCGA-GBM '
        'collection", The Cancer Imaging Archive, 2017, doi:10.7937/K9/TCIA.2017.KLXWJJ1Q.',
        'Bakas S. et al., "Segmentation labels and radiomic features for the pre-operative scans of the TCGA-LGG '
        'collection", The Cancer Imaging Archive, 2017, doi:10.7937/K9/TCIA.2017.GJQ7R0EF.',
    ),
)

PROMISE12 = DataTerms(
    title="PROMISE12: prostate MR image segmentation challenge (MICCAI 2012)",
    sources=("https://promise12.grand-challenge.org/",),
    license="not confirmed: no license is stated on the challenge page read",
    terms="The challenge's Details page read for this file states no license for the images and reference "
    "segmentations; the data are downloaded from the challenge site after registration, under its rules and "
    "grand-challenge.org's terms of service. Check them before use.",
    citations=(
        'Litjens G. et al., "Evaluation of prostate segmentation algorithms for MRI: the PROMISE12 challenge", '
        "Medical Image Analysis 18(2), 359-373, 2014.",
    ),
)

KITS = DataTerms(
    title="KiTS19: 2019 Kidney and Kidney Tumor Segmentation Challenge",
    sources=("https://kits19.grand-challenge.org/data/", "https://github.com/neheller/kits19"),
    license="CC BY-NC-SA 4.0, as reported for the KiTS19 data page (not read from it here)",
    terms="Third-party documentation of KiTS19 (FLamby's) gives the data license as Creative Commons "
    "Attribution-NonCommercial-ShareAlike 4.0 with the data set terms of the KiTS19 data page: non-commercial "
    "use, attribution, adaptations under the same license. That page was not read for this file and the "
    "official repository's README does not state a license: check the data page before use.",
    citations=(
        'Heller N. et al., "The KiTS19 challenge data: 300 kidney tumor cases with clinical context, CT semantic '
        'segmentations, and surgical outcomes", arXiv:1904.00445, 2019.',
        'Heller N. et al., "The state of the art in kidney and kidney tumor segmentation in contrast-enhanced CT '
        'imaging: results of the KiTS19 challenge", Medical Image Analysis 67, 101821, 2021.',
    ),
)

MRBRAINS = DataTerms(
    title="MRBrainS18: Grand Challenge on MR Brain Segmentation at MICCAI 2018",
    sources=("https://mrbrains18.isi.uu.nl/",),
    license="not confirmed",
    terms="The terms of the MRBrainS18 data were not established for this file. The Terms of Participation of the "
    "earlier MRBrainS13 challenge forbid giving the data, or data derived from them, to anyone outside the "
    "registered team and limit their use to preparing a challenge entry; whether MRBrainS18's data carry the "
    "same or later, more open terms is not known here. Check the challenge site (and any later public release of "
    "the data) before use.",
    citations=(
        "The citation the challenge site asks for; for the MRBrainS evaluation framework: Mendrik A.M. et al., "
        '"MRBrainS challenge: online evaluation framework for brain image segmentation in 3T MRI scans", '
        "Computational Intelligence and Neuroscience, 2015.",
    ),
)

BUSI = DataTerms(
    title="BUSI: Breast Ultrasound Images (Baheya Hospital, Cairo), distributed by the authors",
    sources=("https://scholar.cu.edu.eg/?q=afahmy/pages/dataset", "https://doi.org/10.1016/j.dib.2019.104863"),
    license="not confirmed: no license for the images found",
    terms="No license for the images and masks was found stated by the authors; the article that describes the "
    "data set (Data in Brief) is open access, and copies of the data set elsewhere declare differing licenses. "
    "Check with the authors' page before use. Pawlowska et al. (Data in Brief 48, 109247, 2023) report duplicated "
    "images and inconsistent labels in this data set.",
    citations=(
        'Al-Dhabyani W., Gomaa M., Khaled H., Fahmy A., "Dataset of breast ultrasound images", Data in Brief 28, '
        "104863, 2020, doi:10.1016/j.dib.2019.104863.",
    ),
)
