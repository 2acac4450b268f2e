"""The site monitor on the serving path: :class:`SiteMonitord` feeds each served case's verdict to the deployment's
:class:`~calib_monai.review.site_monitor.SiteMonitor` and, once the stream has alarmed, puts the alarm into the case's
answer (its review flag and reasons, and ``quality["site"]``), which every output then carries: ``<case>_quality.json``,
``quality.csv``, the NIfTI header, the Slicer files and MONAI Label's JSON."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Hashable, Mapping
from dataclasses import replace
from typing import Any

import torch
from monai.config import KeysCollection
from monai.transforms import MapTransform

from calib_monai.bundle.outputs import SOURCE_KEY, SOURCE_META
from calib_monai.review.anchor import CaseScoreAnchor, anchor_quality
from calib_monai.review.site_martingale import DEFAULT_DELTA
from calib_monai.review.site_monitor import SiteMonitor

__all__ = ["SiteMonitord", "image_content_hash"]

logger = logging.getLogger("calib_monai")


def image_content_hash(image: torch.Tensor) -> str:
    """BLAKE2b of the image's values, shape and dtype: the same image however its file was named or uploaded."""
    array = image.detach().cpu().contiguous().as_subclass(torch.Tensor).numpy()
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{array.dtype}{array.shape}".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


class SiteMonitord(MapTransform):
    """Record each served case in ``<site_dir>/site.json`` and say the site's state in its answer.

    Runs after :class:`~calib_monai.review.CaseQualityd` (``case_quality``: its validated range gives the
    signals and the number of validation subjects) and after the source of the outputs is recorded (``source_key``:
    the weights' and the range's SHA-256s name the state). A case the range did not rank (no range, no recalibration)
    is not counted, and ``quality["site"]`` says why. After an alarm every case is flagged, the alarm's message
    first among its reasons (the case score's level is not vouched for at this site), and ``site_alarm`` joins the
    outputs' source (the NIfTI ``descrip`` ends in ``site=ALARM``).

    Args:
        keys: the case quality (``"quality"``).
        site_dir: the deployment's folder of ``site.json`` (``inferring``: its output folder; MONAI Label: one per
            served bundle beside the datastore); None or ``""``: no monitor.
        case_quality: the ``CaseQualityd`` of the chain.
        image_key: the preprocessed image, whose content identifies the case (served twice: counted once).
        delta: the chance that the monitor ever alarms on cases like the validation ones.
    """

    def __init__(
        self,
        keys: KeysCollection = "quality",
        site_dir: str | os.PathLike | None = None,
        case_quality: Any = None,
        image_key: str = "image",
        delta: float = DEFAULT_DELTA,
        source_key: str = SOURCE_KEY,
    ) -> None:
        super().__init__(keys, allow_missing_keys=True)
        self.site_dir = os.fspath(site_dir) if site_dir else None
        self.validated_range = getattr(case_quality, "validated_range", None)
        # the range's errors (its held-out site volumes among them), once: each case adds the site's saved labels
        self._anchor = CaseScoreAnchor.from_range(self.validated_range) if self.validated_range is not None else None
        self.image_key, self.delta, self.source_key = image_key, float(delta), source_key
        self._monitors: dict[tuple[str, str], SiteMonitor] = {}

    def _monitor(self, source: Mapping[str, Any]) -> SiteMonitor | str:
        """The monitor of this source, or why there is none."""
        if not self.site_dir:
            return "no site folder (site_dir) was given"
        weights, range_sha = source.get("weights_sha256"), source.get("validated_range_sha256")
        if self.validated_range is None or not weights or not range_sha:
            return "no validated range is applied to these outputs (run calibrate)"
        key = (weights, range_sha)
        if key not in self._monitors:
            rule = self.validated_range
            self._monitors[key] = SiteMonitor(self.site_dir, weights, range_sha, rule.m, rule.signals, self.delta)
        return self._monitors[key]

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            quality = d[key]
            review = dict(quality.get("review") or {})
            monitor = self._monitor(d.get(self.source_key) or {})
            if isinstance(monitor, str) or "rank" not in review:
                why = monitor if isinstance(monitor, str) else "the case was not ranked against the validated range"
                d[key] = {**quality, "site": {"monitored": False, "why": why}}
                continue
            state = monitor.observe(image_content_hash(d[self.image_key]), review["rank"], review.get("signals"))
            site = {"monitored": True, **{k: state[k] for k in ("file", "cases", "value", "threshold", "alarm")}}
            site.update(counted=state["counted"], evidence=state["evidence"], message=state["message"])
            site["labels"] = state["labels"]
            # the site's labels: those saved since these weights served, and the range's own (Train's held-out ones)
            anchor = replace(self._anchor, site_errors=(*self._anchor.site_errors, *map(float, state["label_errors"])))
            if state["labels"]:  # they re-anchor the served score's level and its bound
                quality = anchor_quality(quality, anchor)
            if state["alarm"]:
                if anchor.anchored:  # judged case by case again, at the re-anchored level
                    offset = (quality.get("level") or {}).get("offset", 0.0)
                    count = len(anchor.site_errors)
                    message = f"{state['message']}; re-anchored from {count} site labels ({offset:+.3f})"
                    review["reasons"] = [*review.get("reasons", []), message]
                else:
                    message = state["message"]
                    review["flag"] = True
                    review["reasons"] = [message, *[r for r in review.get("reasons", []) if r != message]]
                logger.warning(message)
                # the alarm joins the outputs' source: the NIfTI descrip says "site=ALARM" (source_descrip)
                quality = {**quality, "source": {**(quality.get("source") or {}), "site_alarm": True}}
                for name in ("segmentation", "confidence"):
                    if hasattr(d.get(name), "meta") and d[name].meta.get(SOURCE_META):
                        d[name].meta = {**d[name].meta, SOURCE_META: {**d[name].meta[SOURCE_META], "site_alarm": True}}
            d[key] = {**quality, "review": review, "site": site}
        return d
