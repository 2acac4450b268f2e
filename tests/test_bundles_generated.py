"""Every committed bundle equals what the generator renders and has MONAI's properties (the model zoo's checks,
metadata against the schema included, are in test_model_zoo.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from monai.bundle import ConfigWorkflow

from bundle_factory import bundle_names, render_bundle
from conftest import REPO_ROOT

BUNDLES = REPO_ROOT / "bundles"


def _make_bundles_script():
    spec = importlib.util.spec_from_file_location("make_bundles", REPO_ROOT / "scripts" / "make_bundles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_bundles_equal_the_generated_ones():
    problems = _make_bundles_script().out_of_sync(BUNDLES)
    assert problems == [], "run `python scripts/make_bundles.py` and commit:\n" + "\n".join(problems)


def test_out_of_sync_notices_an_edit(tmp_path):
    script = _make_bundles_script()
    name = bundle_names()[0]
    for rel, text in render_bundle(name).items():
        (tmp_path / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name / rel).write_text(text)
    (tmp_path / name / "configs" / "train.json").write_text("{}\n")
    (tmp_path / "hand_made").mkdir()
    problems = script.out_of_sync(tmp_path)
    assert any(p.startswith("differs:") and p.endswith("train.json") for p in problems)
    assert any("hand_made" in p for p in problems)
    assert sum(p.startswith("missing:") for p in problems) == sum(len(render_bundle(n)) for n in bundle_names()[1:])


# structure only: no data read, nothing trained (the end-to-end runs are in test_bundle_nacl_flare / test_crac_bundle)
# no data set: the component is built for its preprocessing only (evaluate.json's Invertd refers to the chain)
NO_DATA = {"initialize": [], "train#dataset": "$[{}]", "validate#dataset": "$[{}]", "data#dataset_dir": None}


def _workflow(files, meta, workflow_type, **override) -> ConfigWorkflow:
    workflow = ConfigWorkflow(
        config_file=files, meta_file=meta, workflow_type=workflow_type, logging_file=False, **override
    )
    workflow.initialize()
    return workflow


@pytest.mark.parametrize("name", bundle_names())
def test_bundle_properties(name):
    configs = BUNDLES / name / "configs"
    meta = str(configs / "metadata.json")
    train = str(configs / "train.json")
    for files in ([train], [train, str(configs / "evaluate.json")]):
        assert _workflow(files, meta, "train", **NO_DATA).check_properties() == [], files
    infer = _workflow(str(configs / "inference.json"), meta, "infer", **{"dataset#data": "$[]"})
    assert infer.check_properties() == []
    # the run ids the bundle README documents exist
    assert {"training", "run"} <= set(json.loads((configs / "train.json").read_text()))
    assert "evaluating" in json.loads((configs / "evaluate.json").read_text())
    assert "inferring" in json.loads((configs / "inference.json").read_text())
    assert "training" in json.loads((configs / "multi_gpu_train.json").read_text())
