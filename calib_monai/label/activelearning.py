"""Next sample by calibrated uncertainty: a scoring method that stores each unlabelled image's case quality in the
datastore, and a strategy that hands out the image the model is least sure of (imports MONAI Label).

- ``<bundle>_case_quality`` (scoring): segments every unlabelled image of the datastore with the served bundle and
  stores its case score (the estimated mean DSC of :func:`calib_monai.metrics.case_quality`, under the served
  calibration) and review flag in the image's info, ``info["calib_monai"][<bundle>]`` (persisted in the datastore's
  ``datastore_v2.json``). Images already scored with the same weights are skipped, so scoring again is cheap until a
  training publishes new weights. MONAI Label runs scoring methods in a subprocess at server start and after each
  training; ``POST /scoring/<bundle>_case_quality`` runs it on request.
- ``<bundle>_least_confident`` (strategy, "Next Sample"): the unlabelled image with the lowest stored case score,
  leaving out images this strategy handed to another annotator within ``recent_s`` seconds (two annotators never get
  the same image at once); unscored images come after the scored ones, and when every image is taken the one handed
  out longest ago.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from monailabel.interfaces.datastore import Datastore
from monailabel.interfaces.tasks.scoring import ScoringMethod
from monailabel.interfaces.tasks.strategy import Strategy

from calib_monai.label.serving import ServedBundle
from calib_monai.recalibration.stored import file_sha256

__all__ = ["INFO_KEY", "CaseQualityScoring", "LeastConfident"]

logger = logging.getLogger("calib_monai.label")
INFO_KEY = "calib_monai"  # image info: {INFO_KEY: {bundle: {"case_score", "review", "weights_sha256", "scored_at"}}}


def stored_score(info: dict[str, Any], bundle: str) -> dict[str, Any]:
    return (info.get(INFO_KEY) or {}).get(bundle) or {}


class CaseQualityScoring(ScoringMethod):
    """Score the unlabelled images of the datastore with ``served``'s case quality (see the module)."""

    def __init__(self, served: ServedBundle):
        super().__init__(f"{served.name}: case quality (estimated mean DSC) of each unlabelled image, for Next Sample")
        self.served = served

    def __call__(self, request: dict[str, Any], datastore: Datastore) -> dict[str, Any]:
        if self.served.weights is None:
            logger.warning(f"{self.served.name}: no weights to score with: {self.served.missing_weights_message()}")
            return {}
        sha = file_sha256(self.served.weights)
        scores, start = {}, time.time()
        for image_id in datastore.get_unlabeled_images():
            info = datastore.get_image_info(image_id)
            known = stored_score(info, self.served.name)
            if known.get("weights_sha256") == sha and not request.get("force"):
                scores[image_id] = known.get("case_score")
                continue
            try:
                quality = self.served.predict(datastore.get_image_uri(image_id)).quality or {}
            except Exception as err:  # one unreadable image must not stop the others; it says why in the info
                logger.warning(f"{self.served.name}: cannot score {image_id}: {err}")
                quality = {"case_score": None, "review": {"flag": None, "reasons": [str(err)]}}
            entry = {
                "case_score": quality.get("case_score"),
                "review": (quality.get("review") or {}).get("flag"),
                "weights_sha256": sha,
                "scored_at": time.time(),
            }
            mine = dict(info.get(INFO_KEY) or {})
            mine[self.served.name] = entry
            datastore.update_image_info(image_id, {INFO_KEY: mine})
            scores[image_id] = entry["case_score"]
        logger.info(f"{self.served.name}: scored {len(scores)} unlabelled image(s) in {time.time() - start:.1f} s")
        return scores


class LeastConfident(Strategy):
    """The unlabelled image ``bundle`` is least sure of, not one another annotator has just received."""

    def __init__(self, bundle: str, recent_s: float = 3600.0):
        super().__init__(f"{bundle}: the unlabelled image with the lowest estimated mean DSC (run its scoring first)")
        self.bundle, self.recent_s = bundle, float(recent_s)

    def __call__(self, request: dict[str, Any], datastore: Datastore) -> dict[str, Any]:
        name = request.get("strategy") or f"{self.bundle}_least_confident"
        client = request.get("client_id")
        now = time.time()
        ranked = []
        for image_id in datastore.get_unlabeled_images():
            info = datastore.get_image_info(image_id)
            handed = (info.get("strategy") or {}).get(name) or {}
            taken = (
                bool(handed) and now - float(handed.get("ts", 0)) < self.recent_s and handed.get("client_id") != client
            )
            score = stored_score(info, self.bundle).get("case_score")
            unscored = score is None or score != score
            ranked.append(
                (taken, float(handed.get("ts", 0)) if taken else 0.0, unscored, 0.0 if unscored else score, image_id)
            )
        if not ranked:
            return {}
        taken, _, unscored, score, image_id = min(ranked)
        return {"id": image_id, "case_score": None if unscored else score, "taken_by_another": taken}
