"""Experiment harness: training runs of the bundles, their evaluation on 3D test volumes, and the papers' studies
(``scripts/experiments.py``)."""

from studies.evaluation import EvaluatedVolume, TrainedRun, add_gaussian_noise, evaluate_run
from studies.posthoc import VolumeLocalTemperature, VolumeTemperature
from studies.runs import RunSpec, read_record, train
from studies.study import StudySetup

__all__ = [
    "EvaluatedVolume",
    "VolumeLocalTemperature",
    "RunSpec",
    "StudySetup",
    "VolumeTemperature",
    "TrainedRun",
    "add_gaussian_noise",
    "evaluate_run",
    "read_record",
    "train",
]
