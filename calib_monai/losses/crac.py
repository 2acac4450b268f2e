"""CRaC: class- and region-adaptive constraints, learned with an Augmented Lagrangian (PHR penalty)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.loss import _Loss

from calib_monai.checks import check_number, check_option
from calib_monai.losses._inputs import prepare_inputs
from calib_monai.losses.priors import boundary_mask, class_proportion_prior

__all__ = ["CRaCLoss", "phr", "phr_derivative", "REGIONS", "PRESETS", "STATISTICS_ROWS"]

REGIONS = ("inner", "boundary")  # column order of the (K, 2) multiplier tables
STATISTICS_ROWS = 4  # rows of CRaCLoss.validation_statistics: sum P'(g), sum h, pixels, satisfied pixels

# Named settings (CRaCLoss.preset); each lists every option in which the three differ.
PRESETS: dict[str, dict[str, object]] = {
    # the paper as written (Eq. 3/7/8/10): equality-like target |tau - l|, P' averaged over the region's pixels
    "paper": {
        "inner_margin": 1.0,
        "multiplier_average": "region",
        "tolerance": 0.0,
        "rho_init": 0.1,
        "clamp_per_pixel": False,
    },
    # the authors' released code as far as our options express it (docs/notes/losses.md)
    "authors": {
        "inner_margin": 5.0,
        "multiplier_average": "all_padded",
        "tolerance": 0.0,
        "rho_init": 1.0,
        "clamp_per_pixel": True,
    },
    # inequality |tau - l| <= eps, the bundles' default: eps and rho0 chosen by the crac_ablation study
    "tolerance": {
        "inner_margin": 1.0,
        "multiplier_average": "region",
        "tolerance": 2.0,
        "rho_init": 1.0,
        "clamp_per_pixel": False,
    },
}


def phr(z: torch.Tensor, rho: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """PHR penalty-Lagrangian (CRaC Eq. 10): ``lam z + rho z^2 / 2`` if ``lam + rho z >= 0``, else
    ``-lam^2 / (2 rho)``."""
    active = lam + rho * z >= 0
    return torch.where(active, lam * z + 0.5 * rho * z * z, -lam * lam / (2 * rho))


def phr_derivative(z: torch.Tensor, rho: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``dPHR/dz = max(lam + rho z, 0)``: the new multiplier of the outer update (CRaC Eq. 6/8)."""
    return torch.clamp(lam + rho * z, min=0)


class CRaCLoss(_Loss):
    """Cross-entropy plus class- and region-wise PHR penalties on NACL's logit constraint.

    Murugesan, Silva-Rodriguez, Ben Ayed, Dolz, "Class and Region-Adaptive Constraints for Network Calibration",
    MICCAI 2024 (CRaC). For pixel ``i``, class ``k`` and the region ``r(i)`` of ``i``:

    * ``tau_ik``: the NACL mean prior over the ``k^dim`` patch around ``i`` (outside pixels count as background);
    * region: "inner" if the patch holds one class, else "boundary" (:func:`~calib_monai.losses.priors.boundary_mask`);
    * ``h_ik = |m tau_ik - l_ik|`` for inner pixels and ``|tau_ik - l_ik|`` for boundary pixels, where
      ``m = inner_margin`` (1, the paper's Eq. 3/7);
    * constraint ``g_ik = h_ik - eps <= 0`` with ``eps = tolerance >= 0``.

    The loss is Eq. 7 averaged rather than summed (it does not scale with image size; ``reduction`` is not used),
    ``L = CE + mean_{i,k} PHR(g_ik; rho_{k,r(i)}, lambda_{k,r(i)})``, with the PHR penalty of Eq. 10 (:func:`phr`).

    Why a tolerance: with Eq. 7's ``h >= 0``, ``P' >= lambda`` at every pixel and a multiplier can only rise; with
    ``g = h - eps`` satisfied pixels (``P' = 0``) pull it down. ``eps = 0`` is exactly the paper's Eq. 7.

    ``lambdas`` and ``rhos`` are ``(K, 2)`` buffers (columns :data:`REGIONS`, checkpointed, following the logits'
    device) held fixed during an epoch; :class:`calib_monai.handlers.ALMUpdateHandler` updates them after each epoch
    on the validation set (:meth:`validation_statistics`, :meth:`outer_update`). Named settings: :meth:`preset`. The
    authors' code and the differences from it: ``docs/notes/losses.md``.

    >>> import torch
    >>> logits, labels = torch.zeros(1, 2, 3, 3), torch.zeros(1, 3, 3, dtype=torch.long)
    >>> loss = CRaCLoss(classes=2, lambda_init=0.0, rho_init=0.1)
    >>> # inner pixels, tau = (1, 0): h = (1, 0); PHR(h) = 0 * h + 0.1 h^2 / 2, mean over pixels and classes 0.025
    >>> round(loss(logits, labels).item(), 4)  # log 2 + 0.025
    0.7181

    Args:
        classes: number of classes ``K``.
        dim: spatial dims of the logits (2 or 3); the patch is ``kernel_size^dim``.
        kernel_size: odd patch size (3, as in the paper).
        inner_margin: ``m`` above.
        lambda_init: initial multipliers (1e-6).
        rho_init: initial and minimum penalty parameter ``rho0`` (0.1).
        rho_max: largest ``rho`` (10).
        gamma: factor of a ``rho`` increase (1.2).
        tau_alm: a ``(k, r)`` whose mean ``h`` did not fall below ``tau_alm`` times its previous value gets a
            larger ``rho`` (0.9).
        rho_interval: epochs between two ``rho`` checks (10).
        multiplier_average: how :meth:`outer_update` averages ``P'`` over validation pixels: ``"region"`` (the mean
            over region ``r``'s pixels, Eq. 8), ``"all"`` (their sum over *all* validation pixels) or ``"all_padded"``
            (the mean over all pixels, each pixel of the other region adding ``P'(0) = lambda``).
        tolerance: ``eps >= 0`` above (0: the paper).
        lambda_min, lambda_max: the new multipliers are clamped to ``[lambda_min, lambda_max]`` (1e-6, 1e6).
        clamp_per_pixel: also clamp each pixel's ``P'`` to ``[lambda_min, lambda_max]`` before averaging (False).
    """

    def __init__(
        self,
        classes: int,
        dim: int = 2,
        kernel_size: int = 3,
        inner_margin: float = 1.0,
        lambda_init: float = 1e-6,
        rho_init: float = 0.1,
        rho_max: float = 10.0,
        gamma: float = 1.2,
        tau_alm: float = 0.9,
        rho_interval: int = 10,
        multiplier_average: str = "region",
        tolerance: float = 0.0,
        lambda_min: float = 1e-6,
        lambda_max: float = 1e6,
        clamp_per_pixel: bool = False,
    ) -> None:
        super().__init__()
        if classes < 2:
            raise ValueError(f"classes must be >= 2, got {classes!r}.")
        if dim not in (2, 3):
            raise ValueError(f"dim must be 2 or 3, got {dim!r}.")
        grows = "a multiplier's rho grows when its constraint did not fall below tau_alm times its previous value"
        self.tau_alm = check_number("tau_alm", tau_alm, 0, 1, low_open=True, hint=f"{grows}; 0.9 in the paper")
        margin = "m, the factor on tau at inner pixels; 1 in the paper"
        self.inner_margin = check_number("inner_margin", inner_margin, 0, hint=margin)
        alm = (rho_init, rho_max, gamma, lambda_init, lambda_min, lambda_max)
        for name, value in zip(("rho_init", "rho_max", "gamma", "lambda_init", "lambda_min", "lambda_max"), alm):
            check_number(name, value, hint="an Augmented Lagrangian setting")
        if not 0 < rho_init <= rho_max:
            raise ValueError(f"need 0 < rho_init <= rho_max, got rho_init={rho_init!r}, rho_max={rho_max!r}.")
        if lambda_init < 0 or gamma < 1 or rho_interval < 1:
            raise ValueError(
                "need lambda_init >= 0, gamma >= 1, rho_interval >= 1; "
                f"got {lambda_init!r}, {gamma!r}, {rho_interval!r}."
            )
        self.tolerance = check_number("tolerance", tolerance, 0)
        if not 0 <= lambda_min <= lambda_max:
            raise ValueError(f"need 0 <= lambda_min <= lambda_max, got {lambda_min!r}, {lambda_max!r}.")
        self.classes, self.dim, self.kernel_size = classes, dim, kernel_size
        self.rho_init, self.rho_max, self.gamma = float(rho_init), float(rho_max), float(gamma)
        self.rho_interval = rho_interval
        self.multiplier_average = check_option(
            "multiplier_average", multiplier_average, ("region", "all", "all_padded")
        )
        self.lambda_min, self.lambda_max, self.clamp_per_pixel = float(lambda_min), float(lambda_max), clamp_per_pixel
        self.register_buffer("lambdas", torch.full((classes, 2), float(lambda_init), dtype=torch.float64))
        self.register_buffer("rhos", torch.full((classes, 2), float(rho_init), dtype=torch.float64))
        # mean constraint per (k, r) at the previous outer step (nan: none yet), and the number of outer steps done
        self.register_buffer("previous_constraint", torch.full((classes, 2), float("nan"), dtype=torch.float64))
        self.register_buffer("outer_steps", torch.zeros((), dtype=torch.int64))

    @classmethod
    def preset(cls, name: str, classes: int, dim: int = 2, **overrides) -> CRaCLoss:
        """A loss with the named settings of :data:`PRESETS`, any of them replaced by ``overrides``.

        >>> CRaCLoss.preset("tolerance", classes=3).tolerance
        2.0
        """
        settings = dict(PRESETS[check_option("preset", name, tuple(PRESETS))])
        settings.update(overrides)
        return cls(classes=classes, dim=dim, **settings)

    def constraints(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``h`` ``(B, K, *spatial)`` and the boundary mask ``(B, 1, *spatial)`` for checked ``int64`` labels
        ``(B, *spatial)``."""
        tau = class_proportion_prior(labels, self.classes, self.kernel_size, "mean", "background", dtype=logits.dtype)
        boundary = boundary_mask(labels, self.kernel_size, "background")
        if self.inner_margin != 1.0:
            tau = torch.where(boundary, tau, self.inner_margin * tau)
        return (tau - logits).abs(), boundary

    def _follow_device(self, device: torch.device) -> None:
        """Move the float64 multiplier buffers to the logits' device (bundles move the network, never the loss)."""
        if self.lambdas.device != device:
            self.to(device)

    def _per_pixel_tables(self, boundary: torch.Tensor, table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Broadcast a ``(K, 2)`` table to ``(B, K, *spatial)`` by each pixel's region."""
        shape = (1, self.classes) + (1,) * self.dim
        inner, outer = (table[:, r].to(dtype).reshape(shape) for r in range(2))
        return torch.where(boundary, outer, inner)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits, labels = prepare_inputs(input, target, self.classes, self.dim, owner=self)
        self._follow_device(logits.device)
        h, boundary = self.constraints(logits, labels)
        lam = self._per_pixel_tables(boundary, self.lambdas, logits.dtype)
        rho = self._per_pixel_tables(boundary, self.rhos, logits.dtype)
        return F.cross_entropy(logits, labels) + phr(h - self.tolerance, rho, lam).mean()

    def validation_statistics(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Sums for one validation batch, ``(4, K, 2)`` float64, per (k, r): ``sum P'(g)``, ``sum h``, the pixel
        count and the count of satisfied pixels (``g <= 0``, i.e. ``h <= tolerance``).

        Sums (not means) so that batches, and DDP ranks, add up before :meth:`outer_update` divides.
        """
        with torch.no_grad():
            logits, labels = prepare_inputs(logits, target, self.classes, self.dim)
            self._follow_device(logits.device)
            h, boundary = self.constraints(logits.double(), labels)
            lam = self._per_pixel_tables(boundary, self.lambdas, torch.float64)
            rho = self._per_pixel_tables(boundary, self.rhos, torch.float64)
            g = h - self.tolerance if self.tolerance else h
            grad = phr_derivative(g, rho, lam)  # = lam + rho h when tolerance is 0
            if self.clamp_per_pixel:
                grad = grad.clamp(self.lambda_min, self.lambda_max)
            satisfied = g <= 0
            stats = torch.zeros(STATISTICS_ROWS, self.classes, 2, dtype=torch.float64, device=logits.device)
            spatial = tuple(range(2, h.ndim))
            for r, mask in enumerate((~boundary, boundary)):
                stats[0, :, r] = (grad * mask).sum(dim=(0, *spatial))
                stats[1, :, r] = (h * mask).sum(dim=(0, *spatial))
                stats[2, :, r] = mask.sum()
                stats[3, :, r] = (satisfied & mask).sum(dim=(0, *spatial))
            return stats

    def outer_update(self, stats: torch.Tensor, epoch: int) -> dict[str, torch.Tensor]:
        """One ALM outer step from summed :meth:`validation_statistics` (all batches, all ranks).

        ``lambda_kr <- clamp(mean P'(g_ikr), lambda_min, lambda_max)`` (mean as set by ``multiplier_average``);
        every ``rho_interval`` epochs, ``rho_kr <- min(gamma rho_kr, rho_max)`` where the mean ``h`` of ``(k, r)``
        is not below ``tau_alm`` times its value at the previous outer step (the previous epoch). Returns the new
        tables, the mean ``h`` ("constraint") and the fraction of satisfied pixels ("satisfied"), per (k, r).
        """
        stats = stats.to(self.lambdas.device, torch.float64)
        grad_sum, h_sum, count, satisfied = stats[0], stats[1], stats[2], stats[3]
        region_pixels = count.clamp(min=1)
        all_pixels = count[0].sum().clamp(min=1)  # every pixel is in exactly one region; same for each class
        if self.multiplier_average == "region":
            mean_grad = grad_sum / region_pixels
        elif self.multiplier_average == "all":
            mean_grad = grad_sum / all_pixels
        else:  # "all_padded": the other region's pixels each add P'(0) = lambda (clamped like any pixel's P')
            at_zero = self.lambdas.clamp(self.lambda_min, self.lambda_max) if self.clamp_per_pixel else self.lambdas
            mean_grad = (grad_sum + (count[0].sum() - count) * at_zero) / all_pixels
        mean_h = h_sum / region_pixels
        # a region absent from the validation set keeps its multiplier
        present = count > 0
        new_lambdas = torch.where(present, mean_grad.clamp(self.lambda_min, self.lambda_max), self.lambdas)
        previous = self.previous_constraint
        if epoch % self.rho_interval == 0:
            grow = present & ~torch.isnan(previous) & (mean_h >= self.tau_alm * previous)
            self.rhos.copy_(torch.where(grow, self.rhos * self.gamma, self.rhos).clamp(self.rho_init, self.rho_max))
        self.previous_constraint.copy_(torch.where(present, mean_h, previous))
        self.lambdas.copy_(new_lambdas)
        self.outer_steps += 1
        return {
            "lambda": self.lambdas.clone(),
            "rho": self.rhos.clone(),
            "constraint": mean_h,
            "satisfied": satisfied / region_pixels,
        }
