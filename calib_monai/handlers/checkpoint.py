"""``TrainingCheckpoint``: the resumable state of a training run, written after every epoch and loaded at start."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint

from calib_monai.atomic import ensure_folder, save_atomically, write_error
from calib_monai.bundle import load_network_weights, read_weights_file, unwrap_network, weights_state_dict
from calib_monai.bundle.errors import on_error_exit
from calib_monai.bundle.runtime import resume_changes_allowed, run_settings, settings_differences

from .rng import capture_rng_state, restore_rng_state

__all__ = ["OutputFolderLock", "TrainingCheckpoint"]
_HELD: dict[str, OutputFolderLock] = {}  # the locks this process holds, by folder
#: why a task cannot run while another holds the folder, and the fix: BUSY[this task][the holder's task]
BUSY = {
    "training": {
        "training": "two trainings in one folder overwrite each other's checkpoint; wait for it to end, or give this "
        "run another --output_dir",
        "calibrate": "a training would replace the weights the calibrate is fitting its recalibration for; wait for "
        "the calibrate to finish, or give this run another --output_dir",
    },
    "calibrate": {
        "training": "calibrate would fit its recalibration for weights the training is replacing; wait for the "
        "training to finish, then run calibrate again",
        "calibrate": "two calibrates on one folder replace each other's recalibration and range; wait for it to "
        "finish (one calibrate per folder is enough)",
    },
}


def _alive(pid: int) -> bool:
    if pid <= 0:  # no pid recorded (0 would signal our own process group)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class OutputFolderLock:
    """``<folder>/training.lock``: one training or ``calibrate`` (``task``) per output folder. The file names its
    holder (task, pid, host, start time); the lock is ``fcntl.flock`` on it, which the system drops when the holder
    dies (SIGKILL too), so a killed run's file is taken over with a log line. Without ``flock``, a holder on this host
    whose pid is gone counts as stale."""

    def __init__(self, folder: str | os.PathLike, logger: logging.Logger | None = None, task: str = "training") -> None:
        if task not in BUSY:
            raise ValueError(f"OutputFolderLock task must be one of {sorted(BUSY)}, got {task!r}")
        self.folder = Path(folder)
        self.path = self.folder / "training.lock"
        self.logger = logger or logging.getLogger("calib_monai")
        self.task = task
        self._fd: int | None = None

    @staticmethod
    def _holder(text: str) -> dict[str, Any]:
        try:
            holder = json.loads(text)
        except ValueError:
            return {}
        return holder if isinstance(holder, dict) else {}

    def _describe(self, holder: dict[str, Any]) -> str:
        return (
            f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {holder.get('started', '?')}"
            if holder
            else "a process that left no details"
        )

    def _busy(self, holder: dict[str, Any]) -> RuntimeError:
        other = str(holder.get("task", "training"))  # a file without a task was written by a training
        why = BUSY.get(self.task, {}).get(other, BUSY["training"]["training"])
        article = "another" if other == self.task else "a"
        return RuntimeError(
            f"output folder {self.folder} is in use by {article} {other} ({self._describe(holder)}; lock "
            f"{self.path}): {why}"
        )

    def acquire(self) -> None:
        """Take the lock, or raise a ``RuntimeError`` naming the training that holds it."""
        import fcntl

        key = str(self.folder.resolve())
        if key in _HELD:  # left held by an earlier run of this process that ended with an exception
            _HELD[key].release()
        ensure_folder(self.folder)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as err:  # a read-only folder: the line says so
                raise write_error(self.path, err) from err
            holder = self._holder(os.pread(fd, 4096, 0).decode(errors="replace"))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._busy(holder) from None
            except OSError:  # no flock on this file system: the pid decides
                same_host = holder.get("host") == socket.gethostname()
                if holder and (not same_host or _alive(int(holder.get("pid", 0)))) and holder.get("pid") != os.getpid():
                    os.close(fd)
                    raise self._busy(holder) from None
            try:  # the holder before us may have removed the file after we opened it: lock the one in place
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        if holder:
            self.logger.warning(
                f"taking over {self.path}: the {holder.get('task', 'training')} that held it "
                f"({self._describe(holder)}) no longer runs"
            )
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
        me = json.dumps({"task": self.task, "pid": os.getpid(), "host": socket.gethostname(), "started": started})
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode(), 0)
        self._fd = fd
        _HELD[key] = self
        on_error_exit(f"lock {key}", self.release)  # a run ended by an error line leaves no lock file

    def release(self, *_: Any) -> None:
        """Give the lock back (removes the file); again: nothing."""
        if self._fd is None:
            return
        import fcntl

        try:
            os.remove(self.path)
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        _HELD.pop(str(self.folder.resolve()), None)
        on_error_exit(f"lock {self.folder.resolve()}", None)


class TrainingCheckpoint:
    """Resumable checkpoints for a MONAI ``SupervisedTrainer``.

    At every ``EPOCH_COMPLETED`` rank 0 writes ``checkpoint_latest.pt`` atomically: network (unwrapped from DDP),
    optimizer, scheduler, trainer, every ``extra`` object's state, the random-number state and the run's settings
    (:func:`~calib_monai.bundle.runtime.run_settings`). At ``STARTED`` an existing file is loaded back
    (``weights_only=True``) and training continues at the next epoch as if never stopped. Settings that differ are an
    error listing ``key: checkpoint -> command`` unless ``--resume_changes allow`` (a new learning rate then rescales
    the optimizer's and scheduler's). Rank 0 holds
    :class:`OutputFolderLock` on ``save_dir`` while it trains. Attach it after the handlers whose state it saves.
    Not MONAI's ``CheckpointSaver`` / ``CheckpointLoader``: they name files by epoch, fail when the file is absent,
    write non-atomically and keep no random-number state.

    Args:
        save_dir: folder of the file.
        network, optimizer, lr_scheduler: the objects to save and restore.
        extra: more objects with ``state_dict`` / ``load_state_dict``, e.g. ``{"loss": crac_loss, "selection": ...}``.
        resume: load the file at start when it exists.
    """

    def __init__(
        self,
        save_dir: str | os.PathLike,
        network: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any = None,
        extra: dict[str, Any] | None = None,
        resume: bool = True,
    ) -> None:
        self.latest_path = Path(save_dir) / "checkpoint_latest.pt"
        self.network, self.optimizer, self.lr_scheduler = network, optimizer, lr_scheduler
        self.extra = dict(extra or {})
        self.resume = resume
        self.logger = logging.getLogger("calib_monai")
        self._trainer: Engine | None = None
        self._pending_lr: tuple[Any, Any] = (None, None)  # (command, checkpoint) learning rates of an allowed change
        self.lock = OutputFolderLock(save_dir, self.logger)

    def attach(self, engine: Engine) -> None:
        self._trainer = engine
        engine.add_event_handler(Events.STARTED, self.start)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)
        engine.add_event_handler(Events.COMPLETED, self.lock.release)
        engine.add_event_handler(Events.TERMINATE, self.lock.release)

    def start(self, engine: Engine) -> None:
        """Take the output folder's lock (DDP rank 0), then resume from the file when it exists."""
        if idist.get_rank() == 0:
            self.lock.acquire()
        self.load_latest(engine)

    def _check_settings(self, checkpoint: dict[str, Any], fix: str) -> None:
        """An error listing the differences of the checkpoint's settings, or (allowed) a log line and the new lr."""
        recorded = checkpoint["settings"]
        differences = settings_differences(recorded, dict(run_settings()))
        if not differences:
            return
        listed = ", ".join(f"{k}: {json.dumps(old)} -> {json.dumps(new)}" for k, old, new in differences)
        if not resume_changes_allowed():
            raise ValueError(
                f"{self.latest_path} was trained with other settings than this command's ({listed}; checkpoint -> "
                "command): resuming would go on with the checkpoint's optimizer state (its learning rate) without a "
                "word; run the checkpoint's settings again, or pass --resume_changes allow to continue with the "
                f"new ones, or {fix}"
            )
        self.logger.warning(f"resuming {self.latest_path} with changed settings (--resume_changes allow): {listed}")
        self._pending_lr = (
            next((new for k, old, new in differences if k == "lr"), None),
            next((old for k, old, new in differences if k == "lr"), None),
        )

    def _apply_lr(self) -> None:
        """After the optimizer state is loaded: the command's learning rate, at the same point of the schedule."""
        new, old = self._pending_lr
        self._pending_lr = (None, None)
        if not isinstance(new, (int, float)) or not isinstance(old, (int, float)) or not old:
            return
        ratio = float(new) / float(old)
        for group in self.optimizer.param_groups:
            group["lr"] *= ratio
            if "initial_lr" in group:
                group["initial_lr"] *= ratio
        scheduler = self.lr_scheduler
        if scheduler is not None and hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * ratio for lr in scheduler.base_lrs]
            scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _objects(self) -> dict[str, Any]:
        network = unwrap_network(self.network)  # plain keys, whatever the number of GPUs
        objects: dict[str, Any] = {**self.extra, "network": network, "optimizer": self.optimizer}
        if self.lr_scheduler is not None:
            objects["lr_scheduler"] = self.lr_scheduler
        if self._trainer is not None:
            objects["trainer"] = self._trainer
        return objects

    def load_latest(self, engine: Engine) -> None:
        if not self.resume or not self.latest_path.is_file():
            return
        max_epochs = engine.state.max_epochs
        fix = (
            f"delete {self.latest_path} to start the run over (model.pt and the validation history are kept until "
            "the new run replaces them), or put back the file of the stopped run"
        )
        checkpoint = read_weights_file(self.latest_path, what="a training checkpoint", fix=fix)
        objects = self._objects()
        missing = (
            [name for name in objects if name not in checkpoint] if isinstance(checkpoint, dict) else list(objects)
        )
        if missing:
            raise ValueError(f"{self.latest_path} is not a checkpoint of this training (it lacks {missing}): {fix}")
        # what save_latest writes beside the objects: a file without them was written by an older calib_monai
        older = [key for key in ("settings", "rng") if not isinstance(checkpoint.get(key), dict)]
        if older:
            raise ValueError(f"{self.latest_path} lacks {older} (written by an older calib_monai): {fix}")
        self._check_settings(checkpoint, fix)
        load_network_weights(
            objects.pop("network"), weights_state_dict(checkpoint["network"]), name=f"{self.latest_path} (its network)"
        )
        Checkpoint.load_objects(to_load=objects, checkpoint=checkpoint)
        self._apply_lr()
        restore_rng_state(checkpoint["rng"], engine.state.dataloader)
        # the command line may ask for more (or fewer) epochs than the stopped run had
        engine.state.max_epochs = max_epochs
        if engine.state.epoch >= max_epochs:
            self.logger.info(
                f"{self.latest_path} already holds epoch {engine.state.epoch} of {max_epochs}: nothing left to train "
                "(raise --epochs to continue, or delete the file to start over)."
            )
            engine.terminate()
            return
        self.logger.info(f"resuming from {self.latest_path}: epoch {engine.state.epoch} done")

    def __call__(self, engine: Engine) -> None:
        if idist.get_rank() > 0:  # DDP: every rank holds the same weights; rank 0 writes them
            return
        state = {name: obj.state_dict() for name, obj in self._objects().items()}
        state["rng"] = capture_rng_state(engine.state.dataloader)
        state["settings"] = dict(run_settings())
        save_atomically(state, self.latest_path)
