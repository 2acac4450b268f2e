"""The input signal's joint distance: the intensity statistics measured together against the training images'
(Mahalanobis, Ledoit-Wolf), each geometry statistic alone, and what the reason names; a thicker slice seen along its
axis."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from calib_monai.metrics.image_statistics import image_statistic_names, image_statistics
from calib_monai.recalibration.references import fixed_references, group_precision
from calib_monai.review import ValidatedRange

NAMES = ["mean intensity", "intensity spread", "field of view along axis 0"]


def _training(count=60, seed=0):
    # the mean and the spread of an image move together (r about 0.95); the field of view is one protocol's, 100 mm
    g = np.random.default_rng(seed)
    mean = g.normal(0.3, 0.05, count)
    spread = 0.5 * mean + g.normal(0.0, 0.008, count)
    return np.stack([mean, spread, np.full(count, math.log(100.0)) + g.normal(0, 0.01, count)], 1)


def _range(training):
    references = fixed_references(training.tolist(), None, None, input_names=NAMES)
    validation = _training(25, seed=1)
    return ValidatedRange(
        [0.8 + 0.001 * i for i in range(25)],
        inputs=validation.tolist(),
        input_check=True,
        input_names=NAMES,
        input_reference=references["input_reference"],
    )


def test_the_precision_covers_the_intensities_only():
    training = _training()
    precision = group_precision(training, NAMES)
    assert precision.shape == (2, 2)
    # unnamed columns: all of them
    assert group_precision(training, []).shape == (3, 3)
    # a NaN intensity statistic: no joint distance
    spoiled = training.copy()
    spoiled[3, 0] = math.nan
    assert group_precision(spoiled, NAMES) is None


def test_a_joint_move_is_flagged_where_each_statistic_alone_is_ordinary():
    training = _training()
    validated = _range(training)
    mean, std = training.mean(0), training.std(0)
    # the mean up 2 spreads and the spread down 2: each within the others', together far off their line
    case = [mean[0] + 2 * std[0], mean[1] - 2 * std[1], mean[2]]
    verdict = validated.check({"case_score": 0.81, "classes": {}}, case)
    assert verdict["flag"] is True and verdict["signals"]["input"]["value"] > 8
    assert "with the other intensity statistics: distance" in verdict["reasons"][0]
    # along their line (both up 2 spreads) it is ordinary
    along = [mean[0] + 2 * std[0], mean[1] + 2 * std[1], mean[2]]
    assert validated.check({"case_score": 0.81, "classes": {}}, along)["flag"] is False


def test_the_geometry_counts_alone_and_in_mm():
    validated = _range(_training())
    mean = _training().mean(0)
    verdict = validated.check({"case_score": 0.81, "classes": {}}, [mean[0], mean[1], math.log(180.0)])
    assert verdict["flag"] is True
    assert verdict["reasons"][0].startswith("image unlike the training images (field of view along axis 0 180 mm")
    # an image without a geometry: the intensities alone, and the reason says what was left out
    unknown = validated.check({"case_score": 0.81, "classes": {}}, [mean[0], mean[1], math.nan])
    assert unknown["flag"] is False and unknown["left_out"][0].startswith("image geometry left out")
    assert verdict["signals"]["input"]["value"] == pytest.approx(
        abs(math.log(180.0) - _training()[:, 2].mean()) / max(_training()[:, 2].std(), math.log(1.1))
    )


SHADED = NAMES + ["intensity slope along axis 0", "intensity curvature along axis 0"]


def test_the_shading_statistics_count_together_as_their_own_group():
    # identity precisions and a reference of mean 0 and spread 1: the intensities (3, 4) are 5 away together, the
    # shading (6, 8) 10, the geometry 2 alone; the largest counts, and the reason names the shading's largest share
    # (the curvature: 8 * 8 of 100)
    reference = {"mean": [0.0] * 5, "std": [1.0] * 5, "images": 60, "precision": np.eye(2).tolist()}
    reference["shading_precision"] = np.eye(2).tolist()
    validated = ValidatedRange(
        [0.8 + 0.001 * i for i in range(25)],
        inputs=np.zeros((25, 5)).tolist(),
        input_check=True,
        input_names=SHADED,
        input_reference=reference,
    )
    verdict = validated.check({"case_score": 0.81, "classes": {}}, [3.0, 4.0, 2.0 * math.log(1.1), 6.0, 8.0])
    assert verdict["signals"]["input"]["value"] == pytest.approx(10.0)
    assert verdict["reasons"][0].startswith(
        "image unlike the training images (intensity curvature along axis 0 with the other shading statistics: "
        "distance 10.0 standard deviations"
    )
    assert "the shading statistics together" in validated.describe()
    # a shading precision of another size is one error line
    reference["shading_precision"] = np.eye(3).tolist()
    with pytest.raises(ValueError, match="input_reference shading_precision has shape .3, 3. for 2 shading"):
        ValidatedRange(
            [0.8] * 25,
            inputs=np.zeros((25, 5)).tolist(),
            input_check=True,
            input_names=SHADED,
            input_reference=reference,
        )


def test_a_bias_field_is_seen_by_the_shading_statistics(hippocampus_dir):
    # real Hippocampus crops, min-max scaled as the bundles scale them: 100 training images (the reference), 25
    # validation images (the range) and 20 held out, each also under the strongest simulated bias field (MONAI's
    # RandBiasField, degree 3, coefficients up to 0.2). Measured: the shading statistics take the flagged shaded
    # images from 4 to 14 of 20 (a range without them: the same statistics less the slopes and curvatures), while
    # the ordinary held-out images stay unflagged (0 of 20 either way)
    import nibabel as nib
    import torch

    from calib_monai.data.site_shift import apply_site_shift
    from calib_monai.metrics.image_statistics import input_statistic_names, input_statistics, statistic_group

    files = sorted((hippocampus_dir / "imagesTr").glob("hippocampus_*.nii.gz"))[:145]

    def statistics(path, shaded=False, seed=0):
        x = torch.as_tensor(np.asarray(nib.load(path).dataobj, dtype=np.float32))[None]
        x = apply_site_shift(x, "bias_field", "strong", seed=seed) if shaded else x
        return input_statistics((x - x.min()) / (x.max() - x.min()))

    names = input_statistic_names(1, 3)
    training, validation = [statistics(f) for f in files[:100]], [statistics(f) for f in files[100:125]]
    ordinary = [statistics(f) for f in files[125:]]
    shaded = [statistics(f, True, seed) for seed, f in enumerate(files[125:])]

    def flagged(keep):
        columns = [i for i, n in enumerate(names) if keep(n)]
        kept = [names[i] for i in columns]
        pick = lambda rows: [[r[i] for i in columns] for r in rows]  # noqa: E731
        reference = fixed_references(pick(training), None, None, input_names=kept)["input_reference"]
        validated = ValidatedRange(
            [0.8 + 0.001 * i for i in range(25)],
            inputs=pick(validation),
            input_check=True,
            input_names=kept,
            input_reference=reference,
        )
        verdicts = [validated.check({"case_score": 0.812, "classes": {}}, r) for r in pick(ordinary + shaded)]
        return [v["flag"] for v in verdicts[:20]].count(True), [v["flag"] for v in verdicts[20:]].count(True), verdicts

    ordinary_with, shaded_with, verdicts = flagged(lambda n: True)
    ordinary_without, shaded_without, _ = flagged(lambda n: statistic_group(n) != "shading")
    assert ordinary_with <= 2 and ordinary_without <= 2
    assert shaded_with >= 12 and shaded_without <= 6
    assert any("with the other shading statistics" in " ".join(v["reasons"]) for v in verdicts[20:])


def test_a_thicker_slice_is_seen_by_the_sharpness_and_roughness_along_that_axis():
    # 20 images: an in-plane pattern along 16 slices, with slice noise. The case is the last with every 4 slices
    # averaged (a 4x thicker slice): its mean and spread barely move (0.538, 0.287 against the others' 0.54 +- 0.03,
    # 0.286 +- 0.008), its sharpness along axis 2 falls to 0.012 (the others' 0.117 +- 0.004: 30.1 SDs) and its
    # roughness along axis 2 rises to 2 * 15 / 14 (second differences 2J at the 6 of 14 places beside the 3 jumps J
    # of 15 steps; the others' noise 1.750 +- 0.013: 30.4 SDs): the reason names the farthest
    g = torch.Generator().manual_seed(0)
    images = [
        torch.rand(1, 12, 12, 1, generator=g).repeat(1, 1, 1, 16) + 0.1 * torch.rand(1, 12, 12, 16, generator=g)
        for _ in range(20)
    ]
    thick = images[-1].reshape(1, 12, 12, 4, 4).mean(-1).repeat_interleave(4, dim=-1)
    stats = [image_statistics(i) for i in images[:-1]]
    names = image_statistic_names(1, 3)
    case = {"case_score": 0.81, "classes": {"a": {"volume": 1.5}}}
    validated = ValidatedRange([0.8 + 0.001 * i for i in range(19)], inputs=stats, input_check=True, input_names=names)
    assert validated.check(case, image_statistics(images[-1]))["flag"] is False
    verdict = validated.check(case, image_statistics(thick))
    assert verdict["flag"] is True and verdict["reasons"][0].startswith(
        "image unlike the validation images (roughness along axis 2: distance 30.4 standard deviations"
    )
    assert verdict["signals"]["input"]["value"] == pytest.approx((30 / 14 - 1.7496) / 0.012925, rel=1e-3)
    # read back from its record: the same names
    again = ValidatedRange(**{k: validated.record()[k] for k in ("scores", "inputs", "input_check", "input_names")})
    assert again.check(case, image_statistics(thick))["reasons"] == verdict["reasons"]
