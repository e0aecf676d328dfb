"""``tune_dataloader`` on real DataLoaders with real worker processes.

This machine has 2 cores shared with other jobs, so rates are noisy: comparisons with the
exhaustive sweep use the best of interleaved rounds (a busy neighbour only ever slows a round
down), and the curves that need more workers than cores to show a knee wait on "storage" (sleep
under a semaphore) instead of computing.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp.loader import LoaderPlan, tune_dataloader
from lightning_maxtp.loader.measure import sweep
from lightning_maxtp.resources.schedstat import schedstats_enabled
from tests.helpers.loader_data import (
    DecodeDataset,
    MemoryHogDataset,
    SleepDataset,
    UnpicklableDataset,
    release_hogs,
)
from tests.helpers.runif import RunIf

MIB = 2**20

LOWEST_MARK = 0.5
"""The lowest a pass mark lowered by the measured noise may fall. A plan that loads at half the
sweep best's rate, paired with it, is wrong whatever the pairs' spread: without a floor, one
wild pair (a ratio of 3 beside ones of 0.3) lowers the mark under 0 and any plan passes."""


def pass_mark(mark: float, ratios: list[float]) -> float:
    """``mark`` less the noise of paired ratios (half their spread), never under ``LOWEST_MARK``."""
    return max(LOWEST_MARK, mark - (max(ratios) - min(ratios)) / 2)


def best_rates(loader: DataLoader, grid: list[tuple[int, int | None]], **kwargs: float) -> dict:
    results = sweep(loader, grid, **kwargs)  # type: ignore[arg-type]
    return {setting: max(c.samples_per_s for c in runs) for setting, runs in results.items()}


def chosen(plan: LoaderPlan) -> tuple[int, int | None]:
    return plan.num_workers, plan.prefetch_factor


@pytest.mark.slow
def test_storage_bound_plan_finds_the_knee_and_matches_the_exhaustive_sweep() -> None:
    # "Storage" serving 4 reads at once, 12 ms each: the rate doubles with each doubling of the
    # workers up to 4 (each worker its own slot, ~320 samples/s), then stays flat. Slow reads
    # keep this 2-core machine's CPUs out of it: with 4 ms reads and 3 slots, the CPUs capped
    # the rate near the knee, and 4, 5 or 6 workers came out within each other's noise.
    # Sleep-bound with 12 ms reads, so not serial (marked when its reads took 4 ms and it failed
    # once under -n 2): beside three spinning processes the sweep read 80 / 152 / 322 / 332
    # samples/s at 1 / 2 / 4 / 8 workers (alone 82 / 152 / 306 / 310) and both tuning runs
    # chose 4; it passed 3 of 3 runs under `-n 3` beside the scoreboard's, the data paths' and
    # gpu_check_all's smoke tests. Serial, it held the whole run 45-48 s (its sweep is ~34
    # measurements of ~1 s each: workers started, warmed up, timed).
    loader = DataLoader(SleepDataset(2400, sleep_s=0.012, limit=4), batch_size=8, shuffle=True)
    plan = tune_dataloader(loader, max_workers=8, time_budget_s=6)
    if not 4 <= plan.num_workers <= 5:
        # A neighbour's burst during one measurement can move one tuning run off the knee: a
        # second run decides.
        plan = tune_dataloader(loader, max_workers=8, time_budget_s=6)
    # Every worker count on the way to the knee and past it, prefetch 4 once at the knee (it
    # cannot add read slots), and whatever the plan chose: 10 settings, not all 17 of the grid.
    grid = [(0, None), *((w, 2) for w in (1, 2, 3, 4, 5, 6, 8)), (4, 4)]
    grid += [chosen(plan)] if chosen(plan) not in grid else []
    rates = best_rates(loader, grid, rounds=2, slice_s=0.2)
    best = max(rates.values())
    why = (str(plan), rates)
    assert rates[(2, 2)] < 0.85 * best, why  # the curve has its knee above 2 workers
    # The knee (4) or just past it, where the curve is flat; not the cap of 8. Each setting is
    # measured once in the 6 s, so a burst in the 8-worker reading can send it to 6.
    assert 4 <= plan.num_workers <= 6, why
    if rates[chosen(plan)] < 0.9 * best:
        # A neighbour's burst can slow both sweep rounds of one setting: check it paired.
        top = max(rates, key=rates.__getitem__)
        pair = sweep(loader, [chosen(plan), top], rounds=3, slice_s=0.2)
        ratios = [
            a.samples_per_s / b.samples_per_s
            for a, b in zip(pair[chosen(plan)], pair[top], strict=True)
        ]
        assert statistics.median(ratios) >= pass_mark(0.9, ratios), (why, ratios)
    assert plan.elapsed_s <= 6 + 1.0
    assert [c.num_workers for c in plan.candidates][:4] == [0, 1, 2, 4], why


@pytest.mark.serial
def test_cpu_heavy_decode_plan_matches_the_exhaustive_sweep() -> None:
    # JPEG decode + crop + flip: CPU-bound, so on 2 cores at most 2 workers can help. The probe
    # would give 1 (one core stays with training); here the loader gets the whole machine.
    loader = DataLoader(DecodeDataset(count=48), batch_size=8, shuffle=True)
    failures: list[str] = []
    # Settings within a few % of each other: a neighbour can swap them once. Once in CI (the
    # serial pass, nothing else running) 2 workers at prefetch 4 ran 1.2x the plan's settings in
    # both of two tries and the plan had not tried them: a third try decides. Another time one
    # try measured the main process at 1,129 samples/s and 2 workers at 471 (usually 500-940
    # and 650-850 here) and kept the main process: that try is one failure, not the verdict.
    for _ in range(3):
        loaded_before = oversubscribed()
        plan = tune_dataloader(loader, max_workers=2, time_budget_s=4)
        if plan.num_workers < 1:  # workers overlap decoding with the step
            failures.append(f"no worker chosen: {plan}")
            continue
        failure = _worse_than_the_sweep(loader, plan, loaded_before)
        if failure is None:
            return
        failures.append(failure)
    pytest.fail("\n".join(failures))


def _worse_than_the_sweep(loader: DataLoader, plan: LoaderPlan, loaded_before: bool) -> str | None:
    """Why ``plan`` is measurably slower than the sweep's best setting, or None when it is not."""
    # Worker settings only: without a consumption rate the plan scores loading in the main
    # process as serial with the step (the caller asserts workers were chosen), while the
    # loader alone cannot show that overlap, so 0 workers alone is no reference for it.
    grid: list[tuple[int, int | None]] = [(1, 2), (1, 4), (2, 2), (2, 4)]
    rates = best_rates(loader, grid, rounds=2, slice_s=0.3)
    best = max(rates, key=rates.__getitem__)
    if best == chosen(plan):
        return None
    # Compare the two again, paired A/B/A/B, to the precision the pairs show (half their
    # spread). When other jobs oversubscribe these 2 cores, the best setting itself moves with
    # their load between tuning and checking: only a sanity bound is checked then.
    pair = sweep(loader, [chosen(plan), best], rounds=4, slice_s=0.3)
    ratios = [
        a.samples_per_s / b.samples_per_s
        for a, b in zip(pair[chosen(plan)], pair[best], strict=True)
    ]
    mark = pass_mark(0.6 if loaded_before or oversubscribed() else 0.9, ratios)
    if statistics.median(ratios) >= mark:
        return None
    return f"{plan}: sweep best {best} {rates}, paired ratios {ratios}, pass mark {mark:.2f}"


def oversubscribed() -> bool:
    """Whether other jobs keep more runnable threads than this machine has cores."""
    return os.getloadavg()[0] > (os.cpu_count() or 1)


def test_a_huge_measured_noise_does_not_lower_the_pass_mark_below_its_floor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert pass_mark(0.9, [0.95, 0.85, 0.9]) == pytest.approx(0.85)  # the noise lowers it
    assert pass_mark(0.9, [3.0, 0.1]) == LOWEST_MARK  # 1.45 of noise: not under the floor
    assert pass_mark(0.6, [0.4, 0.8]) == LOWEST_MARK
    # A plan a quarter as fast as the sweep's best in the median of its pairs, one pair wild:
    # it fails, on a quiet machine and on a loaded one alike. Canned rates, no worker started.
    swept = {(1, 2): 100.0, (1, 4): 50.0, (2, 2): 30.0, (2, 4): 50.0}
    paired = {(2, 2): [10.0, 20.0, 30.0, 300.0], (1, 2): [100.0] * 4}

    def canned(loader: object, grid: list[tuple[int, int | None]], rounds: int, **_: float) -> dict:
        if rounds == 4:  # the plan's setting and the best, paired A/B/A/B
            return {s: [SimpleNamespace(samples_per_s=r) for r in paired[s]] for s in grid}
        return {s: [SimpleNamespace(samples_per_s=swept[s])] * rounds for s in grid}

    monkeypatch.setattr(sys.modules[__name__], "sweep", canned)
    plan = SimpleNamespace(num_workers=2, prefetch_factor=2)
    for loaded in (False, True):
        failure = _worse_than_the_sweep(None, plan, loaded)  # type: ignore[arg-type]
        assert failure is not None and failure.endswith("pass mark 0.50"), failure


def test_reads_that_wait_raise_the_cpu_budget_and_decoding_does_not() -> None:
    from lightning_maxtp.resources import inspect_resources

    res = inspect_resources()
    cpu_budget = max(0, res.cpu.effective - 1)  # one device process: this one
    loader = DataLoader(SleepDataset(4000, sleep_s=0.004), batch_size=8)
    plan = tune_dataloader(loader, time_budget_s=4, local_world_size=1, resources=res)
    base = plan.candidates[0]
    assert base.num_workers == 0 and base.cpu_share is not None and base.cpu_share < 0.5
    cpus = max(cpu_budget, 1)
    assert plan.budget.io_workers == min(4 * cpus, int(cpus / base.cpu_share)), str(plan)
    assert plan.num_workers > max(cpu_budget, 1), str(plan)  # sleeping workers cost no core
    if plan.num_workers == plan.budget.max_workers:  # the reason names the raised cap
        assert "because loading waits on I/O" in plan.reason, str(plan)

    decode = DataLoader(DecodeDataset(count=48), batch_size=8)
    plan = tune_dataloader(decode, time_budget_s=2, local_world_size=1, resources=res)
    share = plan.candidates[0].cpu_share
    assert share is not None and share > 0.5 and plan.budget.io_workers is None, str(plan)


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not schedstats_enabled(),
    reason="needs Linux schedstats and CPU affinity",
)
def test_a_cpu_bound_loader_on_a_busy_machine_is_not_taken_for_waiting_reads() -> None:
    # This process and three busy loops share one core: decoding gets about a quarter of it, so
    # its CPU seconds per second fall far under 0.5 although it never waits on a read. The time
    # spent waiting for the core counts as demand, so the share stays near 1, no I/O cap.
    decode = DataLoader(DecodeDataset(count=48), batch_size=8)
    before = os.sched_getaffinity(0)
    core = min(before)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        for hog in hogs:
            os.sched_setaffinity(hog.pid, {core})
        os.sched_setaffinity(0, {core})
        plan = tune_dataloader(decode, max_workers=1, time_budget_s=1.5)
    finally:
        os.sched_setaffinity(0, before)
        for hog in hogs:
            hog.kill()
            hog.wait()
    share = plan.candidates[0].cpu_share
    assert share is not None and share > 0.8, str(plan)


def test_cheap_in_memory_dataset_keeps_loading_in_the_main_process() -> None:
    data = TensorDataset(torch.randn(4096, 8), torch.arange(4096))
    loader = DataLoader(data, batch_size=64, shuffle=True)
    plan = tune_dataloader(loader, max_workers=2, time_budget_s=2)
    assert chosen(plan) == (0, None) and plan.persistent_workers is False, str(plan)
    assert {c.num_workers for c in plan.candidates} >= {0, 1}  # workers were tried, and lost
    assert "workers do not measurably help" in plan.reason
    assert plan.changes() == []


@pytest.fixture
def unpicklable(tmp_path) -> Iterator[UnpicklableDataset]:  # type: ignore[no-untyped-def]
    path = tmp_path / "store.bin"
    path.write_bytes(b"data")
    dataset = UnpicklableDataset(str(path))
    yield dataset
    dataset.close()


def test_unpicklable_dataset_under_spawn_names_the_attribute(unpicklable) -> None:  # type: ignore[no-untyped-def]
    loader = DataLoader(unpicklable, batch_size=2, num_workers=1, multiprocessing_context="spawn")
    expected = (
        r"`loader\.dataset\.store\.handle` \(a `_io\.BufferedReader`\) cannot be pickled, so "
        r"DataLoader workers started with 'spawn' cannot receive it \(cannot pickle "
        r"'_io\.BufferedReader' object\)\. Fix: create it inside the worker"
    )
    with pytest.raises(ValueError, match=expected):
        tune_dataloader(loader, max_workers=2, time_budget_s=5)


def test_unpicklable_collate_fn_is_named_too() -> None:
    loader = DataLoader(
        list(range(8)),
        batch_size=2,
        collate_fn=lambda b: b,
        num_workers=1,
        multiprocessing_context="forkserver",
    )
    with pytest.raises(
        ValueError, match=r"`loader\.collate_fn` \(a `builtins\.function`\).*'forkserver'.*lambdas"
    ):
        tune_dataloader(loader, max_workers=1)


@pytest.fixture
def hogs() -> Iterator[None]:
    yield
    release_hogs()


def test_memory_heavy_workers_get_fewer_workers_with_the_reason(hogs: None) -> None:
    dataset = MemoryHogDataset(96 * MIB, size=160, sleep_s=0.003)
    loader = DataLoader(dataset, batch_size=8)
    plan = tune_dataloader(loader, max_workers=6, memory_budget_bytes=250 * MIB, time_budget_s=4)
    budget = plan.budget
    assert budget.worker_memory_bytes is not None and budget.worker_memory_bytes >= 96 * MIB
    assert budget.limited_by == "memory" and budget.memory_workers == 2, str(plan)
    assert max(c.num_workers for c in plan.candidates) <= 2
    assert plan.num_workers == 2  # sleeping loads: 2 workers beat 1 by far
    assert re.search(r"RAM: each worker uses \d+ MiB and 250 MiB are set aside", plan.reason)


def test_tuning_respects_its_time_budget_and_restores_random_state() -> None:
    loader = DataLoader(SleepDataset(64, sleep_s=0.02), batch_size=4, shuffle=True)
    torch.manual_seed(3)
    state = torch.random.get_rng_state()
    start = time.perf_counter()
    plan = tune_dataloader(loader, max_workers=8, time_budget_s=1.0)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0 + 2.0  # one batch past the deadline, then worker shutdown
    assert plan.elapsed_s <= elapsed and plan.budget.time_budget_s == 1.0
    assert "the time budget ended the search" in plan.reason, str(plan)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_consumption_target_is_reached_with_the_fewest_workers() -> None:
    # Under 500 samples/s per worker (8 sleeps of 2 ms a batch; ~470 measured); the device
    # takes 440/s, so the target is 550/s: 1 worker can never reach it, 2 (~900/s) are 60 %
    # over it, room for a busy neighbour during their one measurement.
    loader = DataLoader(SleepDataset(256, sleep_s=0.002), batch_size=8)
    plan = tune_dataloader(loader, consumption_rate=440.0, max_workers=6, time_budget_s=5)
    assert plan.target_met is True and plan.shortfall is None, str(plan)
    assert plan.diagnosis_kind is None
    assert plan.num_workers == 2 and plan.samples_per_s >= 550, str(plan)
    assert "2 workers reach 1.25x the consumption rate" in plan.reason


def test_shortfall_gives_a_data_pipeline_recommendation() -> None:
    loader = DataLoader(SleepDataset(128, sleep_s=0.002), batch_size=8)
    plan = tune_dataloader(loader, consumption_rate=50_000.0, max_workers=2, time_budget_s=3)
    assert plan.target_met is False and plan.diagnosis_kind == "data_pipeline"
    assert plan.shortfall is not None and plan.shortfall > 0.9
    assert re.search(r"is \d+% short of the 50,000 samples/s the device consumes", plan.reason)
    assert plan.recommendations[0].startswith("num_workers: more than 2 would still help")
    # Features, not images, and no files: pre-encoding, with the bytes and the sample's time.
    assert plan.recommendations[1].startswith("data path: pre-encode (the best loader gives")
    assert "batches are not float images" in plan.recommendations[1]
    assert plan.data_path is not None and plan.data_path.path == "pre_encode"
    per_sample = plan.data_path.facts.per_sample_s
    assert per_sample is not None and per_sample >= 0.002  # the dataset sleeps 2 ms a sample
    assert not any("device='cuda'" in r for r in plan.recommendations)  # no GPU here
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["data_path"]["path"] == "pre_encode"
    assert data["diagnosis_kind"] == "data_pipeline" and data["target_rate"] == 62_500.0
    assert data["changes"][:2] == [
        "num_workers: 0 -> 2",
        f"prefetch_factor: None -> {plan.prefetch_factor}",  # 4 only if it gained >= 5 %
    ]
    text = str(plan)
    assert "diagnosis: data_pipeline" in text and "workers prefetch" in text


def test_invalid_arguments_name_the_argument_and_the_fix() -> None:
    loader = DataLoader(list(range(4)))
    with pytest.raises(ValueError, match=r"`time_budget_s` must be > 0, got -1; e.g. pass 15"):
        tune_dataloader(loader, time_budget_s=-1)
    with pytest.raises(ValueError, match=r"`consumption_rate` must be > 0 samples/s or None"):
        tune_dataloader(loader, consumption_rate=0)
    with pytest.raises(ValueError, match=r"`loader` must be a torch DataLoader, got list"):
        tune_dataloader([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`loader` yielded no batch"):
        tune_dataloader(DataLoader([]), max_workers=0)


@RunIf(min_cuda_gpus=1)
def test_gpu_host_pins_memory_in_every_candidate() -> None:
    loader = DataLoader(SleepDataset(512, sleep_s=0.001), batch_size=16)
    plan = tune_dataloader(loader, consumption_rate=2_000.0, time_budget_s=5)
    assert plan.pin_memory is True and all(c.pin_memory for c in plan.candidates)
    assert plan.budget.cpu_workers >= 1 and plan.num_workers >= 1, str(plan)
