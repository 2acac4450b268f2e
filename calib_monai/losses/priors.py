"""Neighbourhood targets of the spatially-aware losses (SVLS, NACL, CRaC), from ``int64`` labels ``(B, *spatial)``.

:func:`svls_kernel` (Islam & Glocker, IPMI 2021), :func:`class_proportion_prior` (NACL's ``tau``, Murugesan et al.,
MICCAI 2023 / MedIA 2024) and :func:`boundary_mask` (CRaC's region split, MICCAI 2024). They run under ``no_grad``
with whole-tensor window reductions. Border modes, what voxels outside the image count as:

* ``"background"``: class 0, as the authors' code (``nn.Unfold`` zero-pads the label map): ``tau`` sums to 1;
* ``"zeros"``: nothing (MONAI's ``NACLLoss``): at the border ``tau`` sums to less than 1, and max/min/median/mode
  see the in-image part of the window only;
* ``"replicate"``: the nearest in-image label (SVLS).

Discrete kernel ops (NACL MICCAI Table 3; as the authors' code ``Bala93/MarginLoss``, ``spatial_adaptive_margin.py``):
``tau`` is the one-hot of the window's largest (``"max"``, dilation), smallest (``"min"``, erosion), lower median
(``"median"``, element ``(n - 1) // 2`` of the sorted window) or most frequent (``"mode"``, ties to the smallest)
class index, computed from per-class window counts and window max/min.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from monai.networks.layers.convutils import gaussian_1d

from calib_monai.checks import check_option as _check_option

__all__ = ["BORDER_MODES", "KERNEL_OPS", "boundary_mask", "class_proportion_prior", "svls_kernel"]

KERNEL_OPS = ("mean", "gaussian", "svls", "max", "min", "median", "mode")
BORDER_MODES = ("background", "zeros", "replicate")


def _check_kernel_size(kernel_size: int, minimum: int = 1) -> int:
    is_int = isinstance(kernel_size, int) and not isinstance(kernel_size, bool)
    if not is_int or kernel_size < minimum or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be an odd integer >= {minimum}, got {kernel_size!r}.")
    return kernel_size


def _check_labels(labels: torch.Tensor) -> int:
    if labels.ndim not in (3, 4) or labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(
            "labels must be integer class indices of shape (B, H, W) or (B, H, W, D), "
            f"got dtype {labels.dtype} and shape {tuple(labels.shape)}."
        )
    return labels.ndim - 1


def svls_kernel(kernel_size: int = 3, dim: int = 2, sigma: float = 1.0) -> torch.Tensor:
    """The SVLS kernel: a Gaussian over a ``k^dim`` patch whose centre weighs 0.5 and whose neighbours share 0.5.

    .. math::
        w_c = 1/2, \\qquad w_i = \\frac{1}{2} \\frac{g_i}{\\sum_{j \\ne c} g_j}, \\qquad
        g_i = \\exp\\left(-\\frac{\\lVert x_i - x_c \\rVert^2}{2 \\sigma^2}\\right)

    Islam & Glocker, "Spatially Varying Label Smoothing: Capturing Uncertainty from Expert Annotations", IPMI 2021.

    Args:
        kernel_size: odd patch size ``k >= 3``.
        dim: 2 or 3.
        sigma: Gaussian standard deviation, > 0.

    Returns a float32 tensor of shape ``(k,) * dim`` summing to 1.

    >>> k = svls_kernel(3, dim=2, sigma=1.0)
    >>> round(k.sum().item(), 4), k[1, 1].item(), round(k[0, 1].item(), 4), round(k[0, 0].item(), 4)
    (1.0, 0.5, 0.0778, 0.0472)
    """
    _check_kernel_size(kernel_size, minimum=3)
    if dim not in (2, 3):
        raise ValueError(f"dim (number of spatial dims) must be 2 or 3, got {dim!r}.")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}.")
    offsets = torch.arange(kernel_size, dtype=torch.float64) - kernel_size // 2
    grids = torch.meshgrid(*([offsets] * dim), indexing="ij")
    squared_distance = sum(g**2 for g in grids)
    weights = torch.exp(-squared_distance / (2.0 * sigma**2))
    centre = (kernel_size // 2,) * dim
    weights[centre] = 0.0
    weights = 0.5 * weights / weights.sum()
    weights[centre] = 0.5
    return weights.float()


# The priors are computed every training step with the same few kernels: build each once per device and dtype
# (never modified in place), so that a GPU step copies no kernel from the host.
@functools.lru_cache(maxsize=64)
def _svls_kernel(kernel_size: int, dim: int, sigma: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return svls_kernel(kernel_size, dim, sigma).to(device, dtype)


@functools.lru_cache(maxsize=64)
def _gaussian_taps(sigma: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """MONAI GaussianFilter's 1D taps (erf approximation, truncated at 4 sigma), built once per sigma."""
    return gaussian_1d(torch.tensor(sigma), truncated=4.0, approx="erf").to(device, dtype)


def _one_hot(labels: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """``(B, *spatial)`` indices -> contiguous ``(B, C, *spatial)`` one-hot (scatter avoids F.one_hot's permute)."""
    out = torch.zeros((labels.shape[0], num_classes, *labels.shape[1:]), dtype=dtype, device=labels.device)
    return out.scatter_(1, labels.unsqueeze(1), 1.0)


def _padded_one_hot(
    labels: torch.Tensor, num_classes: int, radius: int, border: str, dtype: torch.dtype
) -> torch.Tensor:
    """One-hot map padded by ``radius`` on every spatial side according to ``border``."""
    pad = [radius] * (2 * (labels.ndim - 1))
    if border == "background":
        return _one_hot(F.pad(labels, pad, value=0), num_classes, dtype)
    if border == "zeros":
        return F.pad(_one_hot(labels, num_classes, dtype), pad, value=0.0)
    return F.pad(_one_hot(labels, num_classes, dtype), pad, mode="replicate")


# Window filters below are "valid" (the input is pre-padded by the border mode); box sums and max/min are separable
# shifted-view passes, several times faster on CPU than stride-1 avg_pool/max_pool.


def _box_reduce(x: torch.Tensor, kernel_size: int, op: str) -> torch.Tensor:
    """Sum, max or min over every ``k^dim`` window of a padded ``(B, C, *spatial)`` tensor."""
    combine = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}[op]
    for axis in range(2, x.ndim):
        length = x.shape[axis] - kernel_size + 1
        out = x.narrow(axis, 0, length)
        for shift in range(1, kernel_size):
            out = combine(out, x.narrow(axis, shift, length))
        x = out
    return x


def _depthwise_conv(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Filter every channel of a padded ``(B, C, *spatial)`` tensor with the same ``kernel`` (valid conv)."""
    channels, dim = x.shape[1], x.ndim - 2
    weight = kernel.to(x).reshape(1, 1, *kernel.shape).expand(channels, *([-1] * (dim + 1))).contiguous()
    return (F.conv2d if dim == 2 else F.conv3d)(x, weight, groups=channels)


def _window_index(labels: torch.Tensor, num_classes: int, kernel_size: int, op: str, border: str) -> torch.Tensor:
    """The class index chosen by a discrete op in every window, ``(B, *spatial)`` int64."""
    dim, radius = labels.ndim - 1, kernel_size // 2
    pad = [radius] * (2 * dim)
    if op in ("max", "min"):
        x = labels.unsqueeze(1).float()
        if border == "replicate":
            x = F.pad(x, pad, mode="replicate")
        else:
            # "zeros" ignores outside voxels: pad with a value that can never win
            fill = 0.0 if border == "background" else (-math.inf if op == "max" else math.inf)
            x = F.pad(x, pad, value=fill)
        return _box_reduce(x, kernel_size, op)[:, 0].long()
    counts = _box_reduce(_padded_one_hot(labels, num_classes, radius, border, torch.float32), kernel_size, "sum")
    if op == "mode":
        return counts.argmax(dim=1)  # ties go to the first, the smallest class
    # lower median: the smallest class v with #(labels <= v) >= (n - 1) // 2 + 1
    n_voxels = counts.sum(dim=1, keepdim=True)
    threshold = torch.div(n_voxels - 1, 2, rounding_mode="floor") + 1
    return (counts.cumsum(dim=1) < threshold).sum(dim=1)


def class_proportion_prior(
    labels: torch.Tensor,
    num_classes: int,
    kernel_size: int = 3,
    kernel_ops: str = "mean",
    border: str = "background",
    sigma: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The NACL prior ``tau``: per-voxel class proportions in the neighbourhood of each voxel.

    For the linear ops ``tau_k(p) = sum_{i in N(p)} w_i y_i^k`` (NACL MICCAI 2023, Sec. "Implementation details":
    ``tau_k = sum_i y_i^k`` over a 3x3 patch, normalised), with weights ``w``:

    * ``"mean"``: ``1 / k^dim`` over the ``k^dim`` patch (the paper's prior; MONAI's ``MeanFilter / k^dim``);
    * ``"gaussian"``: MONAI's ``GaussianFilter`` (separable, erf-approximated, truncated at 4 sigma, so
      ``2 * int(4 sigma + 0.5) + 1`` taps per axis; ``kernel_size`` is not used), as in ``monai.losses.NACLLoss``;
    * ``"svls"``: :func:`svls_kernel` over the ``k^dim`` patch (what the authors' code calls "gaussian");
    * ``"max"``, ``"min"``, ``"median"``, ``"mode"``: the one-hot of the class chosen in each window (module docstring).

    Args:
        labels: ``(B, H, W)`` or ``(B, H, W, D)`` int64 class indices in ``[0, num_classes)`` (not re-checked).
        num_classes: number of classes ``C``.
        kernel_size: odd window size (>= 3 for ``"svls"``).
        kernel_ops: one of :data:`KERNEL_OPS`.
        border: one of :data:`BORDER_MODES` (see the module docstring).
        sigma: Gaussian standard deviation for ``"gaussian"`` and ``"svls"``.
        dtype: floating dtype of the result, ``(B, C, *spatial)`` without gradient.

    >>> import torch
    >>> labels = torch.tensor([[[0, 0, 0], [0, 1, 0], [0, 0, 0]]])  # (B, H, W): one voxel of class 1
    >>> tau = class_proportion_prior(labels, num_classes=2)  # every 3x3 window holds it: 1/9 everywhere
    >>> [round(v, 4) for v in tau[0, 1, 0].tolist()]
    [0.1111, 0.1111, 0.1111]
    >>> class_proportion_prior(labels, 2, kernel_ops="min")[0, 1].sum().item()  # erosion removes it
    0.0
    """
    dim = _check_labels(labels)
    kernel_ops = _check_option("kernel_ops", kernel_ops, KERNEL_OPS)
    border = _check_option("border", border, BORDER_MODES)
    _check_kernel_size(kernel_size, minimum=3 if kernel_ops == "svls" else 1)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes!r}.")
    with torch.no_grad():
        if kernel_ops in ("max", "min", "median", "mode"):
            return _one_hot(_window_index(labels, num_classes, kernel_size, kernel_ops, border), num_classes, dtype)
        if kernel_ops == "gaussian":
            taps = _gaussian_taps(float(sigma), labels.device, dtype)
            x = _padded_one_hot(labels, num_classes, taps.numel() // 2, border, dtype)
            for axis in range(dim):  # separable: one 1D pass per spatial axis
                shape = [1] * dim
                shape[axis] = -1
                x = _depthwise_conv(x, taps.reshape(shape))
            return x
        x = _padded_one_hot(labels, num_classes, kernel_size // 2, border, dtype)
        if kernel_ops == "mean":
            return _box_reduce(x, kernel_size, "sum") / kernel_size**dim
        return _depthwise_conv(x, _svls_kernel(kernel_size, dim, float(sigma), labels.device, dtype))


def boundary_mask(labels: torch.Tensor, kernel_size: int = 3, border: str = "background") -> torch.Tensor:
    """True where the ``k^dim`` window around a voxel holds more than one class (window max != window min).

    CRaC's region split (Murugesan et al., MICCAI 2024): "inner" where the patch holds one class, else boundary;
    decided exactly from the labels (the authors' code tests a floating point sum of deviations from the window mean).

    Args:
        labels: ``(B, H, W)`` or ``(B, H, W, D)`` int64 class indices.
        kernel_size: odd window size.
        border: one of :data:`BORDER_MODES`; with ``"background"`` a foreground voxel whose window leaves the image
            is a boundary voxel, with ``"zeros"`` or ``"replicate"`` outside voxels add no class.

    Returns ``(B, 1, *spatial)`` bool.

    >>> import torch
    >>> labels = torch.tensor([[[0, 0, 0, 0, 1, 1]]])  # (B, H, W) = (1, 1, 6)
    >>> boundary_mask(labels, 3, border="replicate")[0, 0, 0].tolist()  # windows holding both classes
    [False, False, False, True, True, False]
    """
    _check_labels(labels)
    _check_kernel_size(kernel_size)
    border = _check_option("border", border, BORDER_MODES)
    with torch.no_grad():
        highest, lowest = (_window_index(labels, 0, kernel_size, op, border) for op in ("max", "min"))  # no counts
        return (highest != lowest).unsqueeze(1)
