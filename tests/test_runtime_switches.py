"""The run-time switches the bundle configs call (``calib_monai.bundle.runtime``): data loading defaults by device
and command-line booleans."""

from __future__ import annotations

import pytest
import torch

from calib_monai.bundle import as_bool, dataloader_workers, pin_memory, validation_sampler


def test_data_loading_defaults_follow_the_device(monkeypatch):
    assert dataloader_workers("cpu") == 0 and pin_memory("cpu") is False
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert dataloader_workers("cuda") == 8 and dataloader_workers(torch.device("cuda:1")) == 8  # capped
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # 4 ranks on this node share the 16 CPUs
    assert dataloader_workers("cuda") == 3 and pin_memory("cuda:0") is True
    assert validation_sampler([1, 2, 3]) is None  # not distributed: all volumes, loader order


def test_as_bool_reads_command_line_switches():
    values = (True, False, "true", "false", "True", 1, 0)
    assert [as_bool(v) for v in values] == [True, False, True, False, True, True, False]
    with pytest.raises(ValueError, match="boolean"):
        as_bool("maybe")
    with pytest.raises(ValueError, match="^--amp: expected a boolean switch"):  # the setting named
        as_bool("tru", "amp")
