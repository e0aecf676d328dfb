"""The pure placement planner of ``maxtp pack``, table-driven on a fake 8-GPU inventory."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_maxtp.pack import JobSpec, plan_pack
from lightning_maxtp.pack.placement import (
    Capacity,
    Demand,
    GpuSlot,
    Placement,
    assign,
    capacity_from_resources,
    resolve_demands,
)
from lightning_maxtp.resources import CpuInfo
from lightning_maxtp.resources.probe import Resources, derive_advice, inspect_resources
from tests.helpers.fake_nvml import GIB, FakeGpu, FakeNvml
from tests.helpers.foreign import foreign_pid

BUSY = 3
FREE = (0, 1, 2, 4, 5, 6, 7)


@pytest.fixture
def eight_gpus(monkeypatch: pytest.MonkeyPatch) -> Resources:
    """8 GPUs with 40 GiB free each (37.5 GiB usable after the 2.5 GiB headroom); GPU 3 busy."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [
        FakeGpu(uuid=f"GPU-{i:08x}", total_gib=40.5, used_gib=0.5)
        if i != BUSY
        else FakeGpu(uuid=f"GPU-{i:08x}", total_gib=40.5, used_gib=10.5,
                     processes=[(foreign_pid(), 10 * GIB)])
        for i in range(8)
    ]  # fmt: skip
    res = inspect_resources(nvml=FakeNvml(gpus))
    cpu = CpuInfo(logical=16, physical=8, usable=16, cgroup_quota=None)
    return dataclasses.replace(res, cpu=cpu, cuda_visible_devices=None)


def jobs_of(gib: list[float | None]) -> list[JobSpec]:
    return [JobSpec(f"train {i}", name=f"j{i}", gpu_memory_gib=g) for i, g in enumerate(gib)]


@pytest.mark.parametrize(
    ("gib", "max_parallel", "starts", "waits"),
    [
        pytest.param(
            [10.0] * 9, None,
            {"j0": 0, "j1": 1, "j2": 2, "j3": 4, "j4": 5, "j5": 6, "j6": 7, "j7": 0, "j8": 1},
            {}, id="one-per-gpu-first-then-co-located",
        ),
        pytest.param(
            [30.0] * 7 + [5.0, 5.0, 10.0, 8.0], None,
            {"j0": 0, "j1": 1, "j2": 2, "j3": 4, "j4": 5, "j5": 6, "j6": 7, "j7": 0, "j8": 1},
            {"j9": "needs 10.0 GiB GPU memory, at most 7.5 GiB left on a GPU",
             "j10": "needs 8.0 GiB GPU memory, at most 7.5 GiB left on a GPU"},
            id="mixed-small-jobs-fill-gaps-large-wait",
        ),
        pytest.param(
            [None] * 8 + [1.0], None,
            {"j0": 0, "j1": 1, "j2": 2, "j3": 4, "j4": 5, "j5": 6, "j6": 7},
            {"j7": "needs a whole GPU; every free GPU has jobs on it",
             "j8": "every free GPU is held by a job that needs it whole"},
            id="undeclared-memory-gets-a-whole-gpu",
        ),
        pytest.param(
            [20.0, 20.0, 37.5], 2, {"j0": 0, "j1": 1},
            {"j2": "2 jobs running, the most allowed (max_parallel)"}, id="max-parallel",
        ),
        pytest.param(
            [37.5, 18.0, 18.0, 18.0, 18.0, 18.0, 18.0, 18.0, 18.0, 18.0, 18.0, 18.0, 18.0, 1.5],
            None,
            {"j0": 0, "j1": 1, "j2": 2, "j3": 4, "j4": 5, "j5": 6, "j6": 7, "j7": 1, "j8": 2,
             "j9": 4, "j10": 5, "j11": 6, "j12": 7, "j13": 1},
            {}, id="exact-fit-and-backfill",
        ),
    ],
)  # fmt: skip
def test_first_round_placement(
    eight_gpus: Resources,
    gib: list[float | None],
    max_parallel: int | None,
    starts: dict[str, int],
    waits: dict[str, str],
) -> None:
    plan = plan_pack(jobs_of(gib), resources=eight_gpus, max_parallel=max_parallel)
    assert {p.demand.name: p.gpu.index for p in plan.first.starts if p.gpu} == starts
    assert {w.name: w.reason for w in plan.first.waits} == waits
    assert all(p.gpu is not None and p.gpu.index != BUSY for p in plan.first.starts)
    assert [b.index for b in plan.capacity.skipped_gpus] == [BUSY]


def test_env_sets_the_gpu_and_a_fair_thread_share(eight_gpus: Resources) -> None:
    plan = plan_pack(jobs_of([10.0] * 4), resources=eight_gpus)
    envs = [p.env() for p in plan.first.starts]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2", "4"]
    # 16 CPUs shared by the 4 jobs that run at once
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"4"}
    assert {e["MKL_NUM_THREADS"] for e in envs} == {"4"}


def test_visible_devices_of_the_parent_are_translated(eight_gpus: Resources) -> None:
    res = dataclasses.replace(
        eight_gpus, cuda_visible_devices=",".join(f"{i + 8}" for i in range(8))
    )
    plan = plan_pack(jobs_of([10.0, 10.0]), resources=res)
    assert [p.env()["CUDA_VISIBLE_DEVICES"] for p in plan.first.starts] == ["8", "9"]


def test_job_larger_than_any_gpu_is_rejected_with_the_numbers(eight_gpus: Resources) -> None:
    jobs = [
        JobSpec("a", name="small", gpu_memory_gib=1),
        JobSpec("b", name="huge", gpu_memory_gib=38),
    ]
    with pytest.raises(
        ValueError,
        match=r"job 'huge': `gpu_memory_gib` = 38 is more than any free "
        r"GPU offers \(largest: GPU 0, 40.0 GiB free - 2.5 GiB headroom = 37.5 GiB\)",
    ):
        plan_pack(jobs, resources=eight_gpus)


def test_all_gpus_busy_is_an_error_that_names_them(eight_gpus: Resources) -> None:
    gpus = tuple(dataclasses.replace(g, processes=eight_gpus.gpus[BUSY].processes)
                 for g in eight_gpus.gpus)  # fmt: skip
    res = dataclasses.replace(eight_gpus, gpus=gpus, advice=derive_advice(eight_gpus.cpu, gpus))
    with pytest.raises(ValueError, match=r"no free GPU to pack jobs on \(GPU 0: 1 foreign"):
        plan_pack(jobs_of([1.0]), resources=res)


def cpu_capacity(threads: int, ram_gib: float | None = None) -> Capacity:
    ram = int(ram_gib * GIB) if ram_gib is not None else None
    return Capacity(gpus=(), skipped_gpus=(), cpu_threads=threads, ram_bytes=ram)


def test_cpu_only_jobs_share_the_thread_budget() -> None:
    cap = cpu_capacity(4)
    jobs = [JobSpec(f"c{i}", name=f"c{i}") for i in range(6)]
    demands = resolve_demands(jobs, cap)
    assert [d.threads for d in demands] == [1] * 6
    step = assign(demands, cap, ())
    assert [p.demand.name for p in step.starts] == ["c0", "c1", "c2", "c3"]
    assert [p.env()["CUDA_VISIBLE_DEVICES"] for p in step.starts] == [""] * 4
    assert [(w.name, w.reason) for w in step.waits] == [
        ("c4", "needs 1 CPU thread(s), 0 of 4 left"),
        ("c5", "needs 1 CPU thread(s), 0 of 4 left"),
    ]
    # fewer jobs than CPUs: each gets a bigger share
    assert [d.threads for d in resolve_demands(jobs[:2], cap)] == [2, 2]


def test_declared_threads_and_gpu_memory_on_a_cpu_host() -> None:
    cap = cpu_capacity(4)
    jobs = [
        JobSpec("a", name="a", cpu_threads=3, gpu_memory_gib=80),
        JobSpec("b", name="b"),
        JobSpec("c", name="c", cpu_threads=2),
        JobSpec("d", name="d", cpu_threads=9),
    ]
    demands = resolve_demands(jobs, cap)
    assert [(d.threads, d.gpu_bytes) for d in demands] == [
        (3, None),
        (1, None),
        (2, None),
        (9, None),
    ]
    step = assign(demands, cap, ())
    assert [p.demand.name for p in step.starts] == ["a", "b"]
    # a job wanting more threads than the machine has still runs, alone
    assert [p.demand.name for p in assign(demands[3:], cap, ()).starts] == ["d"]


def test_ram_budget_holds_back_jobs() -> None:
    cap = cpu_capacity(8, ram_gib=10)
    jobs = [JobSpec(f"m{i}", name=f"m{i}", memory_gib=4) for i in range(3)]
    step = assign(resolve_demands(jobs, cap), cap, ())
    assert [p.demand.name for p in step.starts] == ["m0", "m1"]
    assert [w.reason for w in step.waits] == ["needs 4.0 GiB RAM, 2.0 GiB of the budget left"]
    with pytest.raises(ValueError, match=r"`memory_gib` = 11 is more than the 10.0 GiB of RAM"):
        resolve_demands([JobSpec("x", name="x", memory_gib=11)], cap)


def test_running_jobs_shape_the_next_round() -> None:
    gpu0, gpu1 = GpuSlot(0, "0", "H200", 30 * GIB), GpuSlot(1, "1", "H200", 30 * GIB)
    cap = Capacity(gpus=(gpu0, gpu1), skipped_gpus=(), cpu_threads=8, ram_bytes=None)
    small = Demand(0, "small", 10 * GIB, threads=1, ram_bytes=0)
    whole = Demand(1, "whole", None, threads=1, ram_bytes=0)
    retry = Demand(2, "retry", 10 * GIB, threads=1, ram_bytes=0, alone=True)
    running = [Placement(small, gpu0)]
    step = assign([whole, retry], cap, running)
    # the whole-GPU job takes the empty GPU; the OOM retry must then wait for a GPU to itself
    assert [(p.demand.name, p.gpu.index if p.gpu else None) for p in step.starts] == [("whole", 1)]
    assert [w.reason for w in step.waits] == [
        "needs its GPU alone (OOM retry); every free GPU has jobs on it"
    ]
    later = dataclasses.replace(small, job=3, name="later")
    step = assign([later], cap, [Placement(retry, gpu0), Placement(whole, gpu1)])
    assert [w.reason for w in step.waits] == ["every free GPU is held by a job that needs it whole"]


def test_max_parallel_above_the_cpu_count_oversubscribes() -> None:
    cpu = CpuInfo(logical=2, physical=2, usable=2, cgroup_quota=None)
    res = inspect_resources(nvml=FakeNvml([]))
    res = dataclasses.replace(res, cpu=cpu, gpus=(), advice=derive_advice(cpu, ()))
    cap = capacity_from_resources(res, max_parallel=6)
    jobs = [JobSpec(f"io{i}", name=f"io{i}") for i in range(8)]
    step = assign(resolve_demands(jobs, cap), cap, ())
    assert len(step.starts) == 6 and {p.demand.threads for p in step.starts} == {1}
    assert capacity_from_resources(res, max_parallel=1).cpu_threads == 2


def test_capacity_rejects_bad_knobs(eight_gpus: Resources) -> None:
    with pytest.raises(ValueError, match="`max_parallel` must be None or >= 1, got 0"):
        capacity_from_resources(eight_gpus, max_parallel=0)
    with pytest.raises(ValueError, match="`headroom_bytes` must be >= 0, got -1"):
        capacity_from_resources(eight_gpus, headroom_bytes=-1)


def test_plan_table_and_dict(eight_gpus: Resources) -> None:
    plan = plan_pack(jobs_of([30.0] * 8), resources=eight_gpus)
    text = str(plan)
    assert text.splitlines()[0].startswith("pack plan: 8 jobs on GPU 0 (37.5 GiB usable)")
    assert "skipped GPU 3: 1 foreign process(es)" in text
    assert "waits: needs 30.0 GiB GPU memory, at most 7.5 GiB left on a GPU" in text
    data = plan.to_dict()
    assert [s["gpu"] for s in data["starts"]] == list(FREE)
    assert data["waits"] == [
        {"job": "j7", "reason": "needs 30.0 GiB GPU memory, at most 7.5 GiB left on a GPU"}
    ]
