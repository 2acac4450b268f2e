"""A full-size CT (512 x 512 x 200 at 0.8 x 0.8 x 2.5 mm, another spacing than the bundle's) through nacl_flare's
``inferring`` with each recalibration method, and the float rounding of probabilities clipped where they are made.

A confident network (a trained one whose output layer is scaled up, as a well-trained network is) gives exact ones
after the softmax; ``Invertd``'s float32 interpolation back to the image's grid turns some into 1 + 1.2e-7, which
the case quality's exact check refused ("it looks like logits") before the clip. The served chain maps back only
the segmentation (nearest) and the confidence; the clip stays where the confidence is made.
"""

from __future__ import annotations

import csv
import json
import shutil

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from monai.transforms import Compose, Invertd, Spacingd

from calib_monai.checks import PROBABILITY_ROUNDING, clip_probability_rounding
from calib_monai.data import ClipProbabilityRoundingd
from calib_monai.data.phantoms import generate_phantom
from conftest import REPO_ROOT, make_confident, run_bundle_workflow

CONFIGS = REPO_ROOT / "bundles" / "nacl_flare" / "configs"
TINY = {"roi_size": [32, 32, 8], "batch_size": 8, "data#num_phantoms": 6, "data#spacing": [12.0, 12.0, 30.0]}
FULL_SHAPE, FULL_SPACING = (512, 512, 200), (0.8, 0.8, 2.5)
METHODS = ("temperature", "local_temperature")


# ---------------------------------------------------------------------------------------------- the clip, by hand


def test_rounding_is_clipped_and_anything_further_is_refused():
    prob = torch.tensor([[1.0 + 1.2e-7, -1e-8, 0.5], [0.0, 1.0, 0.5]])
    out = clip_probability_rounding(prob)
    assert out is prob  # in place
    assert out.tolist() == [[1.0, 0.0, 0.5], [0.0, 1.0, 0.5]]
    for bad, seen in ((1.0 + 10 * PROBABILITY_ROUNDING, r"\[0.5, 1.0000100\d\]"), (-0.5, r"\[-0.5, 0.5\]")):
        with pytest.raises(ValueError, match=rf"^the map must lie in \[0, 1\].* values in {seen}: they are not"):
            clip_probability_rounding(torch.tensor([bad, 0.5]), "the map")
    with pytest.raises(ValueError, match=r"values in \[nan, nan\]"):
        clip_probability_rounding(torch.tensor([float("nan"), 0.5]))
    labels = torch.tensor([0, 2, 1])
    assert clip_probability_rounding(labels) is labels  # integers: nothing to clip


def _resampled_softmax():
    """A float32 ``Spacingd`` as the bundles' (0.8 x 0.8 x 2.5 mm to 3.2 x 3.2 x 12 mm) and a confident softmax on its
    grid: class 0 certain (exactly 1.0 in float32) in most voxels."""
    affine = torch.tensor([[0.8, 0, 0, -204.0], [0, 0.8, 0, -190.0], [0, 0, 2.5, -250.0], [0, 0, 0, 1]]).double()
    preprocessing = Compose([Spacingd("image", pixdim=(3.2, 3.2, 12.0), mode="bilinear", dtype=torch.float32)])
    image = preprocessing({"image": MetaTensor(torch.rand(1, 64, 64, 50), affine=affine)})["image"]
    g = torch.Generator().manual_seed(0)
    logits = torch.zeros(3, *image.shape[1:])
    logits[0] = 14 + 4 * torch.randn(image.shape[1:], generator=g)
    logits[1] = 2 * torch.randn(image.shape[1:], generator=g)
    prob = MetaTensor(torch.softmax(logits, 0), meta=image.meta)
    prob.applied_operations = image.applied_operations
    return preprocessing, image, prob


def test_the_interpolation_back_exceeds_one_and_the_served_chain_clips_it():
    preprocessing, image, prob = _resampled_softmax()
    assert (prob == 1).any()
    back = Invertd("pred", transform=preprocessing, orig_keys="image", nearest_interp=False, to_tensor=True)
    raw = back({"pred": prob.clone(), "image": image})["pred"]
    assert raw.max() > 1  # float32 rounding: this is what the served chain meets
    assert float(raw.max()) - 1 <= PROBABILITY_ROUNDING
    clipped = ClipProbabilityRoundingd("pred")({"pred": raw.clone()})["pred"]
    assert float(clipped.max()) == 1.0 and float(clipped.min()) >= 0.0
    np.testing.assert_array_equal(clipped.numpy(), raw.clamp(0, 1).numpy())  # only the rounding moved


# ------------------------------------------------------------------------------------- a full-size CT, served


@pytest.fixture(scope="module")
def confident_bundle(tmp_path_factory):
    """nacl_flare trained for 2 epochs on tiny phantoms with its output layer scaled up (a confident network)."""
    root = tmp_path_factory.mktemp("full_size")
    overrides = {**TINY, "output_dir": str(root / "models"), "data#cache_dir": str(root / "phantoms")}
    run_bundle_workflow(CONFIGS, ["train.json"], "run", epochs=2, **overrides)
    make_confident(root / "models" / "model.pt")
    image, _, affine = generate_phantom(7, 0, shape=FULL_SHAPE, spacing=FULL_SPACING)
    (root / "ct").mkdir()
    nib.save(nib.Nifti1Image(image, affine), str(root / "ct" / "FullCT_0000.nii.gz"))
    return root, overrides


@pytest.mark.parametrize("method", METHODS)
def test_a_full_size_ct_is_served_with_each_recalibration(confident_bundle, method):
    root, overrides = confident_bundle
    models = root / f"models_{method}"
    shutil.copytree(root / "models", models, ignore=shutil.ignore_patterns("calibration.*", "validated_range.json"))
    settings = {**overrides, "output_dir": str(models)}
    run_bundle_workflow(CONFIGS, ["train.json", "calibrate.json"], "calibrate", **settings, calibration_method=method)
    assert json.loads((models / "calibration.json").read_text())["method"] == method
    out = root / f"inference_{method}"
    inference = {k: v for k, v in overrides.items() if k != "output_dir"}
    run_bundle_workflow(
        CONFIGS,
        ["train.json", "inference.json"],
        "inferring",
        **inference,
        model_path=str(models / "model.pt"),
        output_dir=str(out),
        dataset_dir=str(root / "ct"),
    )
    segmentation = nib.load(str(out / "FullCT_0000_seg.nii.gz"))
    confidence = np.asarray(nib.load(str(out / "FullCT_0000_conf.nii.gz")).dataobj)
    assert segmentation.shape == confidence.shape == FULL_SHAPE
    np.testing.assert_allclose(segmentation.header.get_zooms(), FULL_SPACING, rtol=1e-6)
    assert confidence.max() <= 1.0 and confidence.min() >= 1 / 5 - 1e-6  # the top of 5 probabilities
    with open(out / "quality.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["case"] == "FullCT_0000" and 0 <= float(row["case_score"]) <= 1


# ------------------------------------------------------------------------- the outputs mapped back, axis by axis


def _reoriented_and_resampled():
    """An LPS-stored image (flipped axes, a z offset that is not a whole voxel) through ``Orientationd`` and
    ``Spacingd`` to a coarser grid, and a smooth confidence and label map on that grid."""
    from monai.transforms import Orientationd

    affine = torch.tensor([[-0.8, 0, 0, 30.0], [0, -0.8, 0, 20.0], [0, 0, 2.5, -41.3], [0, 0, 0, 1]]).double()
    chain = Compose(
        [
            Orientationd("image", axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
            Spacingd("image", pixdim=(3.2, 3.0, 12.0), mode="bilinear", dtype=torch.float32),
        ]
    )
    image = chain({"image": MetaTensor(torch.rand(1, 61, 47, 29), affine=affine)})["image"]
    g = torch.Generator().manual_seed(1)
    confidence = MetaTensor(torch.rand(1, *image.shape[1:], generator=g), meta=dict(image.meta))
    labels = MetaTensor(torch.randint(0, 5, (1, *image.shape[1:]), generator=g).to(torch.uint8), meta=dict(image.meta))
    return chain, image, confidence, labels


def test_the_outputs_mapped_axis_by_axis_are_what_invertd_gives():
    """The confidence interpolated axis by axis equals ``Invertd``'s trilinear ``grid_sample`` up to float rounding,
    on the file's grid and affine; the label map equals its nearest ``grid_sample`` except at exact ties between two
    network voxels (the upper taken here, float32 rounding decides there), and keeps its uint8."""
    from calib_monai.data import ToInputGridd
    from calib_monai.data.input_grid import axis_map

    chain, image, confidence, labels = _reoriented_and_resampled()
    axes = axis_map(image)
    assert [a for a, _, _ in axes] == [0, 1, 2] and axes[0][1] == pytest.approx(-0.8 / 3.2)  # x flipped back
    item = {"image": image, "conf": confidence, "seg": labels}
    fast = ToInputGridd(["conf", "seg"], chain, nearest=(False, True))(dict(item))
    slow = Invertd(["conf", "seg"], transform=chain, orig_keys="image", nearest_interp=(False, True))(
        {k: v.clone() if k != "image" else v for k, v in item.items()}
    )
    for key in ("conf", "seg"):
        assert fast[key].shape == slow[key].shape == (1, 61, 47, 29)
        np.testing.assert_allclose(fast[key].affine.numpy(), slow[key].affine.numpy(), atol=1e-5)
    np.testing.assert_allclose(fast["conf"].numpy(), slow["conf"].numpy(), atol=2e-6)
    assert fast["seg"].dtype == torch.uint8
    differ = fast["seg"][0].float() != slow["seg"][0].float()
    midway = torch.zeros(differ.shape, dtype=torch.bool)  # input planes that lie midway between two network planes
    for a, (_, scale, offset) in enumerate(axes):
        coordinate = torch.arange(differ.shape[a], dtype=torch.float64) * scale + offset
        tie = ((coordinate - coordinate.floor()) - 0.5).abs() < 1e-5
        midway |= tie.reshape([-1 if i == a else 1 for i in range(3)]).expand(differ.shape)
    assert differ.any() and not (differ & ~midway).any()  # ties only


def test_other_spatial_steps_fall_back_to_invertd():
    """A crop is not an axis-to-axis map of the whole grid: ``Invertd`` through the chain, the label map its uint8."""
    from monai.transforms import SpatialCropd

    from calib_monai.data import ToInputGridd
    from calib_monai.data.input_grid import axis_map

    chain = Compose([SpatialCropd("image", roi_start=(2, 2, 1), roi_end=(10, 9, 5))])
    image = chain({"image": MetaTensor(torch.rand(1, 12, 11, 6), affine=torch.eye(4, dtype=torch.float64))})["image"]
    assert axis_map(image) is None
    labels = MetaTensor(torch.ones(1, *image.shape[1:], dtype=torch.uint8), meta=dict(image.meta))
    out = ToInputGridd("seg", chain, nearest=True)({"image": image, "seg": labels})["seg"]
    assert out.shape == (1, 12, 11, 6) and out.dtype == torch.uint8
    assert int(out.sum()) == 8 * 7 * 4  # the crop's voxels, zeros around


def _network_grid_outputs(chain, g):
    image = chain(
        {
            "image": MetaTensor(
                torch.rand(1, 37, 29, 5, generator=g),
                affine=torch.diag(torch.tensor([1.4, 1.4, 8.0, 1.0], dtype=torch.float64)),
            )
        }
    )["image"]
    spatial, meta = image.shape[1:], dict(image.meta)
    labels = {
        key: MetaTensor(torch.randint(0, n, (c, *spatial), generator=g).to(torch.uint8), meta=dict(meta))
        for key, n, c in (("seg", 4, 1), ("inner", 2, 3), ("outer", 2, 3))
    }
    labels["outer"].meta["case_name"] = "only_outer_has_it"
    return {"image": image, "conf": MetaTensor(torch.rand(1, *spatial, generator=g), meta=meta), **labels}


@pytest.mark.parametrize("path", ["invertd", "axis_by_axis"])
def test_keys_that_cross_together_are_each_what_they_would_be_alone(path):
    """The segmentation and the contour masks (uint8, nearest) cross as one tensor of their channels, the confidence
    (float, linear) apart: each key equals MONAI's ``Invertd`` of it alone (a resize, as ACDC's, takes that path), or
    axis by axis, mapping it alone. Each keeps its dtype, its channels and its own meta data."""
    from monai.transforms import Orientationd, Resized

    from calib_monai.data import ToInputGridd

    if path == "invertd":
        chain = Compose(
            [Orientationd("image", axcodes="RAS"), Resized("image", spatial_size=(16, 16, -1), mode="area")]
        )
    else:
        chain = _reoriented_and_resampled()[0]
    item = _network_grid_outputs(chain, torch.Generator().manual_seed(3))
    keys, nearest = ("seg", "conf", "inner", "outer"), (True, False, True, True)
    together = ToInputGridd(keys, chain, nearest=nearest)(dict(item))
    for key, near in zip(keys, nearest):
        if path == "invertd":
            alone = Invertd(key, transform=chain, orig_keys="image", nearest_interp=near)(dict(item))[key]
        else:
            alone = ToInputGridd(key, chain, nearest=near)(dict(item))[key]
        assert together[key].dtype == item[key].dtype and together[key].shape[0] == item[key].shape[0]
        assert together[key].shape[1:] == (37, 29, 5)
        np.testing.assert_array_equal(together[key].numpy(), alone.to(item[key].dtype).numpy())
        np.testing.assert_allclose(together[key].affine.numpy(), alone.affine.numpy(), atol=1e-6)
    assert together["outer"].meta["case_name"] == "only_outer_has_it" and "case_name" not in together["inner"].meta
