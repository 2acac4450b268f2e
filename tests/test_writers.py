"""``inferring``'s NIfTI writer (``calib_monai.data.writers.GridNibabelWriter``) against MONAI's own
``NibabelWriter``: the same voxels, affine and dtype in the file, from tensors whatever their memory order."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from monai.data.image_writer import NibabelWriter
from monai.transforms import SaveImage

from calib_monai.data.writers import GridNibabelWriter, in_file_order

AFFINE = torch.tensor([[0.0, -1.2, 0, 10], [1.5, 0, 0, -3], [0, 0, 5, 2], [0, 0, 0, 1]], dtype=torch.float64)
g = torch.Generator().manual_seed(0)
VALUES = {
    "segmentation": (torch.randint(0, 4, (1, 17, 13, 5), generator=g).to(torch.uint8), "uint8"),
    "confidence": (torch.rand(1, 17, 13, 5, generator=g), "float32"),
    "contour masks": (torch.randint(0, 2, (3, 17, 13, 5), generator=g).to(torch.uint8), "uint8"),
    "masks split from the stack": (torch.randint(0, 2, (7, 17, 13, 5), generator=g).to(torch.uint8)[1:4], "uint8"),
    "a transposed view": (torch.rand(1, 13, 17, 5, generator=g).transpose(1, 2), "float32"),
    "labels as float": (torch.randint(0, 3, (1, 9, 8, 7), generator=g).float(), "uint8"),
}


def _save(value: torch.Tensor, dtype: str, writer, path) -> nib.Nifti1Image:
    saver = SaveImage(output_dtype=dtype, resample=False, separate_folder=False, print_log=False, writer=writer)
    saver(MetaTensor(value, affine=AFFINE if value.shape[-1] > 1 else torch.eye(4)), filename=str(path))
    return nib.load(f"{path}.nii.gz")


def _channel_last(value: torch.Tensor) -> np.ndarray:
    """What a NIfTI of ``value`` (channel first) holds: channel last, trailing singleton axes dropped."""
    out = np.moveaxis(value.numpy(), 0, -1)
    while out.ndim > 2 and out.shape[-1] == 1:
        out = out[..., 0]
    return out


@pytest.mark.parametrize("name", list(VALUES))
def test_the_file_holds_what_monais_writer_writes(name, tmp_path):
    value, dtype = VALUES[name]
    ours = _save(value, dtype, GridNibabelWriter, tmp_path / "ours")
    monai = _save(value, dtype, NibabelWriter, tmp_path / "monai")
    assert ours.get_data_dtype() == monai.get_data_dtype() == np.dtype(dtype)
    np.testing.assert_array_equal(np.asanyarray(ours.dataobj), np.asanyarray(monai.dataobj))
    np.testing.assert_array_equal(np.asanyarray(ours.dataobj), _channel_last(value).astype(dtype))
    np.testing.assert_allclose(ours.affine, monai.affine, atol=1e-6)
    np.testing.assert_allclose(ours.affine, AFFINE.numpy(), atol=1e-6)


def test_a_2d_image_is_written_as_it_is(tmp_path):
    """A PNG's outputs, ``(1, H, W, 1)``: MONAI's writer fails on them once the depth axis is squeezed."""
    png = torch.randint(0, 2, (1, 30, 20, 1), generator=g).to(torch.uint8)
    written = _save(png, "uint8", GridNibabelWriter, tmp_path / "png")
    assert written.shape == (30, 20)
    np.testing.assert_array_equal(np.asanyarray(written.dataobj), _channel_last(png))


def test_the_array_handed_to_nibabel_is_in_the_files_order_and_unchanged():
    channel_last = torch.rand(3, 6, 5, 4, generator=g).movedim(0, -1)  # a view, neither C- nor F-ordered
    out = in_file_order(channel_last)
    assert out.flags.f_contiguous and out.shape == (6, 5, 4, 3)
    np.testing.assert_array_equal(out, channel_last.numpy())
    from_numpy = in_file_order(channel_last.numpy())
    assert from_numpy.flags.f_contiguous
    np.testing.assert_array_equal(from_numpy, channel_last.numpy())
    one_channel = torch.rand(6, 5, 4, generator=g)  # C-ordered already: handed over as it is, no copy
    assert np.shares_memory(in_file_order(one_channel), one_channel.numpy())
