"""Next Sample (imports MONAI Label): ``<bundle>_case_quality`` stores each image's case score, review flag and pooled
features in ``info["calib_monai"][<bundle>]`` (labelled images too; those scored with the same weights are skipped);
the strategies ``<bundle>_most_typical`` (TypiClust, :func:`calib_monai.label.selection.next_to_label`),
``<bundle>_typical_least_confident`` and ``<bundle>_least_confident`` hand out the image to label next. None hands out
an image given to another annotator within ``recent_s`` seconds; unscored images come last.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import numpy as np
from monailabel.interfaces.datastore import Datastore
from monailabel.interfaces.tasks.scoring import ScoringMethod
from monailabel.interfaces.tasks.strategy import Strategy

from calib_monai.bundle.manifest import file_sha256
from calib_monai.label.selection import next_to_label
from calib_monai.label.serving import ServedBundle

__all__ = ["INFO_KEY", "CaseQualityScoring", "LeastConfident", "MostTypical", "TypicalLeastConfident"]

logger = logging.getLogger("calib_monai.label")
INFO_KEY = "calib_monai"  # image info: {INFO_KEY: {bundle: {"case_score", "review", "features", "weights_sha256"}}}


def stored_score(info: dict[str, Any], bundle: str) -> dict[str, Any]:
    return (info.get(INFO_KEY) or {}).get(bundle) or {}


class CaseQualityScoring(ScoringMethod):
    """Score the images of the datastore with ``served``'s case quality and features (see the module)."""

    def __init__(self, served: ServedBundle):
        super().__init__(f"{served.name}: case quality (estimated mean DSC) of each unlabelled image, for Next Sample")
        self.served = served

    def __call__(self, request: dict[str, Any], datastore: Datastore) -> dict[str, Any]:
        """``{image id: case score}`` of the unlabelled images (the labelled ones are scored for their features)."""
        if self.served.weights is None:
            logger.warning(f"{self.served.name}: no weights to score with: {self.served.missing_weights_message()}")
            return {}
        sha = file_sha256(self.served.weights)
        unlabelled = datastore.get_unlabeled_images()
        scores, start, computed = {}, time.time(), 0
        for image_id in [*unlabelled, *sorted(set(datastore.list_images()) - set(unlabelled))]:
            info = datastore.get_image_info(image_id)
            entry = stored_score(info, self.served.name)
            if entry.get("weights_sha256") != sha or "features" not in entry or request.get("force"):
                entry = self._score(datastore, image_id, sha)
                mine = dict(info.get(INFO_KEY) or {})
                mine[self.served.name] = entry
                datastore.update_image_info(image_id, {INFO_KEY: mine})
                computed += 1
            if image_id in unlabelled:
                scores[image_id] = entry.get("case_score")
        logger.info(
            f"{self.served.name}: scored {len(scores)} unlabelled image(s) ({computed} image(s) segmented, labelled "
            f"ones for their features) in {time.time() - start:.1f} s"
        )
        return scores

    def _score(self, datastore: Datastore, image_id: str, sha: str) -> dict[str, Any]:
        try:
            served = self.served.predict(datastore.get_image_uri(image_id))
            quality, features = served.quality or {}, served.features
        except Exception as err:  # one unreadable image must not stop the others; it says why in the info
            logger.warning(f"{self.served.name}: cannot score {image_id}: {err}")
            quality, features = {"case_score": None, "review": {"flag": None, "reasons": [str(err)]}}, None
        return {
            "case_score": quality.get("case_score"),
            "review": (quality.get("review") or {}).get("flag"),
            "features": None if features is None else [float(f"{v:.4g}") for v in np.asarray(features).ravel()],
            "weights_sha256": sha,
            "scored_at": time.time(),
        }


class LeastConfident(Strategy):
    """The unlabelled image ``bundle`` is least sure of, not one another annotator has just received."""

    suffix = "least_confident"
    description = "the unlabelled image with the lowest estimated mean DSC (run its scoring first)"

    def __init__(self, bundle: str, recent_s: float = 3600.0):
        super().__init__(f"{bundle}: {self.description}")
        self.bundle, self.recent_s = bundle, float(recent_s)

    def __call__(self, request: dict[str, Any], datastore: Datastore) -> dict[str, Any]:
        name = request.get("strategy") or f"{self.bundle}_{self.suffix}"
        client = request.get("client_id")
        now = time.time()
        ranked, infos = [], {}
        for image_id in datastore.get_unlabeled_images():
            info = infos[image_id] = datastore.get_image_info(image_id)
            handed = (info.get("strategy") or {}).get(name) or {}
            ts = float(handed.get("ts", 0))
            taken = bool(handed) and now - ts < self.recent_s and handed.get("client_id") != client
            score = stored_score(info, self.bundle).get("case_score")
            unscored = score is None or score != score
            ranked.append((taken, ts if taken else 0.0, unscored, 0.0 if unscored else score, image_id))
        if not ranked:
            return {}
        free = [r[-1] for r in ranked if not r[0] and not r[2]]
        chosen = self.choose(free, infos, datastore) if free else None
        taken, _, unscored, score, image_id = next(r for r in ranked if r[-1] == chosen) if chosen else min(ranked)
        return {"id": image_id, "case_score": None if unscored else score, "taken_by_another": taken}

    def choose(self, free: list[str], infos: dict[str, dict], datastore: Datastore) -> str | None:
        """One of the ``free`` (scored, not taken) image ids (``infos``: theirs), or None for the lowest score."""
        return None


class TypicalLeastConfident(LeastConfident):
    """The least confident typical unlabelled image of the largest part no label covers (``next_to_label``); the
    lowest score alone while fewer than two free images have features of the same weights."""

    suffix = "typical_least_confident"
    by_score = True
    description = (
        "the least confident of the typical unlabelled images in the largest part of the datastore that no label "
        "covers yet (run its scoring first)"
    )

    def choose(self, free: list[str], infos: dict[str, dict], datastore: Datastore) -> str | None:
        entries = {i: stored_score(infos[i], self.bundle) for i in free}
        with_features = {i: e for i, e in entries.items() if e.get("features")}
        if len(with_features) < 2:
            if len(free) > 1:
                logger.info(
                    f"{self.bundle}: Next Sample by the lowest case score: {len(free) - len(with_features)} of the "
                    f"{len(free)} free images have no stored features (a TorchScript model.ts takes no feature hook; "
                    f"else POST /scoring/{self.bundle}_case_quality scores them)"
                )
            return None
        sha = Counter(e.get("weights_sha256") for e in with_features.values()).most_common(1)[0][0]
        candidates = [i for i, e in with_features.items() if e.get("weights_sha256") == sha]
        labelled = [stored_score(datastore.get_image_info(i), self.bundle) for i in datastore.get_labeled_images()]
        labelled = [e["features"] for e in labelled if e.get("features") and e.get("weights_sha256") == sha]
        try:
            index = next_to_label(
                np.array([with_features[i]["case_score"] for i in candidates], dtype=np.float64),
                np.array([with_features[i]["features"] for i in candidates], dtype=np.float64),
                np.array(labelled, dtype=np.float64) if labelled else None,
                by_score=self.by_score,
            )
        except ValueError as err:  # features of another length or not finite: the lowest score, with why
            logger.warning(f"{self.bundle}: Next Sample by the lowest case score: {err}")
            return None
        return candidates[index]


class MostTypical(TypicalLeastConfident):
    """TypiClust's own choice: the most typical unlabelled image of the largest part no label covers."""

    suffix = "most_typical"
    by_score = False
    description = "the most typical unlabelled image of the largest part of the datastore that no label covers yet"
