"""The package's defaults, each written once: changing one here changes it everywhere (``tests/test_defaults.py``
fails when one of these literals is written again as a default elsewhere in the package).
"""

from __future__ import annotations

__all__ = [
    "BAND_RADIUS",
    "CALIBRATION_SPLIT",
    "CASE_SCORE_BOUND_ALPHA",
    "CONTOUR_ALPHA",
    "CONTOUR_EPSILON",
    "CONTOUR_RISK",
    "CROSSFIT",
    "CROSSFIT_FOLDS",
    "EMPTY_CLASS",
    "FEATURE_DIM",
    "L1ACE_NUM_BINS",
    "LOW_CONFIDENCE",
    "LTS_STEPS",
    "MAX_REFERENCE",
    "MAX_SLICES",
    "MAX_VOXELS",
    "NUM_BINS",
    "RECALIBRATION_METHOD",
    "RECALIBRATION_VOXELS",
    "REVIEW_ALPHA",
    "REVIEW_FEATURE_CHECK",
    "REVIEW_INPUT_CHECK",
    "REVIEW_SCORE_CHECK",
    "REVIEW_VOLUME_FACTOR",
    "SITE_LABELS_MIN",
    "TACE_THRESHOLD",
    "VOLUME_COVERAGE",
]

# ---- metrics and reports
# Equal-width confidence bins of ECE, classwise ECE, TACE and the reliability diagram (Guo et al. 2017 use 15).
NUM_BINS = 15
# Barfoot et al.'s mL1-ACE (the metric and the L1-ACE losses) uses 20 bins.
L1ACE_NUM_BINS = 20
# TACE leaves out class probabilities at or below this (Nixon et al. 2019).
TACE_THRESHOLD = 1e-3
# A voxel whose top probability is below this is "low confidence": the case's share, the report, the Slicer segment
# and MONAI Label's review map.
LOW_CONFIDENCE = 0.8
# The DSC and HD95 of a class absent from both label and prediction: "nan" (left out) or "papers" (DSC 1).
EMPTY_CLASS = "nan"
# Voxels within this distance (in voxels) of the predicted and true structures form the report's band (ece_band).
BAND_RADIUS = 3
# The volume interval holds the true volume with this probability (its conformal scale is fitted for it).
VOLUME_COVERAGE = 0.95
# Principal components of the pooled network features the Mahalanobis distance keeps.
FEATURE_DIM = 16

# ---- the calibrate step (calib_monai.recalibration.RecalibrationSettings, the bundles' calibrate.json)
# Local temperature scaling: the one recalibration that keeps the probabilities readable as case quality for every
# loss (the quality study, docs/results); a change needs that study rerun.
RECALIBRATION_METHOD = "local_temperature"
# Temperature scaling fits on the ground-truth foreground voxels, where the papers' ECE is measured.
RECALIBRATION_VOXELS = "foreground"
# Cross-fitting puts every validation volume in the range, each scored by a fit that did not see it; in halves.
CROSSFIT = True
CROSSFIT_FOLDS = 2
# Without cross-fitting: the share of validation subjects that fit the recalibration (the others measure the range).
CALIBRATION_SPLIT = 0.5
# Fit budgets: temperature scaling's voxel sample, local temperature scaling's slices and Adam steps.
MAX_VOXELS = 2_000_000
MAX_SLICES = 4_000
LTS_STEPS = 300
# Training images measured as the input and feature signals' fixed reference.
MAX_REFERENCE = 200

# ---- the review rule (calib_monai.review.ValidatedRange)
# The false-flag bound the rule is set for; k = floor(alpha (m + 1)) >= 1 needs m >= 19 validation subjects at 0.05.
REVIEW_ALPHA = 0.05
# The volume rule is off (0); on (>= 1), a class's expected volume outside the validation volumes' range widened by
# this factor is flagged.
REVIEW_VOLUME_FACTOR = 0.0
# The signals a case is ranked by: its case score, its image statistics and its network features.
REVIEW_SCORE_CHECK = True
REVIEW_INPUT_CHECK = True
REVIEW_FEATURE_CHECK = True

# ---- the case score's level (calib_monai.review.anchor)
# The served lower bound on the true DSC holds with probability 1 - this; it needs 9 labelled validation subjects.
CASE_SCORE_BOUND_ALPHA = 0.1
# The fewest site labels that re-anchor the case score's level (the mean's t margin needs two).
SITE_LABELS_MIN = 2

# ---- the contours (calib_monai.review.contours, calibrate.json's contour_*)
# Each structure's outer contour holds at least 1 - epsilon of it, and its inner contour lies at least 1 - epsilon
# inside it, each for at least 1 - alpha of cases ("per_case"); "expected": the expected missed fraction <= alpha.
CONTOUR_ALPHA = 0.1
CONTOUR_EPSILON = 0.02
CONTOUR_RISK = "per_case"
