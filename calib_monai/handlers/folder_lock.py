"""``HoldOutputFolder``: hold a run folder's lock for the whole of an engine's run (the bundles' ``calibrate``)."""

from __future__ import annotations

import os

from ignite.engine import Engine, Events

from .checkpoint import OutputFolderLock

__all__ = ["HoldOutputFolder"]


class HoldOutputFolder:
    """Take ``<folder>/training.lock`` (:class:`~calib_monai.handlers.checkpoint.OutputFolderLock`) when the engine
    starts and give it back when it completes, after the handlers attached with the engine (``RecalibrationFitter``
    publishes then). Attach it first, so the weights are loaded under the lock.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.lock = OutputFolderLock(folder, task="calibrate")

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.STARTED, self._take)

    def _take(self, engine: Engine) -> None:
        self.lock.acquire()
        # registered now, so it runs after the COMPLETED handlers attached with the engine (the publication)
        if not engine.has_event_handler(self.lock.release, Events.COMPLETED):
            engine.add_event_handler(Events.COMPLETED, self.lock.release)
