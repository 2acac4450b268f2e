"""``configs/inference.json``: images in, segmentation, confidence and case quality out, in the input geometry."""

from __future__ import annotations

from typing import Any

from bundle_factory.calibration import calibrate_logits, case_quality_keys, contour_keys
from bundle_factory.checks import DATA_CHECK, REPORT_ERRORS, check_settings
from bundle_factory.common import FLOAT_PRED, SLICE_INFERER
from bundle_factory.configs import common_keys
from bundle_factory.data import data_component, preprocessing
from bundle_factory.specs import Dataset, Method
from calib_monai.data.preprocessing import INFERENCE

__all__ = ["inference_config"]


def inference_config(name: str, method: Method, dataset: Dataset) -> dict[str, Any]:
    """``configs/inference.json``: images of ``dataset_dir`` in, segmentation and confidence NIfTI out, in the input
    geometry."""
    config = common_keys(name, dataset)
    config.update(
        {
            "dataset_dir": "",  # a folder of images (NIfTI), or one image file
            "output_dir": "$@bundle_root + '/inference'",
            "model_path": "$@bundle_root + '/models/model.pt'",
            # next to the weights, as the calibrate step writes it
            "calibration_path": "$os.path.join(os.path.dirname(@model_path), 'calibration.pt')",
            **case_quality_keys(),
            **contour_keys(),  # each structure's inner and outer contour, <case>_inner/_outer.nii.gz
            # the site monitor of this deployment: site.json beside the outputs ("" switches it off)
            "site_dir": "@output_dir",
            "site_monitor": {
                "_target_": "calib_monai.review.SiteMonitord",
                "keys": "quality",
                "site_dir": "@site_dir",
                "case_quality": "@case_quality",
            },
            "batch_size": 16,
            # no data set: the component lists the images to segment and holds the data set's settings
            "data": data_component(dataset, dataset_dir=None, output_dir="@output_dir", roi_size="@roi_size"),
            # the training steps without the label and the crop: SliceInferer covers the whole image
            "preprocessing": preprocessing(dataset, INFERENCE),
            "dataset": {
                "_target_": "monai.data.Dataset",
                "data": "$calib_monai.data.image_datalist(@dataset_dir, @data)",
                "transform": "@preprocessing",
            },
            "dataloader": {
                "_target_": "monai.data.DataLoader",
                "dataset": "@dataset",
                "batch_size": 1,
                "num_workers": 0,  # images are read and preprocessed once each: workers would only add start-up time
            },
            "inferer": dict(SLICE_INFERER),
            "postprocessing": {
                "_target_": "Compose",
                "transforms": [
                    FLOAT_PRED,  # fp16 logits under amp
                    calibrate_logits("@model_path"),  # the calibrate step's temperature, when fitted for model_path
                    "$calib_monai.data.segmentation_and_confidence(@preprocessing, @output_dir, @case_quality, "
                    "@site_monitor, @contour_margins)",
                ],
            },
            "handlers": [
                {
                    "_target_": "calib_monai.handlers.NetworkWeightsLoader",
                    "load_path": "@model_path",
                    "network": "@network",
                    "map_location": "@device",
                },
                # one line at the end: how many cases, where, how many flagged (the evaluator ends without a word)
                {"_target_": "calib_monai.handlers.InferenceSummary", "output_dir": "@output_dir"},
            ],
            "evaluator": {
                "_target_": "SupervisedEvaluator",
                "device": "@device",
                "val_data_loader": "@dataloader",
                "network": "@network",
                "inferer": "@inferer",
                "postprocessing": "@postprocessing",
                "val_handlers": "@handlers",
                "amp": "$calib_monai.bundle.as_bool(@amp, 'amp')",
            },
            "initialize": [REPORT_ERRORS, check_settings()],
            "run": [DATA_CHECK, "$@evaluator.run()"],
            "inferring": [DATA_CHECK, "$@evaluator.run()"],
        }
    )
    return config
