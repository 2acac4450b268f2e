"""One implementation for every input: NumPy arrays (any layout, byte order, integer dtype) and tensors with labels
of any integer dtype give the values of int64 tensors, and the labels are not copied to int64 whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calib_monai.metrics import calibration_errors, reliability_diagram_data, segmentation_calibration
from calib_monai.metrics.calibration.inputs import select_voxels

NAMES = ("ece", "cece", "tace", "ace", "ml1ace", "nll", "brier")


def _case(seed: int = 0, shape=(2, 3, 10, 9, 4)):
    g = torch.Generator().manual_seed(seed)
    probs = (2 * torch.randn(shape, generator=g)).softmax(1)
    labels = torch.randint(0, shape[1], (shape[0], 1, *shape[2:]), generator=g)
    return probs, labels


@pytest.mark.parametrize("foreground", ["gt", "all"])
def test_label_dtypes_give_the_int64_values(foreground):
    probs, labels = _case()
    expected = calibration_errors(probs, labels, NAMES, foreground=foreground)
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.float32):
        got = calibration_errors(probs, labels.to(dtype), NAMES, foreground=foreground)
        assert got == pytest.approx(expected, rel=0, abs=0), dtype
    for dtype in (np.uint8, np.uint16, np.uint32, np.int32, np.dtype(">i4"), np.float64):
        got = calibration_errors(probs.numpy(), labels.numpy().astype(dtype), NAMES, foreground=foreground)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15), dtype


def test_numpy_layouts_byte_order_and_lists():
    probs, labels = _case(1)
    expected = calibration_errors(probs.double(), labels, NAMES, foreground="all")
    p64 = probs.double().numpy()
    fortran = np.asfortranarray(p64)  # not C-contiguous
    big_endian = p64.astype(">f8")
    for p in (fortran, big_endian, p64.tolist()):
        assert calibration_errors(p, labels.numpy(), NAMES, foreground="all") == pytest.approx(expected, abs=1e-12)
    reversed_p = np.ascontiguousarray(p64[..., ::-1])[..., ::-1]  # negative strides
    assert calibration_errors(reversed_p, labels.numpy(), NAMES, foreground="all") == pytest.approx(expected, abs=1e-12)
    # two classes given as bool labels: the same as 0/1
    two = torch.stack([1 - probs[:, 1], probs[:, 1]], 1)
    as_bool = labels > 1
    assert calibration_errors(two, as_bool, NAMES, foreground="all") == pytest.approx(
        calibration_errors(two, as_bool.long(), NAMES, foreground="all"), abs=0
    )
    per_volume = segmentation_calibration(probs.numpy(), labels.numpy().astype(np.uint8), "cece", reduction="none")
    np.testing.assert_allclose(per_volume, segmentation_calibration(probs, labels, "cece", reduction="none"), atol=0)
    rel = reliability_diagram_data(probs.numpy(), labels.numpy().astype(np.int16), classwise=True)
    np.testing.assert_array_equal(rel["count"], reliability_diagram_data(probs, labels, classwise=True)["count"])


def test_selected_labels_keep_their_dtype():
    probs, labels = _case(2)
    p, y = probs[0].flatten(1), labels[0, 0].flatten().to(torch.uint8)
    for foreground in ("gt", "all"):
        _, selected = select_voxels(p, y, foreground)
        assert selected.dtype == torch.uint8
    _, selected = select_voxels(p, y, "all")
    assert selected.data_ptr() == y.data_ptr()  # every voxel: the very labels, no copy
    _, from_float = select_voxels(p, y.float(), "all")
    assert from_float.dtype == torch.int64


def test_a_non_numeric_array_is_refused_in_one_line():
    with pytest.raises(
        ValueError, match=r"^labels must be a numeric array \(probabilities or integer labels\), got dtype <U1\.$"
    ):
        calibration_errors(np.full((2, 3), 0.5), np.array(["a", "b", "c"]), foreground="all")
