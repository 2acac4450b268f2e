"""Experiment harness: training runs of the bundles, their evaluation on 3D test volumes, and the papers' studies
(``scripts/experiments.py``)."""

from calib_monai.experiments.evaluation import EvaluatedVolume, TrainedRun, add_gaussian_noise, evaluate_run
from calib_monai.experiments.posthoc import LocalTemperatureScaling, TemperatureScaling
from calib_monai.experiments.runs import RunSpec, read_record, train
from calib_monai.experiments.study import StudySetup

__all__ = ["EvaluatedVolume", "LocalTemperatureScaling", "RunSpec", "StudySetup", "TemperatureScaling", "TrainedRun",
           "add_gaussian_noise", "evaluate_run", "read_record", "train"]
