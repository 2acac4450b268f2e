"""calib_monai.losses.priors: SVLS kernel, class-proportion prior for every op and border, boundary mask."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from monai.losses import NACLLoss as MonaiNACLLoss

from calib_monai.losses import boundary_mask, class_proportion_prior, svls_kernel


def test_svls_kernel_known_weights_2d() -> None:
    w = svls_kernel(3, 2, 1.0)
    assert w.shape == (3, 3)
    assert w[1, 1] == pytest.approx(0.5)
    assert w[0, 1] == pytest.approx(0.0778, abs=5e-5)  # edge
    assert w[0, 0] == pytest.approx(0.0472, abs=5e-5)  # corner
    # exact: neighbours share 0.5 in proportion to exp(-d^2/2): edge e^-1/2, corner e^-1
    norm = 4 * math.exp(-0.5) + 4 * math.exp(-1.0)
    assert w[1, 0] == pytest.approx(0.5 * math.exp(-0.5) / norm, abs=1e-7)
    assert w.sum() == pytest.approx(1.0, abs=1e-6)


def test_svls_kernel_known_weights_3d() -> None:
    w = svls_kernel(3, 3, 1.0)
    assert w.shape == (3, 3, 3)
    assert w[1, 1, 1] == pytest.approx(0.5)
    assert w[0, 1, 1] == pytest.approx(0.0308, abs=5e-5)  # face
    assert w[0, 0, 1] == pytest.approx(0.0187, abs=5e-5)  # edge
    assert w[0, 0, 0] == pytest.approx(0.0113, abs=5e-5)  # corner
    assert w.sum() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("k, dim", [(5, 2), (7, 2), (5, 3)])
def test_svls_kernel_larger_sizes_centre_half_and_symmetric(k: int, dim: int) -> None:
    w = svls_kernel(k, dim, 2.0)
    centre = (k // 2,) * dim
    assert w[centre] == pytest.approx(0.5)
    assert w.sum() == pytest.approx(1.0, abs=1e-6)
    for axis in range(dim):
        assert torch.equal(w, w.flip(axis))
    # the reference code's bug for k > 3: index (1, 1) is not the centre; here it is a plain neighbour weight
    assert w[(1,) * dim] < 0.5


def _brute_force_window(labels: torch.Tensor, k: int, border: str) -> list[list[int]]:
    """Each voxel's window of labels, built by explicit indexing (independent of the conv/pool code)."""
    batch, *spatial = labels.shape
    labels = labels.numpy()  # plain indexing is much faster than tensor indexing
    r = k // 2
    windows = []
    for b in range(batch):
        for centre in itertools.product(*[range(s) for s in spatial]):
            values = []
            for offset in itertools.product(range(-r, r + 1), repeat=len(spatial)):
                pos = [c + o for c, o in zip(centre, offset)]
                inside = all(0 <= p < s for p, s in zip(pos, spatial))
                if inside:
                    values.append(int(labels[(b, *pos)]))
                elif border == "background":
                    values.append(0)
                elif border == "replicate":
                    values.append(int(labels[(b, *[min(max(p, 0), s - 1) for p, s in zip(pos, spatial)])]))
            windows.append(values)
    return windows


def _reference_index(values: list[int], op: str) -> int:
    if op == "max":
        return max(values)
    if op == "min":
        return min(values)
    if op == "median":
        return sorted(values)[(len(values) - 1) // 2]  # lower median, as torch.median
    counts = Counter(values)
    best = max(counts.values())
    return min(v for v, n in counts.items() if n == best)  # ties -> smallest class


@pytest.mark.parametrize("border", ["background", "zeros", "replicate"])
@pytest.mark.parametrize("op", ["max", "min", "median", "mode"])
@pytest.mark.parametrize("shape, k", [((2, 5, 6), 3), ((1, 4, 5, 3), 3), ((1, 6, 7), 5)])
def test_discrete_priors_match_brute_force(border: str, op: str, shape: tuple, k: int) -> None:
    gen = torch.Generator().manual_seed(sum(map(ord, border + op)) + len(shape))
    num_classes = 4
    labels = torch.randint(0, num_classes, shape, generator=gen)
    tau = class_proportion_prior(labels, num_classes, k, op, border)
    expected = torch.tensor([_reference_index(w, op) for w in _brute_force_window(labels, k, border)])
    assert tau.shape == (shape[0], num_classes, *shape[1:])
    assert torch.equal(tau.sum(1), torch.ones(shape))  # one-hot
    assert torch.equal(tau.argmax(1).flatten(), expected)


@pytest.mark.parametrize("border", ["background", "zeros", "replicate"])
@pytest.mark.parametrize("op, k", [("mean", 3), ("mean", 5), ("svls", 3), ("svls", 5)])
@pytest.mark.parametrize("shape", [(2, 5, 6), (1, 4, 3, 5)])
def test_linear_priors_match_brute_force(border: str, op: str, k: int, shape: tuple) -> None:
    num_classes = 3
    labels = torch.randint(0, num_classes, shape, generator=torch.Generator().manual_seed(k))
    dim = len(shape) - 1
    weights = torch.full((k,) * dim, 1.0 / k**dim) if op == "mean" else svls_kernel(k, dim, 1.0)
    r = k // 2
    offsets = list(itertools.product(range(-r, r + 1), repeat=dim))
    expected = np.zeros((shape[0], num_classes, *shape[1:]))
    weights = weights.numpy()
    for window, (b, *centre) in zip(
        _brute_force_window(labels, k, "replicate"), itertools.product(*[range(s) for s in shape])
    ):
        for value, offset in zip(window, offsets):
            pos = [c + o for c, o in zip(centre, offset)]
            inside = all(0 <= p < s for p, s in zip(pos, shape[1:]))
            w = weights[tuple(o + r for o in offset)]
            if inside or border == "replicate":
                expected[(b, value, *centre)] += w
            elif border == "background":
                expected[(b, 0, *centre)] += w
    tau = class_proportion_prior(labels, num_classes, k, op, border)
    assert torch.allclose(tau, torch.from_numpy(expected).float(), atol=1e-6)


def test_mean_prior_hand_worked() -> None:
    # 3x3 labels; centre window holds everything: 0,0 | 1,1,1 | 2,2,2,2 -> tau(centre) = (2, 3, 4) / 9
    labels = torch.tensor([[[0, 1, 2], [1, 1, 2], [0, 2, 2]]])
    tau = class_proportion_prior(labels, 3, 3, "mean", "background")
    assert torch.allclose(tau[0, :, 1, 1], torch.tensor([2.0, 3.0, 4.0]) / 9)
    # corner (0, 0): in-image window {0, 1, 1, 1} plus 5 outside voxels counted as background
    assert torch.allclose(tau[0, :, 0, 0], torch.tensor([6.0, 3.0, 0.0]) / 9)
    zeros = class_proportion_prior(labels, 3, 3, "mean", "zeros")
    assert torch.allclose(zeros[0, :, 0, 0], torch.tensor([1.0, 3.0, 0.0]) / 9)  # sums to 4/9, not 1
    # discrete ops on the centre window (sorted: 0 0 1 1 1 2 2 2 2): max 2, min 0, median 1, mode 2
    for op, cls in [("max", 2), ("min", 0), ("median", 1), ("mode", 2)]:
        assert int(class_proportion_prior(labels, 3, 3, op)[0, :, 1, 1].argmax()) == cls


@pytest.mark.parametrize("dim, corner_fraction", [(2, 4 / 9), (3, 8 / 27)])
def test_border_modes_sum_to_one_or_the_in_image_fraction(dim: int, corner_fraction: float) -> None:
    labels = torch.randint(0, 3, (2,) + (5,) * dim, generator=torch.Generator().manual_seed(dim))
    background = class_proportion_prior(labels, 3, 3, "mean", "background")
    zeros = class_proportion_prior(labels, 3, 3, "mean", "zeros")
    assert torch.allclose(background.sum(1), torch.ones(labels.shape), atol=1e-6)
    in_image = zeros.sum(1)
    assert in_image[(0,) + (0,) * dim] == pytest.approx(corner_fraction, abs=1e-6)
    assert in_image[(0,) + (2,) * dim] == pytest.approx(1.0, abs=1e-6)
    # the two modes differ only in class 0, by the outside fraction of the window
    assert torch.allclose(background[:, 1:], zeros[:, 1:], atol=1e-7)
    assert torch.allclose(background[:, 0] - zeros[:, 0], 1.0 - in_image, atol=1e-6)


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("op", ["mean", "gaussian"])
def test_zeros_border_prior_equals_monai_target(dim: int, op: str) -> None:
    labels = torch.randint(0, 4, (2,) + (6,) * dim, generator=torch.Generator().manual_seed(3))
    monai_tau = MonaiNACLLoss(classes=4, dim=dim, kernel_ops=op).get_constr_target(labels)
    tau = class_proportion_prior(labels, 4, 3, op, "zeros")
    assert torch.allclose(tau, monai_tau, atol=1e-6)
    # MONAI's tau does not sum to 1 at the border
    assert monai_tau.sum(1)[(0,) + (0,) * dim] < 0.99


def test_gaussian_prior_ignores_kernel_size_like_monai() -> None:
    labels = torch.randint(0, 3, (1, 12, 12), generator=torch.Generator().manual_seed(0))
    k3 = class_proportion_prior(labels, 3, 3, "gaussian", "zeros", sigma=1.0)
    k5 = class_proportion_prior(labels, 3, 5, "gaussian", "zeros", sigma=1.0)
    assert torch.equal(k3, k5)
    # a 9-tap kernel (truncated at 4 sigma) reaches 4 voxels away: a lone voxel of class 1 spreads that far
    lone = torch.zeros(1, 12, 12, dtype=torch.long)
    lone[0, 6, 6] = 1
    spread = class_proportion_prior(lone, 2, 3, "gaussian", "background")[0, 1]
    assert spread[6, 2] > 0 and spread[6, 1] == 0


def test_boundary_mask_hand_worked() -> None:
    labels = torch.zeros(1, 6, 6, dtype=torch.long)
    labels[0, 2:4, 2:4] = 1
    mask = boundary_mask(labels, 3)
    expected = torch.zeros(1, 1, 6, 6, dtype=torch.bool)
    expected[0, 0, 1:5, 1:5] = True  # within one voxel (Chebyshev) of the 2x2 square
    assert mask.dtype == torch.bool and torch.equal(mask, expected)
    # 5x5 window reaches two voxels: everything within distance 2 of the square, i.e. the whole 6x6 image
    assert bool(boundary_mask(labels, 5).all())


def test_boundary_mask_border_modes() -> None:
    labels = torch.ones(1, 4, 5, 3, dtype=torch.long)  # 3D, one class everywhere
    background = boundary_mask(labels, 3, "background")
    assert background.shape == (1, 1, 4, 5, 3)
    # with outside counted as background every voxel touching the border is a boundary voxel; here all of them
    # except the interior line (1..2, 1..3, 1)
    assert int(background.sum()) == 4 * 5 * 3 - 2 * 3 * 1
    assert not bool(boundary_mask(labels, 3, "zeros").any())
    assert not bool(boundary_mask(labels, 3, "replicate").any())


def test_boundary_mask_equals_brute_force() -> None:
    labels = torch.randint(0, 3, (2, 5, 6), generator=torch.Generator().manual_seed(5))
    for border in ("background", "zeros"):
        expected = torch.tensor([len(set(w)) > 1 for w in _brute_force_window(labels, 3, border)])
        assert torch.equal(boundary_mask(labels, 3, border).flatten(), expected)


def test_prior_argument_errors() -> None:
    labels = torch.zeros(1, 4, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"kernel_ops.*'avg'"):
        class_proportion_prior(labels, 2, 3, "avg")
    with pytest.raises(ValueError, match=r"odd.*got 2"):
        boundary_mask(labels, 2)
    with pytest.raises(ValueError, match=r"dtype torch.float32 and shape \(1, 4, 4\)"):
        class_proportion_prior(labels.float(), 2)
    with pytest.raises(ValueError, match=r"dim .* 2 or 3, got 4"):
        svls_kernel(3, 4)
    assert not class_proportion_prior(labels, 2).requires_grad
