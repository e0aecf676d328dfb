"""Worker planning of ``BatchInferencePool``: GPUs from the probe, workers from memory, CPUs."""

from __future__ import annotations

import dataclasses
import logging
import os

import pytest

from lightning_maxtp.inference import InferencePlan
from lightning_maxtp.inference.plan import plan_workers
from lightning_maxtp.resources import CpuInfo, Resources, inspect_resources
from tests.helpers.fake_nvml import GIB, FakeGpu, FakeNvml
from tests.helpers.foreign import foreign_pid


def machine(gpus: list[FakeGpu], cores: int = 16) -> Resources:
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    res = inspect_resources(nvml=FakeNvml(gpus))
    cpu = CpuInfo(logical=cores, physical=cores, usable=cores, cgroup_quota=None)
    return dataclasses.replace(res, cpu=cpu)


def uuid(n: int) -> str:
    return f"GPU-{n:08x}-aaaa-bbbb-cccc-dddddddddddd"


def test_busy_gpu_is_skipped_and_workers_follow_free_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    res = machine([
        FakeGpu(uuid=uuid(0)),  # 139.5 GiB free
        FakeGpu(uuid=uuid(1), used_gib=30, processes=[(foreign_pid(), 30 * GIB)]),
        FakeGpu(uuid=uuid(2), total_gib=24, used_gib=0.5),  # 23.5 GiB free
    ])  # fmt: skip
    plan = plan_workers(res, model_bytes=10 * GIB)
    # (139.5 - 2.5) // 10 = 13 capped at 4; (23.5 - 2.5) // 10 = 2; GPU 1 runs a foreign process.
    assert [w.device for w in plan.workers] == ["cuda:0"] * 4 + ["cuda:2"] * 2
    assert [w.cuda_visible_devices for w in plan.workers] == ["0"] * 4 + ["2"] * 2
    assert [i for i, _ in plan.skipped_gpus] == [1]
    assert "foreign process" in plan.skipped_gpus[0][1]
    # 16 cores - 6 GPU workers = 10 left: one I/O thread each, 1 torch thread.
    assert {(w.io_threads, w.torch_threads) for w in plan.workers} == {(1, 1)}
    assert "skipped cuda:1" in str(plan) and "cuda:0: 4 worker(s)" in str(plan)


def test_gpu_too_small_for_one_copy_is_skipped_not_used() -> None:
    res = machine([FakeGpu(uuid=uuid(0)), FakeGpu(uuid=uuid(1), total_gib=9, used_gib=0.3)])
    plan = plan_workers(res, model_bytes=7 * GIB, io_threads=3)
    assert plan.devices == ("cuda:0",) and len(plan.workers) == 4
    assert plan.skipped_gpus == ((1, "8.7 GiB free < 7.0 GiB per worker + 2.5 GiB headroom"),)
    assert {w.io_threads for w in plan.workers} == {3}


def test_one_worker_per_gpu_without_model_size_gets_the_cpu_budget() -> None:
    res = machine([FakeGpu(uuid=uuid(0))], cores=16)
    (worker,) = plan_workers(res).workers
    assert (worker.device, worker.io_threads, worker.torch_threads) == ("cuda:0", 15, 3)


def test_cpu_fallback_never_oversubscribes() -> None:
    for cores, expected in [(2, (2, 1)), (16, (8, 2)), (6, (6, 1)), (12, (6, 2)), (11, (5, 2))]:
        plan = plan_workers(machine([], cores=cores))
        processes, threads = len(plan.workers), plan.workers[0].torch_threads
        assert (processes, threads) == expected
        assert processes * threads <= cores
        assert {w.cuda_visible_devices for w in plan.workers} == {""}  # CUDA hidden on the CPU
    plan = plan_workers(machine([], cores=8), workers_per_device=3)
    assert [w.torch_threads for w in plan.workers] == [2, 2, 2]


def test_all_gpus_busy_falls_back_to_cpu_under_auto_but_not_under_cuda() -> None:
    res = machine([FakeGpu(uuid=uuid(0), used_gib=30, processes=[(foreign_pid(), 30 * GIB)])])
    plan = plan_workers(res)
    assert plan.devices == ("cpu",) and plan.notes[0] == "no usable GPU: running on the CPU"
    with pytest.raises(ValueError, match=r"`devices='cuda'` left no usable GPU .* devices='cpu'"):
        plan_workers(res, devices="cuda")
    assert plan_workers(res, devices=[0]).devices == ("cuda:0",)  # explicit wins over the probe


def test_bad_arguments_name_the_argument_and_the_fix() -> None:
    res = machine([FakeGpu(uuid=uuid(0))])
    with pytest.raises(ValueError, match=r"names GPU\(s\) \[3\] but the probe found \[0\]"):
        plan_workers(res, devices=[3])
    with pytest.raises(ValueError, match=r"`devices` must be 'auto', 'cpu', .* got 'tpu'"):
        plan_workers(res, devices="tpu")
    with pytest.raises(ValueError, match=r"`workers_per_device` must be 'auto' or an int >= 1"):
        plan_workers(res, workers_per_device=0)


def test_plan_to_dict_is_json_safe() -> None:
    plan = plan_workers(machine([FakeGpu(uuid=uuid(0))]), workers_per_device=2)
    data = plan.to_dict()
    assert isinstance(plan, InferencePlan)
    assert [w["device"] for w in data["workers"]] == ["cuda:0", "cuda:0"]
    assert data["skipped_gpus"] == []


@pytest.mark.parametrize(
    ("parent", "children"),
    [("3,5", ["3", "5"]), (f"{uuid(4)},{uuid(1)}", [uuid(4), uuid(1)]), (None, ["0", "1"])],
)
def test_each_worker_is_given_the_gpu_the_parent_sees_at_its_ordinal(
    monkeypatch: pytest.MonkeyPatch, parent: str | None, children: list[str]
) -> None:
    # A child's CUDA_VISIBLE_DEVICES names a GPU the machine's way, not by the parent's ordinal:
    # under the parent's "3,5" its cuda:1 is GPU 5, and "1" would open another job's GPU.
    gpus = [FakeGpu(uuid=uuid(n)) for n in range(6 if parent is not None else 2)]
    if parent is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", parent)
    res = dataclasses.replace(
        inspect_resources(nvml=FakeNvml(gpus)),
        cpu=CpuInfo(logical=16, physical=16, usable=16, cgroup_quota=None),
    )
    plan = plan_workers(res, workers_per_device=1)
    assert [w.device for w in plan.workers] == ["cuda:0", "cuda:1"]
    assert [w.cuda_visible_devices for w in plan.workers] == children


def test_a_pool_that_skips_a_busy_gpu_says_so_loudly(caplog: pytest.LogCaptureFixture) -> None:
    from lightning_maxtp.inference import BatchInferencePool
    from tests.helpers.inference_models import make_model

    res = machine([FakeGpu(uuid=uuid(0), used_gib=30, processes=[(foreign_pid(), 30 * GIB)])])
    with caplog.at_level(logging.WARNING, logger="lightning_maxtp"):
        pool = BatchInferencePool(make_model, resources=res)  # planned, not started
    assert pool.plan.devices == ("cpu",)
    (record,) = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "cuda:0 skipped (1 foreign process(es)" in record.getMessage()
    assert record.getMessage().endswith("the pool runs on the CPU")


def test_more_copies_on_the_same_cores_get_smaller_shares() -> None:
    from lightning_maxtp.inference.plan import cpu_split

    # 16 cores: one copy loads on 15 I/O threads with 3 torch threads; four copies share the
    # 12 cores their main threads leave (3 I/O threads each, 1 torch thread).
    assert cpu_split(16, 1) == (3, 15)
    assert cpu_split(16, 4) == (1, 3)
    assert cpu_split(16, 4, io_threads=6) == (1, 6)  # the caller's choice stands
    assert cpu_split(2, 8) == (1, 1)


def test_one_copys_memory_is_what_it_added_not_the_devices_whole_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The parent holds 10 GiB of models on the GPU; the copy adds 4 GiB (3 in its allocator).
    import torch

    from lightning_maxtp.inference.memory import CONTEXT_BYTES, copy_bytes

    total = 140 * GIB
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (total - 14 * GIB, total))
    assert copy_bytes("cuda:0", used_before=10 * GIB) == 4 * GIB + CONTEXT_BYTES
    # Without the reading before, only the allocator's own: never the whole device's use.
    assert copy_bytes("cuda:0") == 3 * GIB + CONTEXT_BYTES
