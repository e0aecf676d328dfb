"""``explain_drift``: a slower window after tuning is explained by what changed, or not at all.

The windows are plain data; the ``load`` case carries the numbers two windows of a real
``allow=("precision", "channels_last", "fused_optimizer")`` fit read on a 2-core machine, all
three trials reverted: 15.4 ms steps with the job alone on both cores, 408 ms once another
process kept one core busy.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_maxtp.callbacks.drift import (
    DriftCause,
    explain_drift,
    other_cpus,
    process_state,
    snapshot,
)
from lightning_maxtp.callbacks.math_knobs import MathKnobs
from lightning_maxtp.observe import JobContext, SamplerSeries, Window
from lightning_maxtp.observe.gc_pauses import GcSummary
from tests.helpers.models import ConvModel

STEPS = 20


def _window(
    step_ms: float | list[float],
    *,
    system: float = 100.0,
    main: float = 198.6,
    workers: tuple[float, ...] = (),
    gc_pauses: GcSummary | None = None,
    **context: Any,
) -> Window:
    """``STEPS`` steps of 64 samples on a 2-CPU machine, with what the sampler read."""
    steps = step_ms if isinstance(step_ms, list) else [step_ms] * STEPS
    sampler = SamplerSeries(
        system_cpu_percent=(system,) * 4, main_cpu_percent=(main,) * 4,
        worker_cpu_percent=workers, num_worker_processes=len(workers) and 1,
    )  # fmt: skip
    context = {"host_cpus": 2, "intra_op_threads": 2, "precision": "32-true"} | context
    return Window(
        step_time_s=tuple(s / 1e3 for s in steps), data_wait_s=(0.0,) * len(steps),
        samples=(64,) * len(steps), sampler=sampler, gc=gc_pauses, context=JobContext(**context),
    )  # fmt: skip


REFERENCE = _window(15.4)
STATE = {"torch_threads": 2, "knob:channels_last": False, "knob:fused_optimizer": False}


def test_a_setting_changed_since_the_reference_is_named_first() -> None:
    drifted = _window(25.0, main=103.4, precision="bf16-mixed")
    cause = explain_drift(REFERENCE, drifted, STATE, STATE)
    assert cause == DriftCause(
        "settings",
        "settings differ from the reference window's: precision '32-true' -> 'bf16-mixed'",
        (("precision", "32-true", "bf16-mixed"),),
    )


def test_a_setting_the_reference_had_not_read_is_no_change() -> None:
    # Read on a 2-CPU fit: "settings differ from the reference window's: gc_tuned None -> False,
    # tf32 None -> False", where nothing had changed and the loader was what slowed.
    drifted = _window(25.0, main=103.4, tf32=False, gc_tuned=False)
    cause = explain_drift(REFERENCE, drifted, STATE, STATE)
    assert cause is None or cause.kind != "settings", cause


def test_a_knob_left_behind_shows_in_the_state_the_context_does_not_carry() -> None:
    now = {**STATE, "knob:channels_last": True}
    cause = explain_drift(REFERENCE, _window(25.0), STATE, now)
    assert cause is not None and cause.kind == "state"
    assert cause.changed == (("knob:channels_last", False, True),)
    assert str(cause).endswith("knob:channels_last False -> True")


def test_another_process_on_a_core_is_the_machine_and_names_the_pool_that_fits() -> None:
    drifted = _window(407.9, main=103.4)  # the fit's own reading: 0.97 CPU busy elsewhere
    assert other_cpus(REFERENCE) == pytest.approx(0.014)
    assert other_cpus(drifted) == pytest.approx(0.966)
    cause = explain_drift(REFERENCE, drifted, STATE, STATE)
    assert cause is not None and cause.kind == "load" and cause.threads == 1
    assert str(cause) == (
        "other processes kept 1.0 of 2 CPUs busy (0.0 in the reference window): the machine, "
        "not the settings; 2 intra-op threads on the 1 CPU(s) left wait on each other"
    )
    one_thread = _window(27.5, main=100.0, intra_op_threads=1)
    reference = _window(15.4, intra_op_threads=1)
    cause = explain_drift(reference, one_thread, STATE, STATE)
    assert cause is not None and cause.kind == "load" and cause.threads is None
    # DataLoader workers are this job's own CPU, not another process's.
    busy_workers = _window(25.0, main=100.0, workers=(98.0,))
    assert other_cpus(busy_workers) == pytest.approx(0.02)
    assert explain_drift(REFERENCE, busy_workers, STATE, STATE) is None


def test_a_few_long_steps_are_stalls_not_a_slower_step() -> None:
    steps = [15.0] * (STEPS - 2) + [400.0, 380.0]
    pauses = GcSummary(count=3, total_s=0.7, longest_s=0.4, gen2=2, share=0.6)
    cause = explain_drift(REFERENCE, _window(steps, gc_pauses=pauses), STATE, STATE)
    assert cause is not None and cause.kind == "stalls"
    assert str(cause) == (
        "the median step is as fast as the reference's (15.0 vs 15.4 ms); 2 long step(s), the "
        "longest 400 ms, make the difference (2 full garbage collection(s), 700 ms)"
    )


def test_nothing_shown_leaves_the_drift_unexplained() -> None:
    assert explain_drift(REFERENCE, _window(30.0), STATE, STATE) is None
    no_sampler = dataclasses.replace(_window(30.0), sampler=SamplerSeries())
    assert other_cpus(no_sampler) is None
    assert explain_drift(REFERENCE, no_sampler, STATE, STATE) is None


@pytest.fixture
def gc_threshold() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_the_snapshot_reads_the_process_and_each_knob_of_the_fit(
    gc_threshold: tuple[int, int, int],
) -> None:
    module = ConvModel()
    optimizer = torch.optim.Adam(module.parameters())
    trainer = SimpleNamespace(
        lightning_module=module, optimizers=[optimizer], precision="32-true",
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
    )  # fmt: skip
    math = MathKnobs(("channels_last",))
    math.bind(trainer)  # type: ignore[arg-type]
    before = snapshot(math)
    assert before["torch_threads"] == torch.get_num_threads()
    assert before["gc_threshold"] == gc_threshold and before["knob:channels_last"] is False
    assert "knob:batch_size" not in before  # chosen before the fit, never switched mid-fit
    assert snapshot(math) == before  # nothing changed: nothing differs

    math.set("channels_last", True)
    gc.set_threshold(gc_threshold[0] + 100, *gc_threshold[1:])
    cause = explain_drift(REFERENCE, _window(25.0), before, snapshot(math))
    assert cause is not None and cause.kind == "state"
    assert [name for name, _, _ in cause.changed] == ["gc_threshold", "knob:channels_last"]
    assert set(process_state()) <= set(before)
