"""crac_flare end to end on tiny phantoms: the ALM multipliers move, are checkpointed and come back on resume."""

from __future__ import annotations

import torch
from ignite.engine import Events
from monai.bundle import ConfigWorkflow
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import REPO_ROOT

BUNDLE = REPO_ROOT / "bundles" / "crac_flare"


def _workflow(tmp_path, epochs: int) -> ConfigWorkflow:
    workflow = ConfigWorkflow(
        config_file=str(BUNDLE / "configs" / "train.json"),
        workflow_type="train",
        logging_file=False,
        output_dir=str(tmp_path / "out"),
        epochs=epochs,
        roi_size=[32, 32, 8],
        batch_size=8,
        **{"data#num_phantoms": 6, "data#cache_dir": str(tmp_path / "phantoms"), "data#spacing": [12.0, 12.0, 30.0]},
    )
    workflow.initialize()
    return workflow


def test_two_epochs_change_lambda_and_resume_restores_the_multipliers(tmp_path):
    workflow = _workflow(tmp_path, epochs=2)
    loss = workflow.parser.get_parsed_content("loss")
    initial = loss.lambdas.clone()
    workflow.run()
    assert int(loss.outer_steps) == 2  # one outer step per epoch
    assert not torch.equal(loss.lambdas, initial)
    assert (loss.lambdas >= 1e-6).all() and (loss.lambdas <= 1e6).all()
    saved = torch.load(tmp_path / "out" / "checkpoint_latest.pt", weights_only=False)["loss"]
    for name in ("lambdas", "rhos", "previous_constraint", "outer_steps"):
        torch.testing.assert_close(saved[name], getattr(loss, name), rtol=0, atol=0, equal_nan=True)
    trainer_metrics = workflow.trainer.state.metrics
    assert trainer_metrics["alm_lambda_1_inner"] == float(loss.lambdas[1, 0])
    # the trainer's TensorBoard handler wrote lambda, rho and the constraint per class and region each epoch
    events = EventAccumulator(str(tmp_path / "out" / "tensorboard")).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"alm_lambda_4_boundary", "alm_rho_0_inner", "alm_constraint_2_boundary"} <= tags
    assert [e.step for e in events.Scalars("alm_lambda_1_inner")] == [1, 2]

    # a new process-like run asked for a third epoch starts from the saved multipliers
    resumed = _workflow(tmp_path, epochs=3)
    resumed_loss = resumed.parser.get_parsed_content("loss")
    restored = {}
    trainer = resumed.trainer
    trainer.add_event_handler(
        Events.EPOCH_STARTED, lambda e: restored.setdefault("lambdas", resumed_loss.lambdas.clone())
    )
    resumed.run()
    torch.testing.assert_close(restored["lambdas"], saved["lambdas"], rtol=0, atol=0)
    assert int(resumed_loss.outer_steps) == 3
