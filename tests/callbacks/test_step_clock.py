"""StepClock and the sampler on real CPU fits, including one real 2-process DDP run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_maxtp.callbacks.step_clock import StepClock, count_samples
from lightning_maxtp.observe import sampler as _sampler
from tests.helpers import planted

ROOT = Path(__file__).resolve().parents[2]


def test_count_samples_reads_nested_batches_and_names_the_fix() -> None:
    x = torch.zeros(7, 3)
    assert count_samples((x, torch.zeros(7))) == 7
    assert count_samples({"image": x, "label": [1] * 7}) == 7
    assert count_samples([["a", "b"], ["c", "d"]]) == 2
    with pytest.raises(
        TypeError, match="cannot count samples in a batch of object; pass `samples_fn"
    ):
        count_samples(object())


def test_step_clock_closes_windows_and_stops_its_thread() -> None:
    clock = StepClock(window_steps=5, sampler_interval_s=0.02)
    planted.fit(*planted.well_fed_job(), [clock], steps=12)
    # the first step of the epoch has no previous end: 11 measured steps -> 2 full windows
    assert [(w.first_step, w.steps) for w in clock.windows] == [(1, 5), (6, 5)]
    assert len(clock.step_log) == 11
    for w in clock.windows:
        assert w.samples == (256,) * 5
        assert all(0 <= d < s for d, s in zip(w.data_wait_s, w.step_time_s, strict=True))
        assert w.context.batch_size is None and w.context.num_workers == 0
        assert w.context.device_type == "cpu" and w.context.precision == "32-true"
        assert len(w.wait_cpu_s) == len(w.compute_cpu_s) == 5
    assert clock.sampler is not None and clock.sampler._thread is None
    assert clock.sampler.readings, "the sampler read nothing during the fit"
    assert {"main_cpu_percent", "system_cpu_percent"} <= set(clock.sampler.readings[-1][1])


def test_samples_fn_hook_counts_odd_batches() -> None:
    clock = StepClock(window_steps=3, samples_fn=lambda batch: 7, sampler_interval_s=None)
    planted.fit(*planted.well_fed_job(), [clock], steps=4)
    assert clock.windows[0].samples == (7, 7, 7)
    assert clock.sampler is None


class Boom:
    name = "boom"

    def __init__(self) -> None:
        self.calls = 0

    def read(self) -> dict[str, float]:
        self.calls += 1
        raise RuntimeError("sensor unplugged")


def test_failing_source_is_logged_once_and_training_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    boom = Boom()
    clock = StepClock(window_steps=5, sampler_interval_s=0.01, sources=[boom])
    with caplog.at_level(logging.WARNING, logger="lightning_maxtp.observe.sampler"):
        trainer = planted.fit(*planted.well_fed_job(), [clock], steps=20)
    assert trainer.global_step == 20
    messages = [r.getMessage() for r in caplog.records if "sensor unplugged" in r.getMessage()]
    assert messages == [
        "maxtp: sampler: source 'boom' failed and is disabled: RuntimeError('sensor unplugged')"
    ]
    assert boom.calls == 1 and clock.sampler is not None and clock.sampler.failed == ["boom"]
    assert len(clock.sampler.readings) > 1  # the other sources kept sampling


def test_a_source_that_cannot_start_is_a_warning_and_a_note_in_the_report(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As NVML failing at start on a GPU host: before, a debug line, and the diagnosis ran
    # without its readings while the report said nothing.
    from lightning_maxtp.callbacks import BottleneckMonitor

    def unplugged() -> Any:
        raise RuntimeError("no driver")

    monkeypatch.setattr(_sampler, "SystemSource", unplugged)
    monitor = BottleneckMonitor(window_steps=5, sampler_interval_s=0.01)
    with caplog.at_level(logging.WARNING, logger="lightning_maxtp.observe.sampler"):
        planted.fit(*planted.well_fed_job(), [monitor], steps=12)
    text = (
        "sampler source system CPU could not start (RuntimeError: no driver): the diagnosis "
        "runs without its readings"
    )
    assert [r.getMessage() for r in caplog.records if "could not start" in r.getMessage()] == [text]
    assert text in monitor.report.notes


def test_sampler_rejects_bad_interval_and_builds_series() -> None:
    with pytest.raises(ValueError, match="`interval_s` must be > 0, got 0"):
        _sampler.Sampler([], interval_s=0)
    series = _sampler.build_series([
        (0.0, {"gpu_util_percent": 50.0, "alloc_retries": 2.0, "ooms": 0.0, "workers": 2.0}),
        (0.1, {"gpu_util_percent": 70.0, "alloc_retries": 5.0, "ooms": 1.0, "workers": 2.0}),
    ])  # fmt: skip
    assert series.gpu_util_percent == (50.0, 70.0) and series.mean_gpu_util == 60.0
    assert (series.alloc_retries, series.ooms, series.num_worker_processes) == (3, 1, 2)


def test_nvml_and_allocator_sources_read_through_the_gpu_boundary() -> None:
    from tests.helpers.fake_nvml import FakeGpu, FakeNvml

    fake = FakeNvml([FakeGpu(util=87, used_gib=10.0, total_gib=140.0)])
    reading = _sampler.NvmlSource(0, nvml=fake).read()
    assert reading["gpu_util_percent"] == 87.0
    assert reading["gpu_memory_total_bytes"] == 140 * 2**30
    stats = {"reserved_bytes.all.current": 123, "num_alloc_retries": 4, "num_ooms": 1}
    alloc = _sampler.TorchAllocatorSource("cuda:0", stats=lambda device: stats).read()
    assert alloc == {"allocator_reserved_bytes": 123.0, "alloc_retries": 4.0, "ooms": 1.0}


DDP_SCRIPT = """
import json, sys, time
sys.path.insert(0, {root!r})
import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset, DataLoader
from lightning_maxtp.callbacks import BottleneckMonitor
from tests.helpers import planted

class RankSlow(Dataset):
    # rank 1 waits for its data: it is the straggler the others wait for in all-reduce
    def __len__(self):
        return 512
    def __getitem__(self, i):
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
            time.sleep(0.002)
        return torch.zeros(planted.FEATURES), i % 2

clock = BottleneckMonitor(window_steps=4, sampler_interval_s=0.05, verbose=False)
trainer = planted.fit(planted.Mlp(), DataLoader(RankSlow(), batch_size=8), [clock], steps=9,
                      devices=2, strategy="ddp")
if trainer.is_global_zero:
    with open({out!r}, "w") as f:
        json.dump(dict(spreads=[s.to_dict() for s in clock.spreads],
                       summary=clock.report.summary()), f)
"""


@pytest.mark.slow
def test_ddp_rank_zero_aggregates_ranks_and_names_the_straggler(tmp_path: Path) -> None:
    out = tmp_path / "spreads.json"
    script = tmp_path / "ddp_run.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT).format(root=str(ROOT), out=str(out)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=180, cwd=tmp_path, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    spreads = data["spreads"]
    assert len(spreads) == 2  # 8 measured steps, windows of 4
    last = spreads[-1]
    assert len(last["per_rank"]["step_time_s"]) == 2
    assert last["per_rank"]["data_wait_share"][1] > last["per_rank"]["data_wait_share"][0]
    assert last["straggler_rank"] == 1
    stats = last["stats"]["step_time_s"]
    assert stats["min"] <= stats["median"] <= stats["max"]
    assert "ranks: 2, step " in data["summary"] and "straggler rank 1" in data["summary"]


def test_multiprocessing_helpers_are_not_counted_as_workers() -> None:
    import subprocess
    import sys

    from lightning_maxtp.observe.sampler import ProcessCpuSource

    sleep = "import time; time.sleep(30)"
    worker = subprocess.Popen([sys.executable, "-c", sleep])
    # Same command line shape as Python's resource tracker, which spawn users always start.
    tracker = subprocess.Popen(
        [sys.executable, "-c", f"{sleep}  # from multiprocessing.resource_tracker import main"]
    )
    try:
        source = ProcessCpuSource()
        assert source.read()["workers"] == 1
    finally:
        for proc in (worker, tracker):
            proc.kill()
            proc.wait()


def test_workers_started_after_the_first_reading_are_seen_within_a_second() -> None:
    import subprocess
    import sys
    import time

    from lightning_maxtp.observe.sampler import ProcessCpuSource

    source = ProcessCpuSource(demand=True)  # the monitor's default: list children every 2 s
    first = source.read()
    assert first["workers"] == 0 and "main_demand_percent" not in first  # no rate from 1 point
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seen, deadline = 0, time.monotonic() + 1.0
        while not seen and time.monotonic() < deadline:
            time.sleep(0.1)
            seen = int(source.read()["workers"])
        assert seen == 1  # listed again after 0.25 s, 0.5 s, 1 s..., not only after 2 s
        assert source.read()["main_demand_percent"] >= 0
    finally:
        worker.kill()
        worker.wait()


def test_a_thread_that_ends_does_not_make_demand_negative() -> None:
    import threading
    import time

    from lightning_maxtp.observe.sampler import ProcessCpuSource
    from lightning_maxtp.resources.schedstat import schedstats_enabled

    if not schedstats_enabled():
        pytest.skip("needs Linux schedstats")
    source = ProcessCpuSource(demand=True)
    source.read()
    stop = time.monotonic() + 0.3

    def spin() -> None:
        while time.monotonic() < stop:
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    time.sleep(0.15)
    source.read()  # the spinning thread is counted here...
    spinner.join()
    time.sleep(0.05)
    demand = source.read()["main_demand_percent"]  # ...and gone here: its counts leave with it
    assert demand >= 0


@pytest.mark.serial  # sub-second listing deadlines: a loaded parallel pass missed them (CI)
def test_workers_of_the_next_epoch_are_seen_soon_after_the_last_ones_end() -> None:
    import subprocess
    import sys
    import time

    from lightning_maxtp.observe.sampler import ProcessCpuSource

    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    first = subprocess.Popen(sleeper)
    second = None
    try:
        source = ProcessCpuSource()
        end = time.monotonic() + 1.9  # listings at 0, 0.25, 0.75, 1.75 s: now every 2 s
        while time.monotonic() < end:
            assert source.read()["workers"] == 1
            time.sleep(0.1)
        first.kill()
        first.wait()
        # The dead worker is not counted; read before the next one starts, so that a loaded
        # machine's late read cannot see the new worker first and pass for this one.
        assert source.read()["workers"] == 0
        second = subprocess.Popen(sleeper)  # an epoch ends, the next one's workers start
        seen, deadline = [], time.monotonic() + 1.0
        while 1 not in seen and time.monotonic() < deadline:
            time.sleep(0.1)
            seen.append(int(source.read()["workers"]))
        assert 1 in seen, seen  # within a second, not at the next listing 2 s later
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_one_step_epochs_are_measured_across_epoch_boundaries() -> None:
    from torch.utils.data import DataLoader

    from lightning_maxtp.callbacks import MaxThroughputCallback
    from tests.helpers.planted import Mlp, ReadyBatches

    callback = MaxThroughputCallback(
        warmup_steps=2,
        window_steps=8,
        tune_loader=False,
        verbose=False,
        cost_share=None,
        mfu=False,  # the first step would be counted for FLOPs, and not timed
    )
    loader = DataLoader(ReadyBatches(batches=1, batch_size=64), batch_size=None)
    planted.fit(Mlp(), loader, [callback], steps=30, max_epochs=30)
    clock = callback._monitor.clock
    assert len(clock.step_log) == 30, "every step is measured, the first of each epoch too"
    tuning = callback.tuning
    assert tuning.baseline_samples_per_s is not None and tuning.baseline_samples_per_s > 0
    assert "before the baseline was measured" not in tuning.stop_reason


def test_time_the_library_blocked_training_belongs_to_no_step() -> None:
    import time

    from lightning_maxtp.callbacks.step_clock import StepClock

    clock = StepClock(window_steps=4, sampler_interval_s=None)
    clock.restart_step()  # before any step: nothing to restart
    assert clock._last_end is None
    clock._last_end = time.perf_counter() - 5.0  # a step ended, then 5 s of loader search
    clock.restart_step()
    assert time.perf_counter() - clock._last_end < 1.0


def test_an_epochs_start_and_the_validation_before_it_are_measured_not_dropped() -> None:
    import time

    from torch.utils.data import DataLoader

    from tests.helpers.planted import Mlp, ReadyBatches

    class Validated(Mlp):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            end = time.perf_counter() + 0.04  # spun, not slept: a sleep overshoots here
            while time.perf_counter() < end:
                pass

    clock = StepClock(window_steps=6, sampler_interval_s=None, mfu=False)
    train = DataLoader(ReadyBatches(batches=4, batch_size=8), batch_size=None)
    val = DataLoader(ReadyBatches(batches=2, batch_size=8), batch_size=None)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=4, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[clock],
    )  # fmt: skip
    trainer.fit(Validated(), train, val)
    steps = [s for w in clock.windows for s in zip(w.epoch_start, w.gap_s, strict=True)]
    assert len(steps) == 12  # two windows of 6: every step, each epoch's first one too
    starts = [gap for start, gap in steps if start]
    # Epochs 2 and 3 began inside the windows; the fit's first step (timed from its epoch's
    # start) starts the workers once, a boundary that does not recur.
    assert len(starts) == 2
    assert all(gap >= 2 * 0.04 for gap in starts)  # the validation before each
    assert all(gap == 0.0 for start, gap in steps if not start)
    window = clock.windows[0]
    assert window.context.epoch_batches == 4
    cost = window.epoch_cost_s
    assert cost is not None and cost >= 0.08
    assert window.fit_samples_per_s < window.samples_per_s  # what the epochs cost between steps
