"""The fit's own settings as knobs: what the loop reads of them is declared, not named.

The derived names are checked by their properties, so adding a setting breaks none of these.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from lightning_maxtp.callbacks.knobs import Knobs
from lightning_maxtp.knobs import registry
from lightning_maxtp.knobs.base import FitView, NotOffered
from lightning_maxtp.loader.candidate import LOADER_KNOBS
from lightning_maxtp.observe.diagnosis import BottleneckKind, Diagnosis
from lightning_maxtp.observe.recommendation import Recommendation
from lightning_maxtp.observe.window import JobContext
from lightning_maxtp.tuning.trials import next_change, remaining


def test_each_role_the_loop_reads_is_declared_by_exactly_one_setting() -> None:
    for role in ("counts_workers", "queue_depth", "epoch_start_only"):
        assert len([k for k in registry.SETTINGS if getattr(k, role)]) == 1, role
    assert registry.LOADER_SETTINGS == LOADER_KNOBS
    fields = {f.name for f in dataclasses.fields(JobContext)}
    for knob in registry.SETTINGS:
        assert knob.context_field == knob.name and knob.name in fields, knob.name
        assert knob.preset == "safe" and not knob.guarded, "settings keep the math"
        assert isinstance(knob().offer(FitView(None)), NotOffered), "tried from the diagnosis"
    assert not {k.name for k in registry.SETTINGS} & set(registry.MATH_KNOBS)


def _found(*recs: tuple[str, Any]) -> tuple[Diagnosis, ...]:
    recommendations = tuple(
        Recommendation(knob=k, current=None, proposed=v, reason=f"{k} -> {v}", auto_apply=True)
        for k, v in recs
    )
    return (Diagnosis(BottleneckKind.DATA_PIPELINE, 0.9, "data", recommendations=recommendations),)


def test_next_change_reads_each_settings_declared_conditions() -> None:
    workers, prefetch, pinned = registry.WORKERS, registry.PREFETCH, "pin_memory"
    settings = {k: None for k in registry.LOADER_SETTINGS} | {workers: 0}
    # Needs workers: skipped without them; the next recommendation is taken.
    found = _found((prefetch, 4), (workers, 2))
    assert next_change(found, settings, set())[:2] == (workers, 2)
    # A device it has no effect on: skipped.
    assert next_change(_found((pinned, True)), settings, set(), device_type="cpu") is None
    assert next_change(_found((pinned, True)), settings, set(), device_type="cuda") is not None
    # The worker count's growth is capped by the user's cap; fewer workers are not.
    assert next_change(_found((workers, 8)), settings, set(), max_workers=3)[:2] == (workers, 3)
    # A loader the loop cannot switch: no loader setting, the threads still.
    threads = registry.setting_class("intra_op_threads")
    assert threads is not None and threads.holder == "process"
    unswitchable = {threads.name: 2}
    found = _found((workers, 2), (threads.name, 1))
    assert next_change(found, unswitchable, set())[:2] == (threads.name, 1)
    # Without workers and no worker change offered, the worker-only ones no longer apply.
    left = remaining(_found((prefetch, 4)), set(), settings)
    assert left[0].recommendations == ()


def test_knobs_set_read_and_put_back_the_main_threads_through_their_knob() -> None:
    knobs, before = Knobs(), torch.get_num_threads()
    try:
        knobs.request(intra_op_threads=1, num_workers=2)  # no loader: its setting is dropped
        assert torch.get_num_threads() == 1
        assert knobs.context() == {"intra_op_threads": 1}
        assert knobs.settings() == {"intra_op_threads": 1}
        knobs.restore()
        assert torch.get_num_threads() == before
        assert knobs.settings() == {"intra_op_threads": 1}, "in force until the fit ended"
    finally:
        torch.set_num_threads(before)


def test_a_name_no_knob_has_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown knob 'workers'"):
        Knobs().request(workers=2)
