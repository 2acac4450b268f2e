"""The input signal's acquisition geometry: the field of view and acquired voxel spacing read through MONAI's own
loader and spatial transforms (hand-computed), and the review rule flagging an image from another protocol while an
image of the same protocol, a float's noise off, or one without a geometry is judged as before; ghosts seen by the
spectrum roughness along the phase-encoding axis, and a gamma by the intensity skewness."""

from __future__ import annotations

import json
import math

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged, Orientationd, Resized, Spacingd

from calib_monai.data.site_shift import ghosting
from calib_monai.metrics.image_statistics import (
    image_geometry,
    image_statistic_names,
    image_statistics,
    input_statistic_names,
    input_statistics,
)
from calib_monai.review import ValidatedRange, read_validated_range


def _read(path, pixdim=(2.0, 2.0, -1), size=(48, 48, -1)):
    chain = Compose(
        [
            LoadImaged("image", image_only=True),
            EnsureChannelFirstd("image"),
            Orientationd("image", axcodes="RAS", labels=None),
            Spacingd("image", pixdim=pixdim),
            Resized("image", spatial_size=size),
        ]
    )
    return chain({"image": str(path)})["image"]


def test_the_geometry_is_the_files_through_resampling_and_reorientation(tmp_path):
    # a file of 100 x 80 x 9 voxels of 1.5 x 1.5 x 10 mm: field of view 150 x 120 x 90 mm, whatever the grid
    path = tmp_path / "a.nii.gz"
    nib.save(nib.Nifti1Image(np.random.rand(100, 80, 9).astype(np.float32), np.diag([1.5, 1.5, 10.0, 1.0])), path)
    image = _read(path)
    assert tuple(image.shape[1:]) == (48, 48, 9)
    fov, spacing = np.exp(image_geometry(image)[:3]), np.exp(image_geometry(image)[3:])
    np.testing.assert_allclose(fov, [150.0, 120.0, 90.0], rtol=1e-6)
    np.testing.assert_allclose(spacing, [1.5, 1.5, 10.0], rtol=1e-6)
    # the same voxels stored with the slice axis first (its affine permutes the axes): the reader's RAS
    # reorientation puts the 10 mm axis last again, and its spacing follows it
    permuted = tmp_path / "b.nii.gz"
    affine = np.array([[0, 1.5, 0, 0], [0, 0, 1.5, 0], [10.0, 0, 0, 0], [0, 0, 0, 1]])
    nib.save(nib.Nifti1Image(np.random.rand(9, 100, 80).astype(np.float32), affine), permuted)
    again = _read(permuted)
    np.testing.assert_allclose(np.exp(image_geometry(again)), np.exp(image_geometry(image)), rtol=1e-6)
    # a plain tensor has no geometry: NaN, named so the rule can leave it out
    assert all(math.isnan(v) for v in image_geometry(torch.zeros(1, 4, 4, 2)))
    assert input_statistic_names(1, 3)[-1] == "voxel spacing along axis 2"
    assert len(input_statistics(image)) == len(input_statistic_names(1, 3)) == 3 + 3 + 3 + 3 + 3 + 3 + 6


def _protocol_images(tmp_path, n, spacing, shape, name, seed=0):
    """``n`` NIfTI files of one protocol, sizes varying by a few voxels, read through the served chain: the same ramp
    along the first axis in each, so that only their geometry tells them apart."""
    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        size = [s + int(rng.integers(-3, 4)) for s in shape]
        path = tmp_path / f"{name}{i}.nii.gz"
        ramp = np.broadcast_to(np.linspace(0, 1, size[0])[:, None, None], size).astype(np.float32)
        nib.save(nib.Nifti1Image(ramp, np.diag([*spacing, 1.0])), path)
        images.append(_read(path, pixdim=(2.0, 2.0, -1), size=(32, 32, -1)))
    return images


def test_an_image_of_another_protocol_is_flagged_by_its_geometry(tmp_path):
    # 19 validation images of a cardiac-like protocol (1.5 x 1.5 x 10 mm, about 200 x 200 x 9) and a test image of
    # a brain-crop protocol (1 mm isotropic, 35 x 50 x 35): its slices are 10x thinner, log 10 / log 1.1 = 24.2
    # spreads (the floor: the validation images all have 10 mm), the farthest statistic: flagged, the reason names it
    cardiac = _protocol_images(tmp_path, 20, (1.5, 1.5, 10.0), (200, 200, 9), "c")
    brain = _protocol_images(tmp_path, 1, (1.0, 1.0, 1.0), (35, 50, 35), "h", seed=1)[0]
    names = input_statistic_names(1, 3)
    stats = [input_statistics(i) for i in cardiac[:-1]]
    scores = [0.8 + 0.001 * i for i in range(19)]
    validated = ValidatedRange(scores, inputs=stats, input_check=True, input_names=names)
    assert validated.check({"case_score": 0.81, "classes": {}}, input_statistics(cardiac[-1]))["flag"] is False
    verdict = validated.check({"case_score": 0.81, "classes": {}}, input_statistics(brain))
    assert verdict["flag"] is True
    assert verdict["reasons"][0].startswith(
        "image unlike the validation images (voxel spacing along axis 2 1 mm, typically 10 mm: distance 24.2 standard "
        "deviations"
    )
    # a shift flag says that the estimate's level cannot be vouched for (it never stays confident without a word)
    assert verdict["reasons"][0].endswith("); the estimated DSC is not vouched for on such a case")
    # a float's noise in the spacing of an image of the protocol moves no statistic by 1e15 spreads
    noisy = input_statistics(cardiac[-1])
    noisy[-1] += 1e-9
    assert validated.check({"case_score": 0.81, "classes": {}}, noisy)["flag"] is False
    # without a geometry (a plain array), the intensities judge it, and the verdict says what was left out
    plain = validated.check({"case_score": 0.81, "classes": {}}, input_statistics(cardiac[-1].as_tensor()))
    assert plain["flag"] is False
    assert plain["left_out"] == [
        "image geometry left out: the image carries no original_affine (a PNG, or an array MONAI's reader did not load)"
    ]
    # validation images without a geometry (PNGs): the case's is left out too, for all n + 1 alike, and said so
    flat = [input_statistics(i.as_tensor()) for i in cardiac[:-1]]
    unknown = ValidatedRange(scores, inputs=flat, input_check=True, input_names=names)
    verdict = unknown.check({"case_score": 0.81, "classes": {}}, input_statistics(brain))
    assert verdict["left_out"] == ["image geometry left out: the validation images carry none (PNGs or arrays)"]
    assert "input" in verdict["signals"]
    # with the training images' fixed reference: the same verdicts
    reference = np.asarray(stats)
    fixed = ValidatedRange(
        scores,
        inputs=stats,
        input_check=True,
        input_names=names,
        input_reference={"mean": reference.mean(0).tolist(), "std": reference.std(0).tolist(), "images": 19},
    )
    assert fixed.check({"case_score": 0.81, "classes": {}}, input_statistics(brain))["flag"] is True
    assert fixed.check({"case_score": 0.81, "classes": {}}, noisy)["flag"] is False


def test_a_range_whose_statistics_differ_from_the_cases_cannot_judge():
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(1, 8, 8, 4, generator=g) for _ in range(20)]
    validated = ValidatedRange(
        [0.8 + 0.001 * i for i in range(19)],
        inputs=[input_statistics(i) for i in images[:-1]],
        input_check=True,
        input_names=input_statistic_names(1, 3),
    )
    case = input_statistics(images[-1])
    assert validated.check({"case_score": 0.81, "classes": {}}, case)["flag"] is False
    # a case whose statistics are not the range's (another number) cannot judge: null, with the reason
    assert validated.check({"case_score": 0.81, "classes": {}}, case[:3])["flag"] is None


@pytest.mark.parametrize("spatial", [(8, 8), (8, 8, 4)])
def test_the_geometry_of_a_plain_tensor_is_unknown_in_2d_and_3d(spatial):
    assert len(image_geometry(torch.zeros(1, *spatial))) == 2 * len(spatial)


def test_a_stored_range_without_statistics_a_served_case_has_cannot_judge_its_image(tmp_path):
    # an older validated_range.json named fewer statistics (no geometry): a served case's image is not judged, the
    # reason says why and the fix
    stats = [input_statistics(torch.rand(1, 4, 4, 2, generator=torch.Generator().manual_seed(i))) for i in range(3)]
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"weights")
    stored = ValidatedRange([0.8, 0.7, 0.9], inputs=stats, input_check=True, input_names=input_statistic_names(1, 3))
    path = stored.save(tmp_path / "validated_range.json", weights)
    record = json.loads(path.read_text())
    record.update(inputs=[s[:-6] for s in stats], input_names=image_statistic_names(1, 3))
    path.write_text(json.dumps(record))
    older, why = read_validated_range(path, weights)
    review = older.check({"case_score": 0.8, "classes": {}}, stats[0])
    assert why == "" and review["flag"] is None and "input" not in review["signals"]
    assert any(f"has {len(stats[0])} image statistics" in r and "run calibrate again" in r for r in review["reasons"])


def test_ghosts_are_seen_by_the_spectrum_roughness_along_the_phase_axis():
    # 20 smooth images (8 x 8 noise upsampled to 32 x 32, 4 slices): their log power spectra fall smoothly along both
    # in-plane axes (spectrum roughness 0.41 +- 0.12 and 0.35 +- 0.09). Ghosting scales every 4th k-space line along
    # axis 0 by 0.1, a dip of log 100 every 4 lines: the last image's roughness along axis 0 goes from 0.42 to 4.5,
    # about 33 of the others' spreads, while its intensities hardly move; along axis 1 it stays within 2 spreads
    g = torch.Generator().manual_seed(0)
    images = []
    for _ in range(20):
        field = torch.nn.functional.interpolate(torch.rand(1, 1, 8, 8, generator=g), size=(32, 32), mode="bicubic")
        images.append(field[0, ..., None].repeat(1, 1, 1, 4) + 0.02 * torch.rand(1, 32, 32, 4, generator=g))
    ghosted = ghosting(images[-1], intensity=0.9, num_ghosts=4, axis=0)
    before, after = image_statistics(images[-1])[9:12], image_statistics(ghosted)[9:12]  # the spectrum roughness
    assert after[0] > 10 * before[0] and abs(after[1] - before[1]) < 0.2 and after[2] == before[2] == 0.0
    names = input_statistic_names(1, 3)
    stats = [input_statistics(i) for i in images[:-1]]
    validated = ValidatedRange([0.8 + 0.001 * i for i in range(19)], inputs=stats, input_check=True, input_names=names)
    assert validated.check({"case_score": 0.81, "classes": {}}, input_statistics(images[-1]))["flag"] is False
    verdict = validated.check({"case_score": 0.81, "classes": {}}, input_statistics(ghosted))
    assert verdict["flag"] is True
    assert verdict["reasons"][0].startswith("image unlike the validation images (spectrum roughness along axis 0:")


def test_the_spectrum_roughness_of_a_large_image_sums_evenly_strided_lines(monkeypatch):
    # with at most 20 lines per axis, axis 0 of a 12 x 10 x 8 image (80 lines) sums the lines of every 2nd voxel along
    # axes 1 and 2 (step ceil(sqrt(80 / 20)) = 2): the spectrum roughness of the image[:, :, ::2, ::2]'s 20 lines
    import calib_monai.metrics.image_statistics as module

    image = torch.rand(1, 12, 10, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    full = image_statistics(image)
    monkeypatch.setattr(module, "_SPECTRUM_LINES", 20)
    capped = image_statistics(image)
    assert capped[9] == pytest.approx(image_statistics(image[:, :, ::2, ::2])[9], rel=1e-12)  # along axis 0
    assert capped[9] != pytest.approx(full[9], rel=1e-3) and capped[:9] + capped[12:] == full[:9] + full[12:]


def test_the_intensity_skewness_follows_a_contrast_curve_not_a_rescaling():
    # the quantile skewness (q90 + q10 - 2 q50) / (q90 - q10) of a + b x is that of x (a > 0), and of -x its negative
    image = torch.rand(1, 20, 20, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    skew = image_statistics(image)[2]
    assert image_statistics(3.0 * image + 5.0)[2] == pytest.approx(skew, abs=1e-12)
    assert image_statistics(-image)[2] == pytest.approx(-skew, abs=1e-12)
    # uniform values: about 0; x ** 2.2 moves q10, q50, q90 to 0.1 ** 2.2, 0.5 ** 2.2, 0.9 ** 2.2, so about 0.46
    assert abs(skew) < 0.05
    assert image_statistics(image**2.2)[2] == pytest.approx(
        (0.9**2.2 + 0.1**2.2 - 2 * 0.5**2.2) / (0.9**2.2 - 0.1**2.2), abs=0.05
    )


def test_a_gamma_is_seen_by_the_intensity_skewness():
    # 20 smooth images (16 x 16 noise upsampled to 48 x 48, 4 slices) in [0, 1], each stored with its own gain and
    # offset (another scanner's scale, which a served image may keep); a gamma of 2.2 (AdjustContrast, the study's
    # strongest) on the last, before its gain, keeps its mean and spread among the others' and its sharpness and
    # spectra nearly as they were, but moves its intensity skewness from 0.00 to 0.28, 7 of the others' spreads
    # (0.04); the rule flags it and names the skewness
    from calib_monai.data.site_shift import apply_site_shift

    g = torch.Generator().manual_seed(0)
    images, scales = [], []
    for _ in range(20):
        field = torch.nn.functional.interpolate(torch.rand(1, 1, 16, 16, generator=g), size=(48, 48), mode="bicubic")
        image = field[0, ..., None].repeat(1, 1, 1, 4) + 0.02 * torch.rand(1, 48, 48, 4, generator=g)
        images.append((image - image.min()) / (image.max() - image.min()))
        scales.append((0.5 + 1.5 * torch.rand((), generator=g), torch.rand((), generator=g)))
    darker = apply_site_shift(images[-1], "gamma", "strong", seed=1)  # this seed's draw: gamma 2.2, not 1 / 2.2
    assert darker.mean() < images[-1].mean()
    stored = [gain * image + offset for image, (gain, offset) in zip(images + [darker], scales + scales[-1:])]
    before, after = image_statistics(stored[-2])[2], image_statistics(stored[-1])[2]
    assert after - before > 0.25
    names = image_statistic_names(1, 3)
    stats = [image_statistics(i) for i in stored[:-2]]
    validated = ValidatedRange([0.8 + 0.001 * i for i in range(19)], inputs=stats, input_check=True, input_names=names)
    assert validated.check({"case_score": 0.81, "classes": {}}, image_statistics(stored[-2]))["flag"] is False
    verdict = validated.check({"case_score": 0.81, "classes": {}}, image_statistics(stored[-1]))
    assert verdict["flag"] is True
    assert verdict["reasons"][0].startswith("image unlike the validation images (intensity skewness:"), verdict


def test_the_intensity_skewness_of_a_large_image_takes_evenly_strided_voxels(monkeypatch):
    import calib_monai.metrics.image_statistics as module

    image = torch.rand(2, 12, 10, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64) ** 2
    full = image_statistics(image)
    monkeypatch.setattr(module, "_QUANTILE_VOXELS", 100)  # 960 voxels per channel: every 10th of the flattened
    capped = image_statistics(image)
    per_channel = len(image_statistic_names(1, 3))
    for c in range(2):
        flat = image[c].reshape(-1)[::10]
        q10, q50, q90 = torch.quantile(flat, flat.new_tensor([0.1, 0.5, 0.9]))
        assert capped[c * per_channel + 2] == pytest.approx(float((q90 + q10 - 2 * q50) / (q90 - q10)), rel=1e-12)
        assert capped[c * per_channel + 2] != pytest.approx(full[c * per_channel + 2], rel=1e-4)
