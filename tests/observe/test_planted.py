"""Planted bottlenecks on the CPU: real fits, each named right by ``diagnose``."""

from __future__ import annotations

import pytest

from lightning_maxtp.callbacks import StepClock
from lightning_maxtp.knobs.advice import modelled_workers
from lightning_maxtp.knobs.advisor import diagnose
from lightning_maxtp.observe import BottleneckKind, Diagnosis, Window
from lightning_maxtp.observe.job_model import JobModel
from lightning_maxtp.observe.recommendation import Recommendation
from tests.helpers import planted


def measure(job: str, steps: int = 40) -> tuple[Window, list[Diagnosis]]:
    clock = StepClock(window_steps=steps - 2, sampler_interval_s=0.05)
    planted.fit(*getattr(planted, f"{job}_job")(), [clock], steps=steps)
    window = clock.windows[0]
    return window, diagnose(window)


def test_heavy_transform_with_zero_workers_is_data_pipeline() -> None:
    window, found = measure("data_pipeline")
    top = found[0]
    assert top.kind is BottleneckKind.DATA_PIPELINE, [str(d) for d in found]
    assert top.evidence["data_wait_share"] > 0.15
    assert top.evidence["loader_busy_cores"] > 0.6  # the main process loads at a full core
    # with 0 workers the loader's own rate is samples over the waiting time
    loader_rate = sum(window.samples) / sum(window.data_wait_s)
    assert top.evidence["loader_samples_per_s"] == pytest.approx(loader_rate, rel=1e-3)
    assert top.evidence["device_samples_per_s"] == pytest.approx(
        window.device_samples_per_s, rel=1e-3
    )
    # The worker count is the job model's: 2 on two free cores. When other jobs slow the step
    # (the parallel suite), the model may predict no worker gain: then none is proposed and
    # the data path comes first (both read the same window).
    model = JobModel.from_window(window)
    assert model is not None
    choice = model.choose()
    knobs = [r.knob for r in top.recommendations]
    if choice.workers > 0 and choice.gain >= 0.05:
        first = top.recommendations[0]
        assert (first.knob, first.current, first.auto_apply) == ("num_workers", 0, True)
        assert first.proposed == choice.workers
    else:
        assert "num_workers" not in knobs


def test_slow_reads_with_idle_workers_is_storage() -> None:
    window, found = measure("storage")
    top = found[0]
    assert top.kind is BottleneckKind.STORAGE, [str(d) for d in found]
    assert window.sampler.num_worker_processes == 2
    assert top.evidence["loader_busy_cores"] < 0.3  # workers sleep on "reads"
    assert top.evidence["data_wait_share"] > 0.3
    # More reads in flight, as many workers as the job model predicts finish soonest. When
    # other jobs slow the step (the parallel suite), it may predict no gain from them: then a
    # deeper read-ahead or the storage advice comes first (both read the same window).
    first = top.recommendations[0]
    modelled = modelled_workers(window)
    if isinstance(modelled, Recommendation):
        assert (first.knob, first.proposed, first.auto_apply) == (
            modelled.knob, modelled.proposed, True)  # fmt: skip
    elif modelled is False:  # no model (no reading of the workers' CPU): the rules size them
        assert first.knob in {"num_workers", "prefetch_factor"} and first.auto_apply
    else:
        assert first.knob in {"prefetch_factor", "dataset location"}, [str(d) for d in found]
        assert "dataset location" in [r.knob for r in top.recommendations]


def test_heavy_model_on_memory_data_is_compute() -> None:
    _, found = measure("compute", steps=24)
    top = found[0]
    assert top.kind is BottleneckKind.COMPUTE, [str(d) for d in found]
    assert top.evidence["data_wait_share"] < 0.05
    assert [r.knob for r in top.recommendations] == ["compile"]


def test_well_fed_job_raises_no_data_alarm() -> None:
    window, found = measure("well_fed", steps=30)
    # On a CPU the cores are the device: a well-fed job is either healthy or compute-bound,
    # and the data side must stay below the alarm line.
    assert found[0].kind in {BottleneckKind.HEALTHY, BottleneckKind.COMPUTE}
    assert window.data_wait_share < 0.05
    data_side = [d for d in found if d.kind in {BottleneckKind.DATA_PIPELINE,
                                                 BottleneckKind.STORAGE}]  # fmt: skip
    assert all(d.confidence < 0.5 for d in data_side)
