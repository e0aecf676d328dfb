"""What is carried between fits: only converged settings, only on the same machine and loader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lightning_maxtp.observe.status import read_status, status_path, write_status
from lightning_maxtp.tuning.carry import carried_settings, state
from lightning_maxtp.tuning.config import TuningConfig
from lightning_maxtp.tuning.tuning_loop import TuningLoop

MACHINE = {"cpus": 2, "gpus": [], "world_size": 1}
LOADER = {"dataset": "SleepDataset", "length": 480, "batch_size": 8}
SETTINGS = {"num_workers": 3, "prefetch_factor": 2, "pin_memory": False,
            "persistent_workers": False}  # fmt: skip


@pytest.mark.parametrize(
    ("reason", "converged"),
    [
        ("no auto-applicable knob left for the storage bottleneck", True),
        ("no bottleneck above threshold: nothing to tune", True),
        ("max_trials=3 reached", True),
        ("tuning cost budget spent: 0.3 s of 0.2 s", False),  # a short fit cut it short
        ("time_budget_s=300 spent", False),
    ],
)
def test_only_converged_tuning_is_carried(reason: str, converged: bool) -> None:
    config = TuningConfig(warmup_steps=1, settle_steps=1, max_trials=3, time_budget_s=300.0)
    loop = TuningLoop(config)
    loop.stop(reason, now=0.0)
    assert loop.converged is converged


def test_carried_settings_need_the_same_machine_loader_and_cap() -> None:
    carried = state(SETTINGS, MACHINE, LOADER)
    settings, why = carried_settings(carried, MACHINE, LOADER)
    assert settings == SETTINGS and why.startswith("settings tuned earlier")
    more = {**MACHINE, "cpus": 16}
    assert carried_settings(carried, more, LOADER) == (
        None, "tuned settings not reused: the machine differs (cpus 2 -> 16)",
    )  # fmt: skip
    assert carried_settings(carried, MACHINE, LOADER, max_workers=2)[1] == (
        "tuned settings not reused: num_workers=3 > max_workers=2"
    )
    assert carried_settings({}, MACHINE, LOADER) == (None, "")
    assert carried_settings({**carried, "version": 0}, MACHINE, LOADER)[0] is None


def test_a_status_left_by_an_earlier_process_with_the_pid_is_not_trusted() -> None:
    path = write_status({"bottleneck": "compute"})
    assert path == status_path(os.getpid())
    try:
        assert read_status(os.getpid(), os.getuid())[0] is not None
        body = json.loads(Path(path).read_text())
        Path(path).write_text(json.dumps({**body, "started": body["started"] - 3600}))
        status, why = read_status(os.getpid(), os.getuid())
        assert status is None and "left by an earlier process" in why
        assert not list(Path(path).parent.glob(f".{os.getpid()}.*.tmp"))  # no temp file left
    finally:
        Path(path).unlink()
