"""``intra_op_threads``: set back to the fit's start, the BLAS pools are as they were too."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

from lightning_maxtp.knobs.threads import MainThreads


def _blas() -> int:
    np.ones((4, 4)) @ np.ones((4, 4))  # BLAS loaded
    return max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


@pytest.fixture
def pools_2_and_1() -> Iterator[None]:
    """Torch's pool at 2 threads, BLAS's at 1 (a user who limited BLAS alone)."""
    before, blas = torch.get_num_threads(), _blas()
    torch.set_num_threads(2)
    threadpool_limits(limits=1, user_api="blas")
    yield
    torch.set_num_threads(before)
    threadpool_limits(limits=blas, user_api="blas")


@pytest.mark.usefixtures("pools_2_and_1")
def test_a_reverted_thread_trial_puts_the_blas_pool_back_to_its_own_size() -> None:
    threads = MainThreads()
    threads.set(1)
    assert (torch.get_num_threads(), _blas()) == (1, 1)
    threads.set(2)  # the trial reverted: back to the fit's start
    assert (torch.get_num_threads(), _blas()) == (2, 1)
    threads.set(3)  # a change: both pools at its size
    assert (torch.get_num_threads(), _blas()) == (3, 3)
    threads.restore()
    assert (torch.get_num_threads(), _blas()) == (2, 1)
