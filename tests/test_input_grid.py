"""The truth on the input grid: the label kept as read, the true DSC of the delivered segmentation beside the served
estimate, and a range scored on any grid but the served one refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from monai.metrics import compute_dice
from monai.networks.utils import one_hot
from monai.transforms import Compose, EnsureTyped, Orientationd, Resized

from calib_monai.data import KeepInputLabeld
from calib_monai.metrics.report_table import served_verdict
from calib_monai.review import DeliveredDiced, ValidatedRange
from calib_monai.review.validated_range import read_validated_range


def _volume(shape=(12, 10, 3), seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    affine = torch.diag(torch.tensor([2.0, 1.5, 5.0, 1.0]))
    image = MetaTensor(torch.rand(1, *shape, generator=g), affine=affine)
    label = MetaTensor(torch.randint(0, 3, (1, *shape), generator=g).float(), affine=affine)
    return {"image": image, "label": label}


def _chain() -> Compose:
    """An evaluation chain as the bundles write it: the label kept as read, then the spatial steps."""
    return Compose(
        [
            KeepInputLabeld("label"),
            EnsureTyped(["image", "label"], dtype=torch.float32, track_meta=True),
            Orientationd(["image", "label"], axcodes="LPS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
            Resized(["image", "label"], spatial_size=(6, 5, -1), mode=("trilinear", "nearest")),
        ]
    )


def test_the_label_is_kept_as_read_in_the_smallest_integer_type():
    item = _volume()
    chain = _chain()
    out = chain(dict(item))
    kept = out["input_label"]
    assert kept.dtype == torch.uint8 and tuple(kept.shape) == (1, 12, 10, 3)  # untouched by the spatial steps
    assert torch.equal(kept.as_tensor().long(), item["label"].as_tensor().long())
    assert tuple(out["label"].shape) == (1, 6, 5, 3)
    big = {"label": MetaTensor(torch.tensor([[[[300.0]]]]))}
    assert KeepInputLabeld("label")(big)["input_label"].dtype == torch.int32
    with pytest.raises(ValueError, match="2 keys but 1 names"):
        KeepInputLabeld(["label", "image"], names="x")


def test_delivered_dice_equals_monai_compute_dice_with_an_absent_class():
    g = torch.Generator().manual_seed(3)
    prob = torch.softmax(torch.randn(4, 9, 8, 2, generator=g) * 3, dim=0)
    label = torch.randint(0, 3, (1, 9, 8, 2), generator=g)  # class 3 absent from the label
    names = {"0": "background", "1": "a", "2": "b", "3": "c"}
    out = DeliveredDiced("prob", label_key="input_label", label_names=names)(
        {"prob": prob, "input_label": label, "quality": {"case_score": 0.5}}
    )
    delivered = out["quality"]["delivered"]
    pred = one_hot(prob.argmax(0, keepdim=True)[None], 4)
    expected = compute_dice(pred, one_hot(label[None], 4), include_background=False, ignore_empty=True)[0]
    assert list(delivered["dice"]) == ["a", "b", "c"] and math.isnan(delivered["dice"]["c"])
    assert np.allclose(
        [delivered["dice"]["a"], delivered["dice"]["b"]], expected[:2].double().numpy(), atol=1e-6
    )  # MONAI: float32
    assert delivered["mean_dice"] == pytest.approx(float(expected[:2].double().mean()), abs=1e-6)
    assert out["quality"]["case_score"] == 0.5  # the served quality kept
    with pytest.raises(ValueError, match="both must be on the input grid"):
        DeliveredDiced("prob")({"prob": prob, "input_label": label[:, :4]})


def test_the_report_row_shows_the_served_score_and_the_delivered_truth():
    quality = {"case_score": 0.8, "review": {"flag": False, "reasons": []}, "delivered": {"mean_dice": 0.7}}
    assert served_verdict(quality) == {
        "flag": False,
        "reasons": [],
        "served_case_score": 0.8,
        "delivered_mean_dice": 0.7,
    }
    assert served_verdict({"case_score": 0.8}) is None and served_verdict(None) is None


def test_a_range_from_an_older_calibrate_is_refused_in_one_line(tmp_path):
    """A validated_range.json without ``scored_on`` (an older calibrate's): a one-line error naming the file, the
    missing field and the fix."""
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"weights")
    ValidatedRange([0.9] * 19).save(tmp_path / "validated_range.json", weights)
    assert read_validated_range(tmp_path, weights)[0].scored_on == "network grid"  # the served grid
    record = json.loads((tmp_path / "validated_range.json").read_text())
    del record["scored_on"]
    (tmp_path / "validated_range.json").write_text(json.dumps(record))
    with pytest.raises(ValueError) as error:
        read_validated_range(tmp_path, weights)
    message = str(error.value)
    assert str(tmp_path / "validated_range.json") in message and "'scored_on'" in message and "\n" not in message
    assert message.endswith("delete it and run the bundle's calibrate step again")
    record["scored_on"] = "input grid"  # an earlier calibrate's: served cases are scored on the network grid
    (tmp_path / "validated_range.json").write_text(json.dumps(record))
    with pytest.raises(ValueError) as error:
        read_validated_range(tmp_path, weights)
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'validated_range.json'}: validated range scored_on is 'input grid'")
    assert "\n" not in message and message.endswith("delete it and run the bundle's calibrate step again")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the label copy stays on the CPU, prob on GPU")
def test_delivered_dice_takes_a_cpu_label_beside_gpu_probabilities():
    prob = torch.softmax(torch.randn(3, 8, 8, 2), dim=0)
    label = torch.randint(0, 3, (1, 8, 8, 2))
    on_cpu = DeliveredDiced("prob")({"prob": prob, "input_label": label})["quality"]["delivered"]
    on_gpu = DeliveredDiced("prob")({"prob": prob.cuda(), "input_label": label})["quality"]["delivered"]
    assert on_gpu["mean_dice"] == pytest.approx(on_cpu["mean_dice"])
