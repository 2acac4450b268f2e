"""The verdict on served cases: the validated range and its full-conformal review rule (:mod:`~.rule`), the signals
it ranks a case by (:mod:`~.signals`, :mod:`~.input_signal`, :mod:`~.conformal`), the words of its reasons
(:mod:`~.reasons`), the file next to the weights and the transforms that serve it (:mod:`~.validated_range`), and the
site monitor over one deployment's stream of cases (:mod:`~.site_monitor`, :mod:`~.site_martingale`), and each
structure's inner and outer contours with a per-case guarantee (:mod:`~.contours`, :mod:`~.contour_transform`,
:mod:`~.morphological`).
:mod:`calib_monai.recalibration` fits and publishes the range; nothing here imports it."""

from calib_monai.review.contour_transform import ContourMarginsd
from calib_monai.review.contours import CONTOURS_FILE, ContourMargins, read_contour_margins
from calib_monai.review.rule import ValidatedRange
from calib_monai.review.site_martingale import BETS, DEFAULT_DELTA, REFERENCE_SHARE, SiteMartingale, reference_bounds
from calib_monai.review.site_monitor import SITE_FILE, SiteMonitor, SiteStateError, reset_site, show_site
from calib_monai.review.site_transform import SiteMonitord, image_content_hash
from calib_monai.review.validated_range import (
    VALIDATED_RANGE_FILE,
    CaseQualityd,
    DeliveredDiced,
    load_validated_range,
    read_validated_range,
    review_case,
)

__all__ = [
    "BETS",
    "CONTOURS_FILE",
    "ContourMargins",
    "ContourMarginsd",
    "DEFAULT_DELTA",
    "REFERENCE_SHARE",
    "SITE_FILE",
    "VALIDATED_RANGE_FILE",
    "CaseQualityd",
    "DeliveredDiced",
    "SiteMartingale",
    "SiteMonitor",
    "SiteMonitord",
    "SiteStateError",
    "ValidatedRange",
    "image_content_hash",
    "load_validated_range",
    "read_contour_margins",
    "read_validated_range",
    "reference_bounds",
    "reset_site",
    "review_case",
    "show_site",
]
