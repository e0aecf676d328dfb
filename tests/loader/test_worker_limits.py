"""``WorkerThreadLimit``: caps thread pools in real workers, then runs the user's own init."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from functools import partial
from multiprocessing import resource_tracker

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_maxtp.loader.worker_limits import WorkerThreadLimit, unwrap_worker_init_fn
from tests.helpers.loader_data import BlasThreadsDataset, ThreadsDataset, thread_report


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker() -> Iterator[None]:
    # Spawn-context queues start multiprocessing's resource tracker, which lives as long as
    # this process; starting it before the per-test leak check keeps it out of "leaked".
    resource_tracker.ensure_running()
    yield


def rows(loader: DataLoader) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in item) for item in loader]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_limits_threads_then_runs_the_users_init(method: str) -> None:
    before = os.environ.get("OMP_NUM_THREADS")
    forked = method == "fork"
    loader = DataLoader(
        ThreadsDataset(),
        batch_size=None,
        num_workers=1,
        multiprocessing_context=method,
        worker_init_fn=WorkerThreadLimit(2, thread_report, forked=forked),
    )
    # (index, torch threads, OMP_NUM_THREADS, threads the user's init saw): the user's function
    # ran after the limits, in the worker, under both start methods; a forked worker keeps
    # OpenMP (and torch's pool on it) at one thread.
    threads = 1 if forked else 2
    assert rows(loader) == [(i, threads, threads, threads) for i in range(4)]
    assert os.environ.get("OMP_NUM_THREADS") == before  # only the worker was limited


class ZerosDataset(torch.utils.data.Dataset[int]):
    """Each sample runs a torch op big enough to be split over intra-op threads."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return int(torch.zeros(4_000_000).sum()) + index


def test_a_forked_worker_given_threads_does_not_hang_on_the_parents_openmp_team() -> None:
    # The parent's OpenMP team is running (a parallel fill with every thread); a forked child
    # that raised its own threads above one then waited forever in the next parallel region.
    if torch.get_num_threads() < 2:
        pytest.skip("one thread: no OpenMP team in the parent")
    torch.zeros(4_000_000).fill_(1.0)
    loader = DataLoader(
        ZerosDataset(), batch_size=None, num_workers=1, multiprocessing_context="fork",
        worker_init_fn=WorkerThreadLimit(2, forked=True), timeout=60,
    )  # fmt: skip
    assert list(loader) == [0, 1, 2, 3]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_blas_pools_already_loaded_are_limited_inside_each_worker(method: str) -> None:
    # numpy's OpenBLAS sized its pool from the machine when this process loaded it; a forked
    # worker inherits that pool, and a spawned one loads it again when the dataset unpickles:
    # only threadpoolctl can shrink a pool that already exists.
    from threadpoolctl import threadpool_info

    def blas_threads() -> int:
        return max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")

    np.ones((8, 8)) @ np.ones((8, 8))
    parent = blas_threads()
    if parent < 2:
        pytest.skip("one CPU: BLAS already runs one thread, a limit cannot show")
    loader = DataLoader(
        BlasThreadsDataset(),
        batch_size=None,
        num_workers=1,
        multiprocessing_context=method,
        worker_init_fn=WorkerThreadLimit(1),
    )
    assert rows(loader) == [(0, 1), (1, 1)]
    assert blas_threads() == parent  # the main process keeps its own pool


def test_without_a_limit_workers_keep_torchs_single_thread() -> None:
    loader = DataLoader(
        ThreadsDataset(), batch_size=None, num_workers=1, worker_init_fn=thread_report
    )
    first = rows(loader)[0]
    assert first[1] == 1 and first[3] == 1


def test_pickles_and_never_stacks() -> None:
    user = partial(thread_report)
    limit = pickle.loads(pickle.dumps(WorkerThreadLimit(3, user)))
    assert limit.threads == 3 and limit.user_fn.func is thread_report
    again = WorkerThreadLimit(1, WorkerThreadLimit(2, thread_report))
    assert again.user_fn is thread_report and unwrap_worker_init_fn(again) is thread_report
    with pytest.raises(ValueError, match=r"`threads` must be >= 1, got 0"):
        WorkerThreadLimit(0)
    assert torch.get_num_threads() >= 1
