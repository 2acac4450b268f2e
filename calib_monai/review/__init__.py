"""The verdict on served cases, in one home: the validated range and its review rule (:class:`ValidatedRange`,
:mod:`calib_monai.review.rule`: one full-conformal rule over the case's and the validation volumes' combined
nonconformity), the signals it ranks a case by (:mod:`~calib_monai.review.signals`,
:mod:`~calib_monai.review.input_signal`, the scalings and bounds of :mod:`~calib_monai.review.conformal`), the words of
its reasons (:mod:`~calib_monai.review.reasons`), the file next to the weights and the transforms that serve it
(:mod:`~calib_monai.review.validated_range`: :class:`CaseQualityd`, :class:`DeliveredDiced`, :func:`review_case`), and
the site monitor, a test martingale over the stream of cases one deployment serves that alarms when its cases rank
among the most extreme of the validation subjects more often than cases like them can
(:mod:`calib_monai.review.site_monitor`: the state, the guarantee; :mod:`calib_monai.review.site_martingale`: the
arithmetic). :mod:`calib_monai.recalibration` fits and publishes the range; nothing here imports it."""

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
    "read_validated_range",
    "reference_bounds",
    "reset_site",
    "review_case",
    "show_site",
]
