"""``True``/``False`` where a count, a share or seconds are expected is refused, naming the fix.

``bool`` is an ``int``: without the check ``MaxThroughputCallback(time_budget_s=True)`` ran with
a 1 s budget. Every public entry point's numeric arguments go through ``_checks.refuse_bool``
first; each case here passes one bool and expects ``"name=True: expected ..., e.g. name=..."``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_maxtp._checks import refuse_bool
from lightning_maxtp.tuning.config import DEFAULTS, TuningConfig


def _message(name: str, value: bool) -> str:
    return rf"^{name}={value}: expected .+, e\.g\. {name}=\S+$"


def test_refuse_bool_names_the_argument_the_value_and_a_valid_one() -> None:
    with pytest.raises(ValueError) as err:
        refuse_bool("time_budget_s", True, "seconds (a number > 0)", 30)
    assert str(err.value) == (
        "time_budget_s=True: expected seconds (a number > 0), e.g. time_budget_s=30"
    )
    for fine in (0, 1, 2.5, None, "auto"):
        refuse_bool("x", fine, "anything", 1)


NUMERIC_FIELDS = [
    f.name
    for f in dataclasses.fields(TuningConfig)
    if not isinstance(getattr(DEFAULTS, f.name), bool) and f.name != "allow"
]


def test_every_numeric_field_of_the_config_is_checked() -> None:
    assert set(NUMERIC_FIELDS) == {
        "warmup_steps", "window_steps", "settle_steps", "min_gain", "max_trials",
        "time_budget_s", "loader_time_budget_s", "max_workers", "monitor_window_steps",
        "drift_share", "cost_share",
    }  # fmt: skip


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("name", NUMERIC_FIELDS)
def test_the_callback_refuses_a_bool_for_each_numeric_setting(name: str, value: bool) -> None:
    from lightning_maxtp.callbacks import MaxThroughputCallback

    with pytest.raises(ValueError, match=_message(name, value)):
        MaxThroughputCallback(**{name: value})
    with pytest.raises(ValueError, match=_message(name, value)):
        TuningConfig(**{name: value})


def test_the_issue_case_reads_as_the_fix() -> None:
    from lightning_maxtp.callbacks import MaxThroughputCallback

    with pytest.raises(ValueError) as err:
        MaxThroughputCallback(time_budget_s=True)
    assert str(err.value) == (
        "time_budget_s=True: expected seconds (a number > 0), e.g. time_budget_s=30"
    )


@pytest.mark.parametrize("name", ["sampler_interval_s", "flops_per_batch"])
def test_the_callback_refuses_a_bool_for_its_own_numbers(name: str) -> None:
    from lightning_maxtp.callbacks import MaxThroughputCallback

    with pytest.raises(ValueError, match=_message(name, True)):
        MaxThroughputCallback(**{name: True})


def _find_batch_size(**kw: Any) -> None:
    import torch

    from lightning_maxtp import find_batch_size

    model = torch.nn.Linear(2, 1)
    find_batch_size(
        model,
        torch.zeros(2, 2),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss_fn=lambda m, b: m(b).sum(),
        **kw,
    )


def _tune_dataloader(**kw: Any) -> None:
    from torch.utils.data import DataLoader

    from lightning_maxtp import tune_dataloader

    tune_dataloader(DataLoader(list(range(8))), **kw)


def _pool(**kw: Any) -> None:
    from lightning_maxtp import BatchInferencePool

    BatchInferencePool(dict, **kw)


def _plan_pack(**kw: Any) -> None:
    from lightning_maxtp import JobSpec, inspect_resources, plan_pack

    plan_pack([JobSpec("true")], resources=inspect_resources(), **kw)


def _plan_strategy(**kw: Any) -> None:
    from lightning_maxtp import inspect_resources, plan_strategy

    plan_strategy(inspect_resources(), 1000, **kw)


def _measure_peak(**kw: Any) -> None:
    from lightning_maxtp.resources.peak import measure_peak

    measure_peak("cpu", cache=False, **kw)


def _triage(**kw: Any) -> None:
    from lightning_maxtp.triage import triage

    triage(**kw)


def _run_bench(**kw: Any) -> None:
    from lightning_maxtp.bench.run import run_bench

    job = Path(__file__).resolve().parents[1] / "examples" / "ci" / "bench_job.py"
    run_bench(f"{job}:job", **kw)


def _run_jobs(**kw: Any) -> None:
    from lightning_maxtp import JobSpec, run_jobs

    run_jobs([JobSpec("true")], **kw)


ENTRY_POINTS: list[tuple[Callable[..., None], str]] = [
    *[(_find_batch_size, n) for n in ("init_batch_size", "max_batch_size", "margin",
                                      "tolerance", "steps_per_trial", "time_budget_s",
                                      "target_global_batch_size")],
    *[(_tune_dataloader, n) for n in ("consumption_rate", "time_budget_s", "max_workers",
                                      "local_world_size", "memory_budget_bytes")],
    *[(_pool, n) for n in ("workers_per_device", "batch_size", "io_threads", "max_in_flight",
                           "max_retries", "model_bytes", "start_timeout_s")],
    *[(_plan_pack, n) for n in ("max_parallel", "default_gpu_memory_gib", "default_cpu_threads",
                                "headroom_bytes")],
    *[(_plan_strategy, n) for n in ("headroom_bytes", "memory_budget_bytes")],
    (_measure_peak, "seconds_per_size"),
    (_triage, "duration_s"),
    (_triage, "interval_s"),
    *[(_run_bench, n) for n in ("steps", "warmup", "rounds", "timeout_s")],
    (_run_jobs, "poll_interval_s"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "name"), ENTRY_POINTS, ids=[f"{c.__name__[1:]}-{n}" for c, n in ENTRY_POINTS]
)
def test_each_entry_point_refuses_a_bool_before_it_starts(
    call: Callable[..., None], name: str
) -> None:
    with pytest.raises(ValueError, match=_message(name, True)) as err:
        call(**{name: True})
    assert re.search(r"expected (seconds|a whole number|a share|GiB|samples/s)", str(err.value))
