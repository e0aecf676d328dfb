"""``search_inference_batch`` on the CPU, in-process, with models of known cost and memory.

Per-call times are sleeps of 20 ms or more and every ratio the assertions rely on is at least
1.4x (most 2x), so a loaded 2-core machine does not change the outcome; where a 1.4x ratio
decides, the calls sleep 60 ms (at 20 ms, sleeps waking ~8 ms late under load flipped one).
"""

from __future__ import annotations

import functools
import gc
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_maxtp.inference.batch_search import (
    InferenceBatchChoice,
    default_memory_limit,
    search_inference_batch,
)
from lightning_maxtp.inference.records import WorkerSpec
from lightning_maxtp.inference.runner import BatchRunner
from tests.helpers.inference_batch_models import (
    item,
    make_broken,
    make_fixed_cost,
    make_knee,
    make_memory_hungry,
    make_oom_above,
)

VALUES = [item(i) for i in range(3)]
MIB = 2**20


@pytest.fixture
def build() -> Iterator[Callable[[Callable[[], Any]], BatchRunner]]:
    runners: list[BatchRunner] = []

    def make(factory: Callable[[], Any]) -> BatchRunner:
        config = {
            "model_factory": factory, "load": None, "preprocess": None, "collate": None,
            "precision": "32",
        }  # fmt: skip
        runner = BatchRunner(WorkerSpec("cpu", "", torch.get_num_threads(), 1), config)
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.close()


def sizes(choice: InferenceBatchChoice) -> list[int]:
    return [t.batch_size for t in choice.trials]


@pytest.mark.parametrize("plain", [False, True], ids=["OutOfMemoryError", "RuntimeError"])
def test_out_of_memory_bounds_the_search_and_the_margin_backs_off(
    build: Callable[..., BatchRunner], plain: bool
) -> None:
    # 60 ms calls: the pick rests on 90 rows beating 64 (1.4x), which a loaded 2-core machine
    # flipped once at 20 ms calls (sleeps waking late by ~8 ms in most of 90's calls).
    runner = build(functools.partial(make_oom_above, 100, 0.06, plain))
    choice = search_inference_batch(runner, VALUES, init=8, cap=1024)
    assert choice.bound == "memory"
    assert choice.ceiling == 100  # bisection between 64 and 128 ends at 100 | 101
    assert {t.batch_size for t in choice.trials if not t.fits} >= {101, 128}
    for t in choice.trials:
        assert t.fits == (t.batch_size <= 100), t
        if not t.fits:
            assert t.error is not None and "out of memory" in t.error
    # A trial right after an out-of-memory one still runs: 96 followed 128, 100 followed 104.
    order = sizes(choice)
    assert order.index(96) == order.index(128) + 1
    # The throughput still rises at the safe maximum, so that is the pick.
    assert choice.batch_size == math.floor(0.9 * 100) == 90
    assert "refine" in {t.phase for t in choice.trials}
    assert "101 ran out of memory; ceiling 100, at most 90 with the 10% margin" in choice.reason
    assert choice.reason.startswith("batch 90: ")
    # Every scratch tensor of a failed forward was freed (release_exception cleared its frames).
    gc.collect()
    model = runner.model
    assert model.scratch and all(ref() is None for ref in model.scratch)  # type: ignore[attr-defined]
    json.dumps(choice.to_dict())


def test_fixed_cost_per_call_runs_to_the_cap(build: Callable[..., BatchRunner]) -> None:
    runner = build(functools.partial(make_fixed_cost, 0.02))
    choice = search_inference_batch(runner, VALUES, init=8, cap=100)
    assert sizes(choice) == [8, 16, 32, 64, 100]
    assert [t.phase for t in choice.trials][-1] == "cap"
    assert choice.bound == "cap" and choice.ceiling is None
    assert choice.batch_size == 100
    assert choice.reason.startswith("batch 100: ") and "the fastest measured" in choice.reason
    assert "stopped at the cap 100, which fit" in choice.reason
    # items/s are per item: about 100 / 20 ms (a sleep only runs long, never short).
    rate = choice.trials[-1].samples_per_s
    assert rate is not None and 100 / 0.2 < rate < 100 / 0.02
    # CPU peak: the RSS growth over the start, small for this model.
    assert choice.peak_memory_bytes is not None and choice.peak_memory_bytes < 256 * MIB


def test_the_knee_is_picked_not_the_biggest(build: Callable[..., BatchRunner]) -> None:
    # Past 64 rows each row costs twice as much: throughput halves.
    runner = build(functools.partial(make_knee, 0.02, 64, 2.0))
    choice = search_inference_batch(runner, VALUES, init=8, cap=256)
    assert sizes(choice) == [8, 16, 32, 64, 128, 256] and choice.bound == "cap"
    assert choice.batch_size == 64
    assert choice.reason.startswith("batch 64: ") and "the fastest measured" in choice.reason


def test_on_a_plateau_the_smallest_size_within_tolerance_wins(
    build: Callable[..., BatchRunner],
) -> None:
    # Past 64 rows the cost per row is constant: 64, 128 and 256 run at the same rate.
    runner = build(functools.partial(make_knee, 0.02, 64, 1.0))
    choice = search_inference_batch(runner, VALUES, init=8, cap=256, tolerance=0.25)
    assert choice.batch_size == 64
    timed = {t.batch_size: t.samples_per_s or 0.0 for t in choice.trials}
    assert timed[32] < 0.75 * max(timed.values())  # so 32 is outside the tolerance
    if "within 25% of the best" in choice.reason:  # unless 64 itself measured fastest
        assert "(batch 128)" in choice.reason or "(batch 256)" in choice.reason


def test_the_time_budget_ends_the_doubling(build: Callable[..., BatchRunner]) -> None:
    runner = build(functools.partial(make_fixed_cost, 0.02))
    choice = search_inference_batch(runner, VALUES, init=8, cap=1024, time_budget_s=0.3)
    assert choice.bound == "time_budget" and choice.ceiling is None
    timed = [t.batch_size for t in choice.trials if t.samples_per_s is not None]
    assert len(timed) >= 2 and max(sizes(choice)) < 1024
    assert choice.batch_size == max(timed)  # throughput doubles with each size
    assert "the time budget ended the doubling at" in choice.reason


def test_the_default_cpu_limit_stops_a_batch_from_eating_the_ram(
    build: Callable[..., BatchRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    # Pretend 128 MiB are available: the default limit is half, 64 MiB of RSS growth.
    fake = SimpleNamespace(available=128 * MIB)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: fake)
    assert default_memory_limit(torch.device("cpu")) == 64 * MIB
    runner = build(functools.partial(make_memory_hungry, 1.0))  # 1 MiB per row
    choice = search_inference_batch(runner, VALUES, init=8, cap=1024)
    if choice.trials[0].peak_memory_bytes is None:
        pytest.skip("this kernel does not let the process reset its peak RSS")
    # malloc keeps some freed memory and reuses memory held before the search, so the growth
    # is not exactly 1 MiB per row: only the limit's invariants are asserted, not the sizes.
    assert choice.bound == "memory"
    assert choice.ceiling is not None and choice.ceiling < 1024
    assert choice.batch_size <= math.floor(0.9 * choice.ceiling)
    for t in choice.trials:
        if t.fits:
            assert t.peak_memory_bytes is not None and t.peak_memory_bytes <= 64 * MIB
        else:
            assert t.error is not None and "limit" in t.error
    assert "went over the 64.0 MiB memory limit" in choice.reason
    # An explicit limit replaces the default: 1 GiB lets the doubling reach the cap.
    choice = search_inference_batch(runner, VALUES, init=8, cap=64, memory_limit_bytes=2**30)
    assert choice.bound == "cap" and all(t.fits for t in choice.trials)


def test_init_above_the_cap_is_lowered_to_it(build: Callable[..., BatchRunner]) -> None:
    runner = build(functools.partial(make_fixed_cost, 0.02))
    choice = search_inference_batch(runner, VALUES, init=64, cap=16)
    assert sizes(choice) == [16] and choice.batch_size == 16 and choice.bound == "cap"


def test_nothing_fits_raises(build: Callable[..., BatchRunner]) -> None:
    runner = build(functools.partial(make_oom_above, 0, 0.02))
    with pytest.raises(RuntimeError, match=r"no batch size fit, not even 1 \(OutOfMemoryError"):
        search_inference_batch(runner, VALUES, init=8, cap=64)
    # The warm-up on one item, then 8 and the bisection down to 1.
    assert runner.model.calls == [1, 8, 4, 2, 1]  # type: ignore[attr-defined]


def test_an_error_that_is_not_out_of_memory_propagates(
    build: Callable[..., BatchRunner],
) -> None:
    runner = build(make_broken)
    with pytest.raises(ValueError, match="bad input of shape"):
        search_inference_batch(runner, VALUES)


BAD_ARGUMENTS: list[tuple[dict[str, Any], str]] = [
    ({"values": []}, "values"),
    ({"values": tuple(VALUES)}, "values"),
    ({"init": 0}, "init"),
    ({"init": True}, "init"),
    ({"cap": 0}, "cap"),
    ({"cap": 8.0}, "cap"),
    ({"margin": 1.0}, "margin"),
    ({"margin": -0.1}, "margin"),
    ({"tolerance": 1.0}, "tolerance"),
    ({"time_budget_s": 0}, "time_budget_s"),
    ({"time_budget_s": math.inf}, "time_budget_s"),
    ({"memory_limit_bytes": 0}, "memory_limit_bytes"),
]


def test_bad_arguments_are_named(build: Callable[..., BatchRunner]) -> None:
    # One test, not one per case: each test pays ~0.2 s of the conftest's leak check.
    runner = build(make_broken)  # never called: the arguments are checked first
    for kwargs, name in BAD_ARGUMENTS:
        options = dict(kwargs)
        values = options.pop("values", VALUES)
        with pytest.raises(ValueError, match=f"`{name}`"):
            search_inference_batch(runner, values, **options)


def test_importing_the_module_imports_neither_torch_nor_lightning() -> None:
    # Spawned workers import it before they set CUDA_VISIBLE_DEVICES.
    code = (
        "import sys, lightning_maxtp.inference.batch_search\n"
        "print([m for m in ('torch', 'lightning', 'lightning_utilities') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
