"""One source for each data set's classes, channels and ROI: the component class's ``facts``, which the bundles and
the components themselves use, so that they cannot disagree."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from bundle_factory import DATASETS, render_bundle
from bundle_factory.specs import Dataset
from calib_monai import data
from calib_monai.data import DatasetFacts, MSDDataset, VolumeSegmentationData

NAMES = sorted(DATASETS)


def _configs(name: str) -> dict[str, dict]:
    files = render_bundle(f"nacl_{name}")
    return {
        rel.split("/")[-1].removesuffix(".json"): json.loads(text)
        for rel, text in files.items()
        if rel.endswith(".json")
    }


@pytest.mark.parametrize("name", NAMES)
def test_generated_configs_state_the_component_facts(name):
    dataset = DATASETS[name]
    facts = dataset.component_class.facts
    assert isinstance(facts, DatasetFacts)
    configs = _configs(name)
    for config in (configs["train"], configs["inference"]):
        assert config["label_names"] == dict(facts.label_names)
        assert config["num_classes"] == facts.num_classes == len(facts.label_names)
        assert config["in_channels"] == facts.in_channels == len(facts.channel_names)
        assert config["roi_size"] == list(facts.roi_size)
        assert config["data"]["_target_"] == dataset.component
    meta = configs["metadata"]["network_data_format"]
    assert meta["inputs"]["image"]["num_channels"] == facts.in_channels
    assert list(meta["inputs"]["image"]["channel_def"].values()) == list(facts.channel_names)
    assert meta["outputs"]["pred"]["num_channels"] == facts.num_classes
    assert meta["outputs"]["pred"]["channel_def"] == dict(facts.label_names)
    report = configs["evaluate"]["validate#handlers"][-1]
    expected_regions = None if facts.regions is None else {k: list(v) for k, v in facts.regions.items()}
    assert report.get("regions") == expected_regions


@pytest.mark.parametrize("name", NAMES)
def test_the_component_uses_its_facts(name, tmp_path):
    cls = DATASETS[name].component_class
    facts = cls.facts
    assert inspect.signature(cls.__init__).parameters["roi_size"].default == facts.roi_size
    data = cls(None, tmp_path / "run")  # no data set: nothing is read
    assert data.label_names == dict(facts.label_names) and data.num_classes == facts.num_classes
    assert data.channel_names == tuple(facts.channel_names)
    assert data.roi_size == tuple(facts.roi_size)
    if issubclass(cls, MSDDataset):  # a known MSD task checks dataset.json against the same classes
        assert data.expected_labels == dict(facts.label_names)


# each component's own constructor arguments, after the six every one takes (the bundles pass them by name)
OWN_ARGUMENTS = {
    "ACDC": ["resize", "split", "use_split_lists"],
    "BraTS": ["resize", "split", "intensity"],
    "BUSI": ["split", "classes"],
    "FLARE": ["cache_dir", "spacing", "split", "num_phantoms", "phantom_shape", "phantom_seed", "window"],
    "KiTS": ["spacing", "split", "window"],
    "MRBrainS": ["fold", "intensity"],
    "PROMISE12": ["split", "in_plane_spacing", "intensity"],
    "Hippocampus": ["split"],
    "Prostate": ["spacing", "split", "intensity"],
    "MSDDataset": ["spacing", "split", "intensity", "crop_foreground"],
}


@pytest.mark.parametrize("name", sorted(OWN_ARGUMENTS))
def test_every_component_has_the_one_constructor_of_the_base(name):
    cls = getattr(data, name)
    parameters = list(inspect.signature(cls).parameters.values())
    shared = ["dataset_dir", "output_dir", "roi_size", "seed", "cache_rate", "num_workers"]
    assert [p.name for p in parameters] == shared + OWN_ARGUMENTS[name]
    assert [p.default for p in parameters[3:6]] == [0, 1.0, 0]
    # the dataclass's generated __init__ (its arguments are the init fields), none written by hand on the way down
    assert [f.name for f in dataclasses.fields(cls) if f.init] == [p.name for p in parameters]
    chain = cls.__mro__[: cls.__mro__.index(VolumeSegmentationData) + 1]
    assert not [c.__name__ for c in chain if "def __init__(" in inspect.getsource(c)]


def test_the_bundle_spec_does_not_repeat_the_facts():
    fields = {f.name for f in dataclasses.fields(Dataset)}
    assert not fields & {"label_names", "num_classes", "in_channels", "channel_names", "roi_size", "regions"}


def test_facts_reject_inconsistent_values():
    with pytest.raises(ValueError, match="label_names must name the classes"):
        DatasetFacts({"0": "background", "2": "organ"}, ("image",), (8, 8, 8))
    with pytest.raises(ValueError, match="roi_size must be three"):
        DatasetFacts({"0": "background", "1": "organ"}, ("image",), (8, 8))
    with pytest.raises(ValueError, match="channel_names"):
        DatasetFacts({"0": "background", "1": "organ"}, (), (8, 8, 8))
