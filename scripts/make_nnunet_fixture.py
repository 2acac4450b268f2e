"""Write ``tests/data/nnunet``: one case's ``--save_probabilities`` files written by nnU-Net v2's own exporter.

Run with a Python that has nnU-Net (not the project's environment), e.g.::

    python3 -m venv /tmp/nnunet-venv && /tmp/nnunet-venv/bin/pip install torch==2.13.0 && \
        /tmp/nnunet-venv/bin/pip install nnunetv2
    /tmp/nnunet-venv/bin/python scripts/make_nnunet_fixture.py

What it does, as nnU-Net's inference does for a SimpleITK data set (``nnunetv2.preprocessing.preprocessors.
default_preprocessor.DefaultPreprocessor.run_case_npy`` then ``nnunetv2.inference.export_prediction``):

1. writes ``labelsTr/case_001.nii.gz`` (nibabel, ``(x, y, z) = (12, 10, 6)``, spacing ``(3, 1, 1)`` mm: x is the
   coarse axis, so nnU-Net's planner transposes it first: ``transpose_forward = [2, 0, 1]``);
2. reads it with nnU-Net's ``SimpleITKIO`` (``(1, z, y, x)`` and the properties), transposes by
   ``transpose_forward`` and crops with nnU-Net's ``crop_to_nonzero`` to a body mask (the properties get
   ``shape_before_cropping``, ``bbox_used_for_cropping``, ``shape_after_cropping_and_before_resampling``);
3. makes logits whose argmax is the cropped label (4 on the label's class, seeded noise below 1), at the original
   spacing (so nnU-Net's resampling keeps the shape);
4. calls ``export_prediction_from_logits(..., save_probabilities=True)``: ``predictions/case_001.npz``
   (``probabilities``), ``case_001.pkl`` and ``case_001.nii.gz``; ``dataset.json`` is written beside them as
   ``nnUNetv2_predict`` does.

The expected result: the probabilities, read by ``calib_monai.recalibration`` against the label, score DSC 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO
from nnunetv2.inference.export_prediction import export_prediction_from_logits
from nnunetv2.preprocessing.cropping.cropping import crop_to_nonzero
from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "nnunet"
DATASET = {
    "channel_names": {"0": "CT"},
    "labels": {"background": 0, "liver": 1, "spleen": 2},
    "numTraining": 1,
    "file_ending": ".nii.gz",
}
SPACING_XYZ = (3.0, 1.0, 1.0)
TRANSPOSE_FORWARD, TRANSPOSE_BACKWARD = [2, 0, 1], [1, 2, 0]  # nnU-Net's planner: the coarsest axis first


def plans(spacing_transposed: list[float]) -> dict:
    configuration = {
        "data_identifier": "nnUNetPlans_3d_fullres",
        "preprocessor_name": "DefaultPreprocessor",
        "batch_size": 2,
        "patch_size": [6, 10, 12],
        "median_image_size_in_voxels": [6, 10, 12],
        "spacing": spacing_transposed,
        "normalization_schemes": ["CTNormalization"],
        "use_mask_for_norm": [False],
        "resampling_fn_data": "resample_data_or_seg_to_shape",
        "resampling_fn_seg": "resample_data_or_seg_to_shape",
        "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
        "resampling_fn_data_kwargs": {"is_seg": False, "order": 3, "order_z": 0, "force_separate_z": None},
        "resampling_fn_seg_kwargs": {"is_seg": True, "order": 1, "order_z": 0, "force_separate_z": None},
        "resampling_fn_probabilities_kwargs": {"is_seg": False, "order": 1, "order_z": 0, "force_separate_z": None},
        "architecture": {
            "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
            "arch_kwargs": {},
            "_kw_requires_import": [],
        },
        "batch_dice": False,
    }
    return {
        "dataset_name": "Dataset999_Fixture",
        "plans_name": "nnUNetPlans",
        "image_reader_writer": "SimpleITKIO",
        "transpose_forward": TRANSPOSE_FORWARD,
        "transpose_backward": TRANSPOSE_BACKWARD,
        "original_median_spacing_after_transp": spacing_transposed,
        "original_median_shape_after_transp": [6, 10, 12],
        "configurations": {"3d_fullres": configuration},
        "foreground_intensity_properties_per_channel": {},
    }


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "labelsTr").mkdir(parents=True)
    (OUT / "predictions").mkdir()
    label = np.zeros((12, 10, 6), dtype=np.uint8)  # (x, y, z)
    label[3:8, 2:7, 1:4] = 1
    label[7:10, 5:8, 2:5] = 2
    body = np.zeros(label.shape, dtype=np.float32)
    body[2:11, 1:9, 1:6] = 1.0  # the image's nonzero region: nnU-Net crops to it
    affine = np.diag([*SPACING_XYZ, 1.0])
    label_file = OUT / "labelsTr" / "case_001.nii.gz"
    nib.save(nib.Nifti1Image(label, affine), str(label_file))
    body_file = OUT / "body.nii.gz"
    nib.save(nib.Nifti1Image(body, affine), str(body_file))

    seg, properties = SimpleITKIO().read_seg(str(label_file))  # (1, z, y, x)
    image, _ = SimpleITKIO().read_images([str(body_file)])
    body_file.unlink()
    order = [0, *[i + 1 for i in TRANSPOSE_FORWARD]]
    image, seg = image.transpose(order), seg.transpose(order)
    properties["shape_before_cropping"] = image.shape[1:]
    image, seg, bbox = crop_to_nonzero(image, seg)
    properties["bbox_used_for_cropping"] = bbox
    properties["shape_after_cropping_and_before_resampling"] = image.shape[1:]

    cropped = np.maximum(seg[0], 0).astype(np.int64)  # crop_to_nonzero marks outside-body background -1
    noise = torch.rand((3, *cropped.shape), generator=torch.Generator().manual_seed(0))
    logits = 4.0 * torch.nn.functional.one_hot(torch.from_numpy(cropped), 3).permute(3, 0, 1, 2).float() + noise
    manager = PlansManager(plans([properties["spacing"][i] for i in TRANSPOSE_FORWARD]))
    export_prediction_from_logits(
        logits,
        properties,
        manager.get_configuration("3d_fullres"),
        manager,
        DATASET,
        str(OUT / "predictions" / "case_001"),
        save_probabilities=True,
    )
    (OUT / "predictions" / "dataset.json").write_text(json.dumps(DATASET, indent=4))
    stored = np.load(OUT / "predictions" / "case_001.npz")["probabilities"]
    print(f"wrote {OUT}: probabilities {stored.shape} {stored.dtype} (C, z, y, x); label (x, y, z) {label.shape}")
    assert np.array_equal(stored.transpose(0, 3, 2, 1).argmax(0), label)


if __name__ == "__main__":
    main()
