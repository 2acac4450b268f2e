"""Simulated site shifts: deterministic for a seed, a change of the image that grows with the strength, the input's
shape, dtype, device and metadata kept, the ghosting transform against its k-space definition, and named errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.data import MetaTensor

from calib_monai.data.site_shift import SITE_SHIFT_KINDS, SITE_SHIFT_STRENGTHS, SITE_SHIFTS, apply_site_shift, ghosting


def phantom(shape=(1, 32, 28, 12), seed=0) -> torch.Tensor:
    """A smooth blob with texture on a dark background, intensities in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    axes = torch.meshgrid(*[torch.linspace(-1, 1, n) for n in shape[1:]], indexing="ij")
    r2 = sum(a**2 for a in axes)
    img = torch.exp(-3 * r2) + 0.05 * torch.rand(shape[1:], generator=g)
    return (img / img.max())[None].float()


def rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()) ** 2).mean().sqrt())


@pytest.mark.parametrize("kind", SITE_SHIFT_KINDS)
def test_each_shift_is_deterministic_changes_the_image_and_keeps_shape_and_dtype(kind):
    image = phantom()
    changes = []
    for strength in SITE_SHIFT_STRENGTHS:
        out = apply_site_shift(image, kind, strength, seed=3)
        assert out.shape == image.shape and out.dtype == image.dtype and type(out) is torch.Tensor
        assert torch.isfinite(out).all()
        assert torch.equal(out, apply_site_shift(image, kind, strength, seed=3))  # same seed, same image
        changes.append(rms(out, image))
    assert changes[0] > 1e-3, f"{kind} mild leaves the image unchanged"
    assert changes[0] < changes[1] < changes[2], f"{kind}: the change does not grow with the strength: {changes}"
    assert torch.equal(image, phantom())  # the input is not modified in place


@pytest.mark.parametrize("kind", ["bias_field", "spike", "ghosting", "gamma"])
def test_the_seed_draws_the_free_parameters(kind):
    image = phantom()
    outs = [apply_site_shift(image, kind, "moderate", seed=s) for s in range(6)]
    assert any(not torch.equal(outs[0], o) for o in outs[1:])


def test_integer_images_metatensors_and_2d():
    image = (phantom() * 1000).to(torch.int16)
    out = apply_site_shift(image, "gibbs", "strong", seed=0)
    assert out.dtype == torch.int16 and out.shape == image.shape and not torch.equal(out, image)
    affine = torch.diag(torch.tensor([2.0, 1.5, 3.0, 1.0]))
    meta = MetaTensor(phantom(), affine=affine, meta={"filename_or_obj": "case.nii.gz"})
    out = apply_site_shift(meta, "bias_field", "mild", seed=1)
    assert (
        isinstance(out, MetaTensor) and torch.equal(out.affine, affine) and out.meta["filename_or_obj"] == "case.nii.gz"
    )
    flat = phantom((1, 30, 26))  # 2D: every kind but the slice thickness
    for kind in set(SITE_SHIFT_KINDS) - {"resolution"}:
        assert apply_site_shift(flat, kind, "mild", 0).shape == flat.shape
    with pytest.raises(ValueError, match="resolution needs a 3D image"):
        apply_site_shift(flat, "resolution", "mild", 0)


def test_resolution_keeps_a_volume_constant_through_plane():
    # a volume constant along the slice axis loses nothing to a thicker slice (area down, linear back)
    image = phantom((1, 20, 16, 1)).expand(1, 20, 16, 15).contiguous()
    out = apply_site_shift(image, "resolution", "strong", 0)
    np.testing.assert_allclose(out.numpy(), image.numpy(), atol=1e-6)


def test_ghosting_matches_its_k_space_definition():
    # numpy reference: centred 2D FFT per slice, lines 0, n, 2n... along the axis scaled by 1 - intensity except
    # the centre ones, inverse, real part
    image = phantom((1, 16, 12, 3))
    out = ghosting(image, intensity=0.5, num_ghosts=3, axis=1, restore=0.0)
    k = np.fft.fftshift(np.fft.fftn(image.numpy().astype(np.float64), axes=(1, 2)), axes=(1, 2))
    scale = np.ones(12)
    scale[::3] = 0.5
    scale[5:7] = 1.0  # restore=0 still keeps one line either side of the centre (12 // 2 = 6)
    ref = np.fft.ifftn(np.fft.ifftshift(k * scale[None, None, :, None], axes=(1, 2)), axes=(1, 2)).real
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-5)
    assert torch.allclose(ghosting(image, 0.0, 3, 0), image, atol=1e-6)  # intensity 0: the image itself


def test_unknown_names_and_bad_images():
    with pytest.raises(ValueError, match="did you mean 'ghosting'"):
        apply_site_shift(phantom(), "ghost", "mild", 0)
    with pytest.raises(ValueError, match="did you mean 'strong'"):
        apply_site_shift(phantom(), "gibbs", "stronger", 0)
    with pytest.raises(ValueError, match="image: expected a channel-first tensor"):
        apply_site_shift(torch.zeros(5, 5), "gibbs", "mild", 0)
    with pytest.raises(ValueError, match="intensity must be in"):
        ghosting(phantom(), 1.5, 3, 0)
    assert set(SITE_SHIFTS) == set(SITE_SHIFT_KINDS) and all(
        set(v) == set(SITE_SHIFT_STRENGTHS) for v in SITE_SHIFTS.values()
    )
