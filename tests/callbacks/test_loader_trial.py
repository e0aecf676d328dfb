"""The loader plan as the loop's first trial: when measuring the loader alone is worth it."""

from __future__ import annotations

import pytest

from lightning_maxtp.callbacks.loader_trial import search_floor_s
from lightning_maxtp.observe import JobContext, SamplerSeries, Window
from lightning_maxtp.tuning.switches import PER_WORKER_S, WORKER_START_S


def test_the_search_floor_is_ten_batches_of_loading_plus_a_worker_start() -> None:
    # 0 workers: each 350 ms step waited 240 ms for its 32-sample batch (133 samples/s alone).
    w = Window(
        step_time_s=(0.35,) * 12,
        data_wait_s=(0.24,) * 12,
        samples=(32,) * 12,
        sampler=SamplerSeries(),
        context=JobContext(num_workers=0),
    )
    assert search_floor_s(w) == pytest.approx(10 * 0.24 + WORKER_START_S + PER_WORKER_S)
    fast = Window(
        step_time_s=(0.01,) * 12,
        data_wait_s=(0.001,) * 12,
        samples=(32,) * 12,
        sampler=SamplerSeries(),
        context=JobContext(num_workers=0),
    )
    assert search_floor_s(fast) == 1.0  # never below MIN_LOADER_MEASURE_S
