"""Suite-wide fixtures and scheduling.

Every test must leave no child process, extra thread or variable behind (the autouse fixtures
below; under pytest-xdist each worker checks its own tests, so they work per worker).

How the suite runs (``.ci/run``, the README's test command): two passes.

1. ``pytest -n <cores + 1> --dist loadgroup --serial=exclude``: every test not marked
   ``serial``, on xdist workers (with ``OMP_WAIT_POLICY=PASSIVE``: see ``.ci/run``). Tests marked
   ``slow`` are handed out first, so that the workers end together instead of one starting a
   100 s test while the others have nothing left.
2. ``pytest --serial=only``: the tests marked ``serial``, one at a time, alone on the machine.

The markers (registered in ``pyproject.toml``):

* ``serial``: the test's assertion needs the machine to itself: a timing verdict that a
  neighbour's load can flip (a knob kept only when it measurably helps, a CPU-bound loader plan
  that must match an exhaustive sweep, a gate that must pass an unchanged job). A new test needs
  it when its assertion compares rates or times measured on real CPU work (sleep-bound
  measurements are usually robust, as the storage-bound loader plan's is; check by running it
  under ``-n 2`` beside a CPU hog). Each second of a serial test is a second of the whole run
  (nothing runs beside it). A test that only *makes* load (DDP on the CPU, a CPU hog, a script
  that runs several processes) does not need it: its neighbours in the parallel pass are, by
  definition, tests whose assertions load does not move.
* ``slow``: the test takes more than ~10 s alone here. Only scheduling: slow tests start
  first in the parallel pass; ``-m "not slow"`` gives a quick pass while working.
* ``xdist_group(name)`` (pytest-xdist's own): tests sharing one expensive module-scoped
  fixture (a Ray instance) run on one worker, so the fixture is built once.

``--serial=include`` (the default) runs everything, so a plain ``pytest`` or ``pytest -n 2``
still runs the whole suite.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Iterator

import lightning.pytorch  # noqa: F401  (see below)
import psutil
import pytest
import threadpoolctl  # noqa: F401  (see below)

from lightning_maxtp.knobs.precision import CPU_BF16_ENV

# Importing lightning sets TORCHINDUCTOR_CACHE_DIR and PYTORCH_NVML_BASED_CUDA_CHECK, importing
# threadpoolctl sets KMP_DUPLICATE_LIB_OK; imported here, before any test, so the first test that
# happens to import them is not failed for a leak.

# The math trials' tests plant their own slow and fast steps; on a CPU without bf16 kernels the
# precision knob would not be offered at all (``knobs.precision.cpu_bf16``). Their scripts and
# examples run in child processes, which inherit it. tests/knobs/test_precision_cpu.py unsets it.
os.environ.setdefault(CPU_BF16_ENV, "1")

_GRACE_S = 10.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial",
        choices=("include", "exclude", "only"),
        default="include",
        help="tests marked serial: run them with the rest (include), leave them out (exclude: "
        "the parallel pass) or run only them (only: the serial pass)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep or drop ``serial`` tests as ``--serial`` says; put ``slow`` tests first."""
    mode = config.getoption("--serial")
    if mode != "include":
        want_serial = mode == "only"
        selected: list[pytest.Item] = []
        deselected: list[pytest.Item] = []
        for item in items:
            is_serial = item.get_closest_marker("serial") is not None
            (selected if is_serial == want_serial else deselected).append(item)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    # A stable sort: every worker collects the same order, as pytest-xdist requires.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


_SINGLETONS = (
    "multiprocessing.resource_tracker", "multiprocessing.forkserver",
    "ray::IDLE", "ray/_private/workers/default_worker.py",
)  # fmt: skip
"""Helpers multiprocessing starts once per interpreter and keeps until it exits, and the idle
or still-starting workers of a module's Ray instance: Ray's worker pool starts and ends those on
its own clock (a worker started for a test may take longer than the grace period to register and
be found idle on a loaded machine), and ``tests/helpers/ray_local.py`` checks that every Ray
process is gone when the instance shuts down. A leaked actor is still caught: its process is
named after its class."""


def _children() -> set[int]:
    found = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(name in " ".join(child.cmdline()) for name in _SINGLETONS):
                continue
        found.add(child.pid)
    return found


def _describe(pid: int) -> str:
    """A leaked process by its pid and command line, so a failure says what was left."""
    try:
        return f"{pid} ({' '.join(psutil.Process(pid).cmdline())[:120]})"
    except psutil.Error:
        return f"{pid} (gone)"


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive() and not t.daemon}


@pytest.fixture(autouse=True)
def no_leaked_processes_or_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaks child processes or non-daemon threads (after a grace period).

    A full ``gc.collect()`` only once something is left (DataLoader iterators shut their workers
    down when collected): with torch, Lightning and every test module imported one takes ~0.2 s
    of CPU, and every test used to pay it in its teardown (the 462 quick tests of ``callbacks``,
    ``observe``, ``loader``, ``data``, ``batch_size``, ``inference`` and ``resources`` under
    ``-n 3``: 154 s with it, 94 s without). What a test leaves for the collector goes at
    Python's next full collection instead (in the quick tests of ``callbacks`` and ``observe``
    none came inside a test, and in the 462 the workers' memory and open files grew no more
    than with it). A ``serial`` test starts with one, so that no garbage earlier tests left
    makes a collection's pause land in its timed steps.
    """
    if request.node.get_closest_marker("serial") is not None:
        gc.collect()
    children_before, threads_before = _children(), _threads()
    yield
    deadline = time.monotonic() + _GRACE_S
    collected = False
    while True:
        leaked_children = _children() - children_before
        leaked_threads = _threads() - threads_before
        if not (leaked_children or leaked_threads) or time.monotonic() > deadline:
            break
        if collected:
            time.sleep(0.1)
        gc.collect()
        collected = True
    described = [_describe(pid) for pid in sorted(leaked_children)]
    for pid in leaked_children:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    assert not leaked_children, f"test left child processes behind: {described}"
    assert not leaked_threads, f"test left threads behind: {[t.name for t in leaked_threads]}"


_LAUNCHER_VARIABLES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "GROUP_RANK", "RANK",
    "LOCAL_WORLD_SIZE", "PL_GLOBAL_SEED", "PL_SEED_WORKERS",
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
})  # fmt: skip
"""What Lightning's in-process launchers (``ddp_fork``) and ``seed_everything`` set and leave,
and what inductor sets for itself when ``torch.compile`` first compiles."""


@pytest.fixture(autouse=True)
def no_leaked_environment() -> Iterator[None]:
    """Fail a test that leaves a variable in ``os.environ``; put it back either way.

    Lightning's own variables (``_LAUNCHER_VARIABLES``) are only put back: left behind, a later
    test's subprocesses would inherit a fixed ``MASTER_PORT`` instead of finding a free one.
    """
    saved = dict(os.environ)
    yield
    changed = {
        key
        for key in set(os.environ) | set(saved)
        if os.environ.get(key) != saved.get(key) and key != "PYTEST_CURRENT_TEST"
    }
    for key in changed:
        if key in saved:
            os.environ[key] = saved[key]
        else:
            del os.environ[key]
    leaked = sorted(changed - _LAUNCHER_VARIABLES)
    assert not leaked, f"test changed environment variables and left them: {leaked}"


@pytest.fixture(autouse=True)
def library_logger_as_in_a_fresh_process() -> Iterator[None]:
    """Give each test the ``lightning_maxtp`` logger as a fresh process has it.

    The tests that read the library's console lines through ``caplog`` need the logger to reach
    the root: its level unset, propagating, enabled, the root its parent, no filter, none but
    its own handler. Whatever changed one of them earlier in this process (a test, a script run
    in-process, a library configuring logging) must not hide a later test's lines.
    """
    import logging

    logger = logging.getLogger("lightning_maxtp")
    logger.setLevel(logging.NOTSET)
    logger.propagate, logger.disabled, logger.parent = True, False, logging.getLogger()
    logger.filters[:] = []
    yield
