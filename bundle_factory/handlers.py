"""The training handlers of ``configs/train.json``, in the order they attach to the trainer.

On ``EPOCH_COMPLETED`` MONAI's ``ValidationHandler`` runs the evaluator first; then CRaC's ALM outer step, the epoch
line, the validation history, the model selection (``model.pt``), the epoch snapshots (``--keep_epoch_weights``),
the resumable checkpoint and TensorBoard. Fine-tuning's initial weights load at ``STARTED``, before the checkpoint
of a resumed run replaces them.
"""

from __future__ import annotations

from typing import Any

from bundle_factory.specs import Method

__all__ = ["train_handlers"]


def _index(handlers: list[dict[str, Any]], target: str) -> int:
    return next(i for i, h in enumerate(handlers) if h["_target_"].endswith(target))


def train_handlers(method: Method) -> list[dict[str, Any]]:
    """``train#handlers``: each handler does one job; the checkpoint, last but TensorBoard, keeps the state of the
    selection, the history and (CRaC) the loss, so a resumed run restores them."""
    handlers: list[dict[str, Any]] = [
        # fine-tuning starts from init_weights; first, so that a resumed run's checkpoint (loaded next) replaces them
        {
            "_target_": "calib_monai.handlers.NetworkWeightsLoader",
            "load_path": "@init_weights",
            "network": "@network",
            "map_location": "@device",
            "_disabled_": "$not @init_weights",
        },
        {"_target_": "LrScheduleHandler", "lr_scheduler": "@lr_scheduler", "print_lr": False},
        {
            "_target_": "ValidationHandler",
            "validator": "@validate#evaluator",
            "epoch_level": True,
            "interval": "@val_interval",
        },
    ]
    if method.alm:
        handlers.append(
            {
                "_target_": "calib_monai.handlers.ALMUpdateHandler",
                "loss": "@loss",
                "evaluator": "@validate#evaluator",  # reads the logits of the validation the trainer runs anyway
                "class_names": "$list(@label_names.values())",
                "save_dir": "@output_dir",  # alm_history.json: every outer step's multipliers
            }
        )
    handlers += [
        {
            "_target_": "calib_monai.handlers.EpochSummary",
            "evaluator": "@validate#evaluator",
            "optimizer": "@optimizer",
            "metric_names": ["val_mean_dice", "val_ece"],
        },
        {
            "_target_": "calib_monai.handlers.ValidationHistory",
            "save_dir": "@output_dir",
            "evaluator": "@validate#evaluator",
        },
        {
            "_target_": "calib_monai.handlers.ModelSelection",
            "save_dir": "@output_dir",
            "network": "@network",
            "evaluator": "@validate#evaluator",
            "metric_name": "@selection_metric",
            "mode": "@selection_mode",
            "bounds": "@selection_bounds",
        },
        {
            "_target_": "calib_monai.handlers.EpochSnapshots",
            "save_dir": "@output_dir",
            "network": "@network",
            "_disabled_": "$not calib_monai.bundle.as_bool(@keep_epoch_weights, 'keep_epoch_weights')",
        },
    ]
    # the checkpoint keeps the state of these very objects (MONAI resolves a reference to a list item by its index)
    extra = {
        name: f"@train#handlers#{_index(handlers, target)}"
        for name, target in (("history", "ValidationHistory"), ("selection", "ModelSelection"))
    }
    if method.alm:
        extra["loss"] = "@loss"  # the ALM multipliers are the loss's buffers
    handlers += [
        # after the handlers whose state it keeps, so that a resumed run restores them
        {
            "_target_": "calib_monai.handlers.TrainingCheckpoint",
            "save_dir": "@output_dir",
            "network": "@network",
            "optimizer": "@optimizer",
            "lr_scheduler": "@lr_scheduler",
            "extra": extra,
        },
        # last, so that multi_gpu_train.json can drop it on ranks > 0
        {
            "_target_": "TensorBoardStatsHandler",
            "log_dir": "$@output_dir + '/tensorboard'",
            "tag_name": "train_loss",
            # every loss_log_interval steps: reading the loss waits for the GPU, which each step must not do
            "iteration_log": "@loss_log_interval",
            "output_transform": "$lambda output: output['loss']",  # the trainer does not decollate: one dict
        },
    ]
    return handlers
