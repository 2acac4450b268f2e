"""The bundle configs of one method x data set, as Python dicts (written out as JSON by ``render_bundle``).

``train.json`` is the spine; ``evaluate.json`` and ``multi_gpu_train.json`` are overlays merged on top of it, in the
model-zoo pattern (``--config_file "['configs/train.json','configs/evaluate.json']"``); ``inference.json`` stands
alone, so that serving needs no training data.

Devices (JSON has no comments, so the choices are explained here):

* ``device``: the first GPU when there is one, else the CPU; ``multi_gpu_train.json`` gives each torchrun rank
  ``cuda:$LOCAL_RANK`` (or the CPU with gloo).
* ``amp``: automatic mixed precision in the trainer and the evaluator (MONAI's ``amp=``: fp16 autocast and a
  gradient scaler), **off by default** so that the papers' protocol stays fp32; ``--amp true`` turns it on (the
  engines read it through ``calib_monai.bundle.as_bool``: the command line passes the string ``"true"``). It
  takes effect on CUDA only: MONAI's engines autocast for ``"cuda"``, so on the CPU torch disables the autocast
  and the scaler (with a warning) and training stays fp32. The validation post-processing casts the logits back
  to float32 before the softmax, so DSC and the calibration metrics are computed in fp32 either way.
* ``num_workers`` (``calib_monai.bundle.dataloader_workers``): 0 on the CPU, where worker processes compete with
  the training for the same cores (slower on a 2-core machine); on CUDA the CPUs of this process shared among the
  ranks of the node, minus one, at most 8. The data sets are in memory (``CacheDataset`` volumes, training slices
  indexed from them) and forked workers share that cache, so a few workers suffice; with workers, they persist
  across epochs (``persistent_workers``). ``data#num_workers`` (the threads that fill the cache) follows it.
* ``pin_memory`` (``calib_monai.bundle.pin_memory``): page-locked training batches, copied to the GPU without
  blocking (the trainer's ``non_blocking``), when the device is CUDA; off on the CPU. Only the training loader pins:
  it is the hot path (many small 2D batches per epoch), while the validation/test/inference volumes are read once
  per epoch or per request and are MetaTensors whose meta data (file names for the per-volume report, the applied
  transforms that ``Invertd`` undoes) must not depend on how the loader copies them.
"""

from __future__ import annotations

from typing import Any

from bundle_factory.calibration import CALIBRATION_PATH, calibrate_logits, evaluation_case_quality
from bundle_factory.checks import DATA_CHECK, REPORT_ERRORS, check_settings
from bundle_factory.common import FLOAT_PRED, IMPORTS, SLICE_INFERER
from bundle_factory.data import data_component, training_transforms
from bundle_factory.handlers import train_handlers
from bundle_factory.specs import Dataset, Method
from calib_monai.defaults import NUM_BINS

__all__ = ["common_keys", "evaluate_config", "multi_gpu_config", "train_config"]


def common_keys(name: str, dataset: Dataset) -> dict[str, Any]:
    """Keys shared by training and inference: where things are, and the network."""
    return {
        "imports": list(IMPORTS),
        "bundle_root": f"$calib_monai.bundle.locate_bundle('{name}')",
        "output_dir": "$@bundle_root + '/models'",
        "device": "$'cuda' if torch.cuda.is_available() else 'cpu'",
        "num_classes": dataset.num_classes,
        "in_channels": dataset.in_channels,
        "label_names": dict(dataset.label_names),
        "roi_size": list(dataset.roi_size),
        "backbone": "unet",
        "network_def": {
            "_target_": "calib_monai.networks.backbone",
            "name": "@backbone",
            "spatial_dims": 2,
            "in_channels": "@in_channels",
            "out_channels": "@num_classes",
            "img_size": "$@roi_size[:2]",
        },
        "network": "$@network_def.to(@device)",
        "amp": False,  # see the module docstring: fp32 by default, mixed precision on CUDA with --amp true
    }


def _postprocessing(*before_softmax: dict[str, Any], on_prob: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """float32 logits, ``before_softmax`` (a copy of the logits, a calibration), softmax (also kept as ``prob``),
    ``on_prob`` (the case quality), and the one-hot argmax and label for DSC."""
    return {
        "_target_": "Compose",
        "transforms": [
            FLOAT_PRED,
            *before_softmax,
            {"_target_": "Activationsd", "keys": "pred", "softmax": True},
            {"_target_": "CopyItemsd", "keys": "pred", "names": "prob"},
            *on_prob,
            {
                "_target_": "AsDiscreted",
                "keys": ["pred", "label"],
                "argmax": [True, False],
                "to_onehot": "@num_classes",
            },
        ],
    }


def _validation(dataset: Dataset, keep_logits: bool = False) -> dict[str, Any]:
    """Whole volumes through SliceInferer; DSC on the argmax, calibration on the softmax (``keep_logits``: also
    the raw logits, for CRaC's multiplier update). The logits are cast to float32 first (fp16 under ``amp``)."""
    logits = [{"_target_": "CopyItemsd", "keys": "pred", "names": "logits"}] if keep_logits else []
    return {
        # the validation (evaluate.json: test) volumes: the inference chain plus the label (no crop/pad inference
        # does not do), so the validated range and evaluating see what inferring serves
        "preprocessing": {"_target_": "Compose", "transforms": "%train#deterministic_transforms"},
        "dataset": "$@data.val_dataset(@validate#preprocessing)",
        "dataloader": {
            "_target_": "monai.data.DataLoader",
            "dataset": "@validate#dataset",
            "batch_size": 1,
            "shuffle": False,
            "num_workers": "@num_workers",
            "persistent_workers": "$@num_workers > 0",
        },
        "inferer": dict(SLICE_INFERER),
        "postprocessing": _postprocessing(*logits),
        "handlers": [
            {"_target_": "TensorBoardStatsHandler", "log_dir": "$@output_dir + '/tensorboard'", "iteration_log": False}
        ],
        "key_metric": {
            "val_mean_dice": {
                "_target_": "MeanDice",
                "include_background": False,
                "output_transform": "$monai.handlers.from_engine(['pred', 'label'])",
            }
        },
        "additional_metrics": {
            "val_ece": {
                "_target_": "calib_monai.handlers.SegmentationCalibrationError",
                "metric_name": "ece",
                "num_bins": NUM_BINS,
                "foreground": "gt",
                "output_transform": "$monai.handlers.from_engine(['prob', 'label'])",
            },
            "val_nll": {
                "_target_": "calib_monai.handlers.SegmentationCalibrationError",
                "metric_name": "nll",
                "foreground": "gt",
                "output_transform": "$monai.handlers.from_engine(['prob', 'label'])",
            },
        },
        "evaluator": {
            "_target_": "SupervisedEvaluator",
            "device": "@device",
            "val_data_loader": "@validate#dataloader",
            "network": "@network",
            "inferer": "@validate#inferer",
            "postprocessing": "@validate#postprocessing",
            "key_val_metric": "@validate#key_metric",
            "additional_metrics": "@validate#additional_metrics",
            "val_handlers": "@validate#handlers",
            "amp": "$calib_monai.bundle.as_bool(@amp, 'amp')",
        },
    }


def train_config(name: str, method: Method, dataset: Dataset) -> dict[str, Any]:
    """``configs/train.json``: the papers' protocol (2D slices, Adam 1e-3 then 1e-4 at half time, batch 16)."""
    config = common_keys(name, dataset)
    shared, added = training_transforms(dataset)  # the steps training and validation share, then training's crops
    config.update(
        {
            "dataset_dir": "",
            "seed": 0,
            "epochs": method.epochs,
            "lr": 0.001,
            "lr_milestone": "$@epochs // 2",
            "batch_size": 16,
            "loss_log_interval": 10,  # training steps between two TensorBoard train_loss points
            # data loading (module docstring): worker processes and pinned memory on CUDA, none on the CPU
            "num_workers": "$calib_monai.bundle.dataloader_workers(@device)",
            "pin_memory": "$calib_monai.bundle.pin_memory(@device)",
            "val_interval": 1,
            "train_fraction": 1.0,  # share of the training cases (data-size studies)
            # validation volumes also keep their label as read (evaluate.json: the delivered segmentation's truth)
            "keep_input_label": False,
            "init_weights": "",  # a model.pt to start from (fine-tuning: MONAI Label's train task); "" : random
            # which validation epoch becomes model.pt: the best selection_metric (DSC, as in the papers; or val_nll
            # with mode "min"), among the epochs whose metrics stay within selection_bounds ({"val_ece": 0.05})
            "selection_metric": "val_mean_dice",
            "selection_mode": "max",
            "selection_bounds": {},
            # also keep every epoch's network as epoch_<e>.pt, for other selection rules after training (the
            # per-epoch validation metrics are always in validation_history.json)
            "keep_epoch_weights": False,
            "loss": dict(method.loss),
            "optimizer": {"_target_": "torch.optim.Adam", "params": "$@network.parameters()", "lr": "@lr"},
            "lr_scheduler": {
                "_target_": "torch.optim.lr_scheduler.MultiStepLR",
                "optimizer": "@optimizer",
                "milestones": ["@lr_milestone"],
                "gamma": 0.1,
            },
            "data": data_component(
                dataset,
                dataset_dir="@dataset_dir",
                output_dir="@output_dir",
                roi_size="@roi_size",
                seed="@seed",
                num_workers="@num_workers",
            ),
            "train": {
                "deterministic_transforms": shared,
                "training_transforms": added,
                "preprocessing": {
                    "_target_": "Compose",
                    "transforms": "$@train#deterministic_transforms + @train#training_transforms",
                },
                "dataset": "$@data.train_dataset(fraction=@train_fraction, preprocessing=@train#preprocessing)",
                "dataloader": {
                    "_target_": "monai.data.DataLoader",
                    "dataset": "@train#dataset",
                    "batch_size": "@batch_size",
                    "shuffle": True,
                    "num_workers": "@num_workers",
                    "pin_memory": "@pin_memory",
                    "persistent_workers": "$@num_workers > 0",
                },
                "inferer": {"_target_": "monai.inferers.SimpleInferer"},
                "handlers": train_handlers(method),
                "trainer": {
                    "_target_": "SupervisedTrainer",
                    "device": "@device",
                    "max_epochs": "@epochs",
                    "train_data_loader": "@train#dataloader",
                    "network": "@network",
                    "optimizer": "@optimizer",
                    "loss_function": "@loss",
                    "inferer": "@train#inferer",
                    "train_handlers": "@train#handlers",
                    "amp": "$calib_monai.bundle.as_bool(@amp, 'amp')",
                    "non_blocking": "@pin_memory",
                    # the handlers read the batch-level loss; splitting each batch into items is CPU time per step
                    "decollate": False,
                },
            },
            "validate": _validation(dataset, keep_logits=method.alm),
            "initialize": [REPORT_ERRORS, check_settings(training=True), "$monai.utils.set_determinism(seed=@seed)"],
            # the data are read when training starts, not at initialize (so `run export` needs none)
            "run": [
                DATA_CHECK,
                "$calib_monai.bundle.log_run_start(@data, @epochs, @device, @output_dir)",
                "$@train#trainer.run()",
            ],
            "training": "@run",
            # models/model.ts (logits) + segmentation_confidence.{ts,pt2} from the best checkpoint; the network is
            # rebuilt from this file's network_def (command-line overrides of the network are not seen)
            "export": ["$calib_monai.export.export_bundle(@bundle_root, @output_dir, @output_dir + '/model.pt')"],
        }
    )
    return config


def evaluate_config(name: str, method: Method, dataset: Dataset) -> dict[str, Any]:
    """``configs/evaluate.json`` (over train.json): the best model on the 3D test volumes, per-volume CSV and plots."""
    return {
        "eval_dir": "$@bundle_root + '/eval'",
        "calibration_path": CALIBRATION_PATH,
        "validate#dataset": "$@data.test_dataset(@validate#preprocessing)",
        "keep_input_label": True,  # the test volumes keep their label as read: the delivered segmentation's truth
        # the calibrate step's calibration (when there is one) before the softmax; the softmax of the raw logits kept
        # as prob_uncalibrated for test_ece_uncalibrated
        # and the case quality with its review flag, by the transform inferring runs (CaseQualityd)
        **evaluation_case_quality(),
        "validate#postprocessing": _postprocessing(
            calibrate_logits("$@output_dir + '/model.pt'", "prob_uncalibrated"),
            # the case quality on the network's grid (as inferring), then (as inferring) no review against the range
            # without the recalibration it assumes
            on_prob=(
                "@case_quality",
                # the true DSC of the segmentation inferring delivers: the argmax, nearest on the input grid
                {"_target_": "CopyItemsd", "keys": "prob", "names": "delivered"},
                {"_target_": "AsDiscreted", "keys": "delivered", "argmax": True},
                {
                    "_target_": "Invertd",
                    "keys": "delivered",
                    "transform": "@validate#preprocessing",
                    "orig_keys": "image",
                    "nearest_interp": True,
                    "to_tensor": True,
                },
                {
                    "_target_": "calib_monai.review.DeliveredDiced",
                    "keys": "delivered",
                    "label_key": "input_label",
                    "label_names": "@label_names",
                },
                {"_target_": "calib_monai.data.inference.RecordSourced", "keys": "prob", "quality_key": "quality"},
                {"_target_": "DeleteItemsd", "keys": "delivered"},  # scored: not kept for the whole iteration
            ),
        ),
        "validate#handlers": [
            {
                # CheckpointLoader's strict load, also for the module.-prefixed model.pt of older multi-GPU runs
                "_target_": "calib_monai.handlers.NetworkWeightsLoader",
                "load_path": "$@output_dir + '/model.pt'",
                "network": "@network",
                "map_location": "@device",
            },
            # one line of the evaluator's metrics: test_mean_dice, test_ece, test_ece_uncalibrated
            {"_target_": "StatsHandler", "iteration_log": False},
            {
                "_target_": "calib_monai.handlers.SegmentationReport",
                "output_dir": "@eval_dir",
                "label_names": "@label_names",
                **({"regions": dataset.regions} if dataset.regions else {}),
            },
        ],
        "validate#key_metric": {
            "test_mean_dice": {
                "_target_": "MeanDice",
                "include_background": False,
                "output_transform": "$monai.handlers.from_engine(['pred', 'label'])",
            }
        },
        "validate#additional_metrics": {
            "test_ece": {
                "_target_": "calib_monai.handlers.SegmentationCalibrationError",
                "metric_name": "ece",
                "num_bins": NUM_BINS,
                "foreground": "gt",
                "output_transform": "$monai.handlers.from_engine(['prob', 'label'])",
            },
            "test_ece_uncalibrated": {
                "_target_": "calib_monai.handlers.SegmentationCalibrationError",
                "metric_name": "ece",
                "num_bins": NUM_BINS,
                "foreground": "gt",
                "output_transform": "$monai.handlers.from_engine(['prob_uncalibrated', 'label'])",
            },
        },
        "initialize": [REPORT_ERRORS, check_settings(), "$monai.utils.set_determinism(seed=@seed)"],
        "run": [DATA_CHECK, "$@validate#evaluator.run()"],
        "evaluating": "@run",
    }


def multi_gpu_config(name: str, method: Method, dataset: Dataset) -> dict[str, Any]:
    """``configs/multi_gpu_train.json`` (over train.json): torchrun + DDP + DistributedSampler, any backend.

    ``TrainingCheckpoint`` unwraps the DDP network, so ``model.pt`` and ``checkpoint_latest.pt`` hold the plain
    ``network_def`` keys. Validation: ``calib_monai.bundle.validation_sampler`` shards the volumes unevenly over the
    ranks, or gives every rank all of them when there are fewer volumes than ranks (every rank must take part in the
    metrics' all_gather); the evaluator runs the unwrapped network, so ranks with different numbers of volumes do
    not meet in DDP's collective operations.
    """
    return {
        "backend": "$'nccl' if torch.cuda.is_available() else 'gloo'",
        "device": "$calib_monai.bundle.distributed_device()",
        "network": "$calib_monai.bundle.distributed_network(@network_def, @device)",
        "train#sampler": {
            "_target_": "DistributedSampler",
            "dataset": "@train#dataset",
            "even_divisible": True,
            "shuffle": True,
        },
        "train#dataloader#sampler": "@train#sampler",
        "train#dataloader#shuffle": False,
        "train#trainer#train_handlers": "$@train#handlers[: -1 if torch.distributed.get_rank() > 0 else None]",
        "validate#sampler": "$calib_monai.bundle.validation_sampler(@validate#dataset)",
        "validate#dataloader#sampler": "@validate#sampler",
        "validate#evaluator#network": "$calib_monai.bundle.unwrap_network(@network)",
        "validate#evaluator#val_handlers": "$None if torch.distributed.get_rank() > 0 else @validate#handlers",
        "initialize": [
            REPORT_ERRORS,
            "$calib_monai.bundle.init_distributed(@backend)",
            check_settings(training=True),
            "$monai.utils.set_determinism(seed=@seed)",
        ],
        "run": [
            DATA_CHECK,
            "$calib_monai.bundle.log_run_start(@data, @epochs, @device, @output_dir)",
            "$@train#trainer.run()",
        ],
        "training": "@run",
        "finalize": ["$calib_monai.bundle.finalize_distributed()"],
    }
