"""Pinned memory: every loader candidate planned for a CUDA host is pinned, none on a CPU host.

The GPU is faked where the planners learn of it (``torch.cuda.is_available`` and the probe for
``tune_dataloader``, the measured window's device for the loop's own measurement) and the
measurement is canned: the hardware boundary. What each planner decides runs for real.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp.callbacks.loader_trial import measure_loader
from lightning_maxtp.loader import measure, tune_dataloader
from lightning_maxtp.loader.candidate import LoaderCandidate
from lightning_maxtp.observe import JobContext, SamplerSeries, Window
from lightning_maxtp.resources import inspect_resources
from lightning_maxtp.tuning.config import TuningConfig
from tests.helpers.fake_nvml import FakeGpu, FakeNvml

MIB = 2**20


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """``pin_memory`` of every candidate the planner asks to measure (canned, no worker starts).

    The rate grows with the workers up to 3 (100 samples/s a worker beyond the main process).
    """
    asked: list[bool] = []

    def canned(
        loader: DataLoader[Any], *, num_workers: int, prefetch_factor: int | None,
        pin_memory: bool, **_: Any,
    ) -> LoaderCandidate:  # fmt: skip
        asked.append(pin_memory)
        rate = 100.0 * (1 + min(num_workers, 3))
        return LoaderCandidate(
            num_workers, prefetch_factor if num_workers else None, pin_memory, rate,
            startup_s=0.01 * num_workers, timed_batches=20, timed_s=1.0,
            main_thread_s_per_sample=1e-5 if num_workers else 1 / rate,
            worker_memory_bytes=MIB if num_workers else None, batch_bytes=MIB,
            sample_bytes=MIB // 8, cpu_share=None if num_workers else 1.0,
        )  # fmt: skip

    monkeypatch.setattr(measure, "measure_candidate", canned)
    return asked


def _loader() -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.zeros(64, 2)), batch_size=8)


@pytest.mark.parametrize("cuda", [True, False], ids=["cuda-host", "cpu-host"])
def test_tune_dataloader_pins_every_candidate_on_a_cuda_host_and_none_on_a_cpu_host(
    cuda: bool, pinned: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    resources = inspect_resources(nvml=FakeNvml([FakeGpu()] if cuda else []))
    assert bool(resources.gpus) is cuda
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    plan = tune_dataloader(_loader(), time_budget_s=2.0, resources=resources)

    assert len(plan.candidates) >= 2, str(plan)  # workers were tried
    assert set(pinned) == {cuda}, pinned  # every measurement asked for, as it would train
    assert all(c.pin_memory is cuda for c in plan.candidates), plan.candidates
    assert plan.pin_memory is cuda and plan.settings()["pin_memory"] is cuda


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_loop_measures_the_loader_pinned_when_its_window_ran_on_a_cuda_device(
    device: str, pinned: list[bool]
) -> None:
    # This host has no CUDA: the device the fit's window ran on decides, not the host's torch.
    window = Window(
        step_time_s=(0.1,) * 12, data_wait_s=(0.05,) * 12, samples=(8,) * 12,
        sampler=SamplerSeries(), context=JobContext(device_type=device),
    )  # fmt: skip
    config = TuningConfig(loader_time_budget_s=2.0)
    plan = measure_loader(_loader(), window, config, inspect_resources(nvml=FakeNvml([])))

    cuda = device == "cuda"
    assert plan.consumption_rate == pytest.approx(160.0)  # 96 samples in 0.6 s of device time
    assert len(pinned) >= 2 and set(pinned) == {cuda}, pinned
    assert all(c.pin_memory is cuda for c in plan.candidates), plan.candidates
    assert plan.pin_memory is cuda
