"""CaseQualityd takes each case's network features from a hook on the network the inferer ran: judged when the
network ran for the case, left out (with why) when it did not or cannot be hooked."""

from __future__ import annotations

import numpy as np
import torch
from monai.inferers import SliceInferer
from monai.networks.nets import UNet

from calib_monai.metrics.feature_distance import MahalanobisDistance
from calib_monai.metrics.network_features import BottleneckFeatures
from calib_monai.review import CaseQualityd, ValidatedRange


def _network() -> UNet:
    torch.manual_seed(0)
    return UNet(2, 1, 2, channels=(4, 8), strides=(2,), num_res_units=0, norm=None).eval()


def _pooled(network: UNet, image: torch.Tensor) -> np.ndarray:
    inferer = SliceInferer(roi_size=(8, 8), sw_batch_size=4, spatial_dim=2)
    with torch.no_grad(), BottleneckFeatures(network) as hook:
        inferer(image[None], network)
        return hook.pop().vector


def test_case_quality_judges_the_features_of_the_network_that_ran():
    network, g = _network(), torch.Generator().manual_seed(0)
    images = [torch.rand(1, 8, 8, 4, generator=g) for _ in range(19)]
    features = np.stack([_pooled(network, x) for x in images])
    validated = ValidatedRange(
        list(np.linspace(0.6, 0.9, 19)),
        alpha=0.05,
        features=MahalanobisDistance(max_dim=features.shape[1]).fit(features).to_dict(),
        feature_check=True,
    )
    transform = CaseQualityd("prob", validated, network=network)
    prob = torch.full((2, 8, 8, 4), 0.5)
    inferer = SliceInferer(roi_size=(8, 8), sw_batch_size=4, spatial_dim=2)
    with torch.no_grad():
        inferer(100 * torch.rand(1, 1, 8, 8, 4, generator=g), network)  # an image far outside the validation ones
    review = transform({"prob": prob})["quality"]["review"]
    assert review["signals"]["features"]["rank"] == 1 and review["left_out"] == []
    # the network did not run for the next case (a TorchScript model.ts runs another module): left out, and why
    again = transform({"prob": prob})["quality"]["review"]
    assert "features" not in again["signals"] and "did not run for this case" in again["left_out"][0]
    # no network given: left out, and why
    plain = CaseQualityd("prob", validated)({"prob": prob})["quality"]["review"]
    assert plain["left_out"] == ["network features left out: no network was given to CaseQualityd (network=@network)"]
