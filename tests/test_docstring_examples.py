"""The ``>>>`` examples of the public losses and metrics run, and print what their docstrings say (``doctest``).

Each example uses a tiny deterministic input whose value is worked out by hand beside it; a docstring that no longer
tells what the code does fails here. Every public loss and metric of these modules has at least one example.
"""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

MODULES = [
    "calib_monai.checks",
    "calib_monai.losses.ce_dice",
    "calib_monai.losses.crac",
    "calib_monai.losses.ecp",
    "calib_monai.losses.focal",
    "calib_monai.losses.hard_l1_ace",
    "calib_monai.losses.label_smoothing",
    "calib_monai.losses.mbls",
    "calib_monai.losses.nacl",
    "calib_monai.losses.priors",
    "calib_monai.losses.soft_l1_ace",
    "calib_monai.losses.svls",
    "calib_monai.metrics.calibration.functions",
    "calib_monai.metrics.calibration.metric",
    "calib_monai.metrics.calibration.reliability",
    "calib_monai.metrics.calibration.statistics",
    "calib_monai.metrics.case_quality",
    "calib_monai.metrics.failure_detection",
    "calib_monai.metrics.image_statistics",
    "calib_monai.metrics.ranking",
    "calib_monai.metrics.segmentation",
]
#: Public names shown with an example (plots and Ignite/report wrappers are exercised by their own tests).
WITHOUT_EXAMPLE = {
    "phr",
    "phr_derivative",
    "selected_statistics",
    "statistics_values",
    "image_statistic_names",
    "image_geometry_names",
    "input_statistic_names",
    "structure_band",
    "save_risk_coverage_plot",
    "save_reliability_diagram",
    "plot_reliability",
}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)  # the module, not a function of the same name re-exported by the package
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (run doctest -v)"


@pytest.mark.parametrize("name", MODULES)
def test_every_public_loss_and_metric_has_an_example(name):
    module = importlib.import_module(name)
    missing = [
        public
        for public in getattr(module, "__all__", [])
        if public not in WITHOUT_EXAMPLE
        and callable(obj := getattr(module, public))
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and obj.__module__ == name  # defined here, not re-exported
        and ">>>" not in (obj.__doc__ or "")
    ]
    assert not missing, f"{name}: no >>> example in the docstring of {missing}"
