"""The MONAI Label train task of a served bundle (imports MONAI Label; the work is
:class:`calib_monai.label.fine_tune.FineTune`). It runs in MONAI Label's training subprocess; stopping it publishes
nothing, and the server serves the new files from its next request on.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any

from monailabel.interfaces.datastore import Datastore
from monailabel.interfaces.tasks.train import TrainTask

from calib_monai.label.fine_tune import FineTune, SubmittedLabel, served_calibration
from calib_monai.label.serving import ServedBundle

__all__ = ["BundleTrainer"]

logger = logging.getLogger("calib_monai.label")
# the scalars of FineTune, with its defaults: Slicer's options table of the train task
DEFAULTS = {f.name: f.default for f in fields(FineTune) if f.name in ("epochs", "lr", "validation_fraction", "seed")}


class BundleTrainer(TrainTask):
    """Fine-tune ``served`` with its own training (loss, ALM handler, selection) on the datastore's final labels."""

    def __init__(self, served: ServedBundle):
        super().__init__(
            f"{served.name}: fine-tune on the submitted labels with the bundle's own loss, hold part "
            "out to validate and calibrate, then serve the new weights (no restart)"
        )
        self.served = served

    def config(self) -> dict[str, Any]:
        return dict(DEFAULTS)

    def _fine_tune(self, request: dict[str, Any] | None = None) -> FineTune:
        request = request or {}
        return FineTune(self.served.bundle_dir, **{k: type(v)(request.get(k, v)) for k, v in DEFAULTS.items()})

    def stats(self) -> dict[str, Any]:
        return self._fine_tune().stats()

    def __call__(self, request: dict[str, Any], datastore: Datastore) -> dict[str, Any]:
        if self.served.weights is None or self.served.weights.suffix != ".pt":
            raise ValueError(f"{self.served.name} has no models/model.pt to fine-tune (a model.ts is not trainable)")
        cases = [
            SubmittedLabel(
                image_id,
                datastore.get_image_uri(image_id),
                datastore.get_label_uri(image_id, "final"),
                datastore.get_label_info(image_id, "final").get("label_info"),
            )
            for image_id in datastore.get_labeled_images()
        ]
        method, source = served_calibration(self.served.bundle_dir)
        logger.info(f"{self.served.name}: {len(cases)} labelled image(s); calibration {method} ({source})")
        return self._fine_tune(request).run(cases, self.served.label_names)  # the same method, and says why
