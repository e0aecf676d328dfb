"""The measured plan of a CPU pool: inline first, worker processes kept only when faster.

The shapes' speeds are planted (``make_placed`` sleeps per batch in the caller or in a spawned
worker), so each verdict is decided by a 5x or larger ratio, whatever the machine's load.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
import torch

from lightning_maxtp.inference import BatchInferencePool, adapt, shape
from lightning_maxtp.inference.memory import extra_copies
from tests.helpers.fake_nvml import GIB
from tests.helpers.inference_models import (
    load_vector,
    make_caller_only,
    make_model,
    make_placed,
    reference,
)
from tests.inference.test_pool import stop_resource_tracker  # noqa: F401 - same clean-up


def assert_matches(outputs: list[torch.Tensor], items: list[int]) -> None:
    expected = reference(items)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_short_or_single_core_inputs_stay_inline_and_long_ones_get_a_trial() -> None:
    common = {"done": 80, "inline_s": 0.5, "workers": 2, "cores": 2, "build_s": 0.1}
    short = shape.decide_shape(inline_rate=500.0, remaining=2000, **common)
    assert short.mode == "inline" and "2000 items take ~4.0 s here" in short.why
    long = shape.decide_shape(inline_rate=500.0, remaining=50_000, **common)
    assert long.mode == "trial" and "2 worker processes" in long.why
    unknown = shape.decide_shape(inline_rate=500.0, remaining=None, **common)
    assert unknown.mode == "wait"
    later = shape.decide_shape(inline_rate=500.0, remaining=None, **{**common, "inline_s": 60})
    assert later.mode == "trial" and "unknown length" in later.why
    one = shape.decide_shape(inline_rate=500.0, remaining=10**9, **{**common, "cores": 1})
    assert one.mode == "inline" and "1 usable core" in one.why
    assert shape.judge_trial(120.0, 100.0, 2).mode == "processes"
    reverted = shape.judge_trial(105.0, 100.0, 2)
    assert reverted.mode == "reverted"
    assert "1.05x" in reverted.why and "1.10x needed" in reverted.why


def test_a_small_in_memory_input_runs_in_the_calling_process_without_workers() -> None:
    items = list(range(200))
    with BatchInferencePool(make_model, load=load_vector, batch_size=16) as pool:
        assert pool.plan.mode == "measured"
        out = pool.map(items)
        assert pool.worker_pids == ()  # nothing spawned: no start-up to pay back
        stats, plan = pool.stats, pool.plan
    assert_matches(out, items)
    assert stats is not None and stats.mode == "inline" and stats.outputs == 200
    assert stats.per_device == {"cpu (inline)": 200}
    assert stats.elapsed_s >= stats.startup_s > 0 and stats.steady_items < 200
    assert "end to end" in str(stats) and "steady" in str(stats)
    assert any(d.startswith("inline:") for d in plan.decisions), plan.decisions
    assert plan.workers and "decided: inline" in str(plan)


def _paced(pool: BatchInferencePool, count: int) -> Iterator[int]:
    """Items, slowed while the trial's workers start, so the input cannot end before they run."""
    import time

    for i in range(count):
        if pool._slots and not all(s.ready for s in pool._slots):
            time.sleep(0.005)
        yield i


@pytest.mark.parametrize(
    ("caller_s", "worker_s", "verdict", "modes"),
    [
        (0.05, 0.0, "processes kept", "inline then processes"),
        (0.01, 0.1, "processes reverted", "inline then processes then inline"),
    ],
    ids=["faster-processes-kept", "slower-processes-reverted"],
)
def test_a_trial_keeps_processes_only_when_they_are_faster(
    monkeypatch: pytest.MonkeyPatch, caller_s: float, worker_s: float, verdict: str, modes: str
) -> None:
    monkeypatch.setattr(shape, "TRIAL_PAYBACK", 0.01)  # any input long enough for a trial
    factory = functools.partial(make_placed, caller_s, worker_s)
    items = list(range(3000))
    with BatchInferencePool(factory, load=load_vector, batch_size=8, max_in_flight=4) as pool:
        out = list(pool.imap(_paced(pool, len(items))))
        stats, plan = pool.stats, pool.plan
        again = pool.map(range(40))
        second = pool.stats
    assert_matches(out, items)  # every item once, in order, across the hand-overs
    assert_matches(again, list(range(40)))
    assert stats is not None and stats.mode == modes and stats.outputs == 3000
    assert sum(w.items for w in stats.workers) == 3000 and not stats.errors
    assert [d.split(":")[0] for d in plan.decisions] == ["trial", verdict], plan.decisions
    assert second is not None
    assert second.mode == ("processes" if verdict == "processes kept" else "inline")


def test_batch_size_auto_searches_inline_and_reports_the_pick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(adapt, "SEARCH_CPU", {"cap": 64, "time_budget_s": 5.0})
    factory = functools.partial(make_placed, 0.01, 0.0)  # 10 ms a call: bigger batches win
    items = list(range(300))
    with BatchInferencePool(factory, load=load_vector, batch_size="auto") as pool:
        assert pool.plan.batch_size is None and "batch size auto" in str(pool.plan)
        out = pool.map(items)
        plan, choice = pool.plan, pool.batch_choice
    assert_matches(out, items)
    assert choice is not None and plan.batch_size == choice["batch_size"] == pool.batch_size
    assert plan.batch_size >= 32  # a fixed cost per call: the search must go past small sizes
    assert any(d.startswith("batch size:") for d in plan.decisions), plan.decisions


def test_batch_size_auto_in_worker_processes_is_searched_by_the_first_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(adapt, "SEARCH_CPU", {"cap": 64, "time_budget_s": 5.0})
    factory = functools.partial(make_placed, 0.0, 0.01)
    items = list(range(300))
    with BatchInferencePool(
        factory, load=load_vector, batch_size="auto", mode="processes", workers_per_device=1
    ) as pool:  # fmt: skip
        out = pool.map(items)
        plan = pool.plan
    assert_matches(out, items)
    assert plan.mode == "processes" and plan.batch_size is not None and plan.batch_size >= 32
    assert any(d.startswith("batch size:") for d in plan.decisions), plan.decisions


def test_copies_per_gpu_follow_the_measured_memory_of_one_copy() -> None:
    free = {0: int(139.5 * GIB), 1: int(23.5 * GIB), 2: None}
    running = {0: 1, 1: 1, 2: 1}
    # (139.5 - 2.5) // 10 = 13, capped at 4; (23.5 - 2.5) // 10 = 2; unknown free: no more.
    assert extra_copies(free, 10 * GIB, running, max_copies=4) == {0: 3, 1: 1, 2: 0}
    assert extra_copies(free, 200 * GIB, running, max_copies=4) == {0: 0, 1: 0, 2: 0}


def test_bad_mode_backend_and_batch_size_are_refused() -> None:
    with pytest.raises(ValueError, match=r"`mode` must be one of .*got 'fast'"):
        BatchInferencePool(make_model, mode="fast")
    with pytest.raises(ValueError, match=r"`backend` must be one of .*got 'dask'"):
        BatchInferencePool(make_model, backend="dask")
    with pytest.raises(ValueError, match=r"`batch_size` must be an int >= 1 or 'auto', got 'big'"):
        BatchInferencePool(make_model, batch_size="big")


def test_tensor_views_are_copied_out_before_they_travel_to_a_worker() -> None:
    from lightning_maxtp.inference.batching import compact

    big = torch.zeros(1000, 3, 8, 8)
    rows, whole = list(big.unbind(0)), torch.ones(3, 8, 8)
    sent = compact([(0, rows[0]), (1, whole), (2, "not a tensor")])
    assert sent[0][1].untyped_storage().nbytes() == rows[0].nbytes  # not the 1000-row storage
    assert sent[1][1] is whole and sent[2][1] == "not a tensor"
    torch.testing.assert_close(sent[0][1], rows[0])


def test_a_worker_that_cannot_start_reverts_the_trial_and_the_run_completes_inline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shape, "TRIAL_PAYBACK", 0.01)
    factory = functools.partial(make_caller_only, 0.01)
    items = list(range(3000))
    with BatchInferencePool(factory, load=load_vector, batch_size=8) as pool:
        out = list(pool.imap(_paced(pool, len(items))))
        plan, stats = pool.plan, pool.stats
        assert pool.worker_pids == ()
    assert_matches(out, items)
    assert stats is not None and stats.mode == "inline"
    assert plan.decisions[-1].startswith("processes reverted: worker #"), plan.decisions
    assert "could not build the model" in plan.decisions[-1] and plan.mode == "inline"


def test_imap_pulls_nothing_before_its_first_item_and_an_unstarted_one_blocks_nothing() -> None:
    pulled = []

    def source() -> Iterator[int]:
        for i in range(40):
            pulled.append(i)
            yield i

    with BatchInferencePool(make_model, load=load_vector, batch_size="auto") as pool:
        unstarted = pool.imap(source())
        assert pulled == [] and pool.plan.batch_size is None  # no search, nothing read
        unstarted.close()
        assert_matches(pool.map(range(10)), list(range(10)))  # the closed one blocks nothing
        assert pool.plan.batch_size is not None
