"""The review of served cases beyond one case's verdict: for now the site monitor, a test martingale over
the stream of cases one deployment serves that alarms when its cases rank among the most extreme of the validation
subjects more often than cases like them can (:mod:`calib_monai.review.site_monitor`: the state, the guarantee;
:mod:`calib_monai.review.site_martingale`: the arithmetic)."""

from calib_monai.review.site_martingale import BETS, DEFAULT_DELTA, REFERENCE_SHARE, SiteMartingale, reference_bounds
from calib_monai.review.site_monitor import SITE_FILE, SiteMonitor, SiteStateError, reset_site, show_site
from calib_monai.review.site_transform import SiteMonitord, image_content_hash

__all__ = [
    "BETS",
    "DEFAULT_DELTA",
    "REFERENCE_SHARE",
    "SITE_FILE",
    "SiteMartingale",
    "SiteMonitor",
    "SiteMonitord",
    "SiteStateError",
    "image_content_hash",
    "reference_bounds",
    "reset_site",
    "show_site",
]
