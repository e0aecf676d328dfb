"""``BatchInferencePool`` with real spawned workers on the CPU.

Spawning costs ~3 s per worker here (each imports torch), so most tests share one module-scoped
pool; the tests that kill a worker, interrupt or fail the pool start their own.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
import torch

from lightning_maxtp.inference import BatchInferencePool, InferenceError, ItemError
from tests.helpers.inference_models import POISON_LOAD, load_vector, make_model, reference

BATCH = 4
IN_FLIGHT = 3


@pytest.fixture(scope="module", autouse=True)
def stop_resource_tracker() -> Iterator[None]:
    """Stop multiprocessing's resource tracker if this module's spawns started it.

    Spawning starts that tracker, a child process living until the interpreter exits; later
    tests in the session count child processes (the sampler's DataLoader workers).
    """
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    was_running = tracker._pid is not None
    yield
    if not was_running and tracker._pid is not None:
        tracker._stop()


@pytest.fixture(scope="module")
def pool() -> Iterator[BatchInferencePool]:
    with BatchInferencePool(
        make_model, devices="cpu", workers_per_device=2, batch_size=BATCH, load=load_vector,
        max_in_flight=IN_FLIGHT, on_error="return",
    ) as pool:  # fmt: skip
        yield pool


def assert_matches(outputs: list[torch.Tensor], items: list[int]) -> None:
    expected = reference(items)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_map_equals_a_single_process_reference_in_order(pool: BatchInferencePool) -> None:
    items = list(range(50))
    assert_matches(pool.map(items), items)
    stats = pool.stats
    assert stats is not None
    assert (stats.items, stats.outputs, stats.errors, stats.retries) == (50, 50, (), 0)
    assert sum(w.items for w in stats.workers) == 50 and stats.per_device == {"cpu": 50}
    assert stats.to_dict()["items_per_s"] > 0 and "50 items in" in str(stats)


def test_imap_ordered_and_unordered_deliver_each_item_once(pool: BatchInferencePool) -> None:
    items = list(range(100, 137))
    assert_matches(list(pool.imap(iter(items))), items)
    unordered = list(pool.imap(items, ordered=False))
    expected = reference(items)
    matched = sorted(
        next(j for j, want in enumerate(expected) if torch.allclose(got, want)) for got in unordered
    )
    assert matched == list(range(len(items)))  # a permutation: nothing lost, nothing twice


def test_workers_run_light_and_see_no_gpu(pool: BatchInferencePool) -> None:
    pool.map(range(4))  # both may still be starting: this waits for at least one
    assert pool.worker_info, "no worker reported ready"
    for info in pool.worker_info:
        assert info["lightning_imported"] is False  # torch only: lightning costs 8 s per spawn
        assert info["cuda_visible_devices"] == "" and info["device"] == "cpu"
        assert info["torch_threads"] == pool.plan.workers[0].torch_threads
        assert info["autocast"] is None  # precision="auto" is fp32 on the CPU
    assert len(set(pool.worker_pids)) == 2 and os.getpid() not in pool.worker_pids


def test_imap_on_an_endless_generator_pulls_a_bounded_number_ahead(
    pool: BatchInferencePool,
) -> None:
    pulled = 0

    def endless() -> Iterator[int]:
        nonlocal pulled
        for i in itertools.count():
            pulled += 1
            yield i

    results = pool.imap(endless())
    ahead = []
    for consumed, _ in enumerate(results, start=1):
        ahead.append(pulled - consumed)
        if consumed == 120:
            break
    results.close()  # leaving early: outstanding batches are dropped
    assert max(ahead) <= IN_FLIGHT * BATCH
    assert pulled <= 120 + IN_FLIGHT * BATCH
    # The pool is still usable; late results of the abandoned run are not mixed in.
    assert_matches(pool.map(range(9)), list(range(9)))


def test_item_errors_under_each_policy(pool: BatchInferencePool) -> None:
    items: list[object] = [0, 1, -5, POISON_LOAD, 4, 5, 6]
    good = [0, 1, 4, 5, 6]
    try:
        out = pool.map(items)  # on_error="return"
        errors = [(o.index, o.stage, o.error_type) for o in out if isinstance(o, ItemError)]
        assert errors == [(2, "forward", "ValueError"), (3, "load", "OSError")]
        assert_matches([o for o in out if not isinstance(o, ItemError)], good)
        assert isinstance(out[3], ItemError) and "cannot read 'bad-load'" in str(out[3])

        pool.on_error = "skip"
        assert_matches(pool.map(items), good)
        assert pool.stats is not None
        assert [e.index for e in pool.stats.errors] == [2, 3]
        assert pool.stats.outputs == 5

        pool.on_error = "raise"
        with pytest.raises(InferenceError, match=r"item 2 \(-5\) failed in forward") as info:
            pool.map(items)
        assert info.value.error.index == 2 and "on_error='skip'" in str(info.value)
    finally:
        pool.on_error = "return"
    assert_matches(pool.map([7, 8]), [7, 8])  # a raise leaves the pool working


def test_empty_input_gives_empty_output(pool: BatchInferencePool) -> None:
    assert pool.map([]) == []
    assert list(pool.imap(iter([]), ordered=False)) == []
    assert pool.stats is not None and pool.stats.items == 0


def _closure_factory() -> object:
    size = 3
    return lambda: torch.nn.Linear(size, size)


def test_unpicklable_callables_are_refused_at_construction_with_the_fix() -> None:
    fix = r"must be picklable .* define it as a module-level function .* functools\.partial"
    with pytest.raises(ValueError, match=r"`model_factory` " + fix):
        BatchInferencePool(lambda: torch.nn.Linear(2, 2), devices="cpu")
    with pytest.raises(ValueError, match=r"`model_factory` " + fix):
        BatchInferencePool(_closure_factory(), devices="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`load` " + fix):
        BatchInferencePool(make_model, load=lambda x: x, devices="cpu")
    with pytest.raises(ValueError, match=r"`batch_size` must be an int >= 1 or 'auto', got 0"):
        BatchInferencePool(make_model, batch_size=0, devices="cpu")
    with pytest.raises(ValueError, match=r"`on_error` must be one of .* got 'ignore'"):
        BatchInferencePool(make_model, on_error="ignore", devices="cpu")
    with pytest.raises(RuntimeError, match=r"not running; use `with BatchInferencePool"):
        BatchInferencePool(make_model, devices="cpu").map([1])


def gone(pids: tuple[int, ...]) -> bool:
    return not any(psutil.pid_exists(pid) for pid in pids)


def test_a_killed_worker_is_replaced_and_every_item_arrives_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    items = list(range(64))
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    with BatchInferencePool(
        functools.partial(make_model, 0.2), devices="cpu", workers_per_device=2,
        batch_size=BATCH, load=load_vector, progress=True,
    ) as pool:  # fmt: skip
        # Batches go to ready workers only: until both are ready, worker 0 may hold none.
        deadline = time.monotonic() + 60
        while len(pool.worker_info) < 2 and time.monotonic() < deadline:
            pool.map(items[: 2 * BATCH])
        assert len(pool.worker_info) == 2, pool.worker_info
        outputs = []
        for consumed, output in enumerate(pool.imap(items), start=1):
            outputs.append(output)
            if consumed == 8:
                victim = pool.worker_pids[0]
                os.kill(victim, signal.SIGKILL)  # for real: it holds batches right now
        stats = pool.stats
        pids = pool.worker_pids
    assert_matches(outputs, items)
    assert stats is not None
    assert stats.retries >= 1 and stats.workers[0].restarts == 1
    assert (stats.items, stats.outputs, stats.errors) == (64, 64, ())
    assert victim not in pids and gone(pids)  # the replacement was stopped on exit too
    if shm_before:  # tensors travel as pickled bytes: a killed worker leaves no segment behind
        leaked = set(os.listdir("/dev/shm")) - shm_before
        assert not [n for n in leaked if "torch" in n or n.startswith(("psm_", "mp-"))], leaked
    assert "[maxtp] inference (processes): 64 items" in capsys.readouterr().err


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own Ctrl-C handler during the test, whatever was installed before."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("python_sigint")
def test_keyboard_interrupt_and_exceptions_stop_every_worker() -> None:
    slow = functools.partial(make_model, 0.3)
    pool = BatchInferencePool(slow, devices="cpu", workers_per_device=1, batch_size=2)
    interrupt = threading.Timer(6.0, os.kill, (os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt), pool:
        pids = pool.worker_pids
        interrupt.start()
        # 0.3 s per batch of 2 and 1,000 items: far longer than the 6 s before the interrupt
        # however fast the worker starts (100 items finished first once in CI).
        pool.map([torch.full((4,), float(i)) for i in range(1000)])
    interrupt.join()
    assert gone(pids) and pool.worker_pids == ()
    assert pool.stats is not None and pool.stats.outputs < 1000  # it was interrupted

    failing = BatchInferencePool(slow, devices="cpu", workers_per_device=1)
    with pytest.raises(RuntimeError, match="boom"), failing:
        pids = failing.worker_pids
        raise RuntimeError("boom")
    assert gone(pids) and failing.worker_pids == ()
