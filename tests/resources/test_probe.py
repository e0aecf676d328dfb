from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_maxtp.resources import gpus as _gpu_probe
from lightning_maxtp.resources.gpus import parse_visible_devices, probe_gpus
from lightning_maxtp.resources.host import (
    CpuInfo,
    probe_cpus,
    probe_memory,
    read_cgroup_cpu_quota,
    read_cgroup_memory,
)
from lightning_maxtp.resources.probe import (
    Resources,
    derive_advice,
    inspect_resources,
    workers_for_memory,
)
from tests.helpers.fake_nvml import GIB, FakeGpu, FakeNvml, NVMLError, NVMLError_NotSupported
from tests.helpers.foreign import foreign_pid
from tests.helpers.runif import RunIf

HOST_PID = 4_190_000  # above any pid this machine hands out: a host's pid seen from a container


def uuid(n: int) -> str:
    return f"GPU-{n:08x}-aaaa-bbbb-cccc-dddddddddddd"


def four_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(uuid=uuid(0)),
        FakeGpu(uuid=uuid(1), used_gib=30, processes=[(foreign_pid(), 30 * GIB)]),
        FakeGpu(uuid=uuid(2), used_gib=0.6, util=None, mig=None, processes=[(os.getpid(), None)]),
        FakeGpu(uuid=uuid(3), used_gib=60, util=97),
    ]


# --- the real machine ------------------------------------------------------------------------


def test_real_probe_is_consistent(tmp_path: Path) -> None:
    res = inspect_resources(tmp_path)
    cpu, mem = res.cpu, res.memory
    assert cpu.logical is not None and cpu.logical >= 1
    assert cpu.usable is None or 1 <= cpu.usable <= cpu.logical
    assert cpu.physical is None or 1 <= cpu.physical <= cpu.logical
    assert 1 <= cpu.effective <= cpu.logical
    assert mem.total_bytes and mem.available_bytes is not None
    assert 0 < mem.available_bytes <= mem.total_bytes
    eff = mem.effective_available_bytes
    assert eff is not None and eff <= mem.available_bytes
    assert mem.disk_path == str(tmp_path.resolve())
    assert mem.disk_free_bytes is not None and mem.disk_total_bytes is not None
    assert 0 < mem.disk_free_bytes <= mem.disk_total_bytes
    if mem.shm_total_bytes is not None:
        assert mem.shm_free_bytes is not None and mem.shm_free_bytes <= mem.shm_total_bytes
    assert res.versions.torch == importlib.metadata.version("torch")
    assert res.versions.lightning == importlib.metadata.version("lightning")
    assert res.advice.device_processes >= 1
    if not res.advice.free_gpus:  # one device process on the CPU: all cores but its own
        assert res.advice.cpu_workers_per_process == cpu.effective - 1
    json.dumps(res.to_dict())  # JSON-safe


def test_torch_cuda_version_read_without_import() -> None:
    import torch

    assert inspect_resources().versions.torch_cuda == torch.version.cuda


@RunIf(linux_only=True)
def test_no_gpu_here_gives_notes_not_errors() -> None:
    res = inspect_resources()
    if res.gpus:
        pytest.skip("this machine has GPUs")
    assert res.gpu_backend == "none"
    assert res.advice.free_gpus == ()
    assert any("NVML not available" in n for n in res.notes)


# --- the GPU path, with a fake NVML at the boundary -------------------------------------------


def test_fake_nvml_several_gpus_one_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNvml(four_gpus())
    res = inspect_resources(nvml=nvml)
    assert nvml.shutdowns == 1 and not nvml.initialised
    assert res.gpu_backend == "nvml"
    assert res.versions.driver == "580.65.06" and res.versions.cuda_driver == "13.0"
    assert [g.name for g in res.gpus] == ["NVIDIA H200"] * 4
    g0, g1, g2, g3 = res.gpus
    assert g0.memory_total_bytes == 140 * GIB and g0.memory_free_bytes == int(139.5 * GIB)
    assert g0.compute_capability == "9.0" and g0.mig_enabled is False
    assert g1.foreign_processes[0].pid == foreign_pid()
    assert g1.foreign_processes[0].used_memory_bytes == 30 * GIB
    # Our own process on GPU 2 is not foreign; unsupported fields become notes, not errors.
    assert g2.processes is not None and g2.processes[0].own and g2.foreign_processes == ()
    assert g2.utilization_percent is None and g2.mig_enabled is None
    assert "utilization: NVMLError_NotSupported: Not Supported" in g2.notes
    assert "MIG mode: NVMLError_NotSupported: Not Supported" in g2.notes
    assert g3.utilization_percent == 97

    assert res.advice.free_gpus == (0, 2)
    busy = {b.index: b.reason for b in res.advice.busy_gpus}
    assert set(busy) == {1, 3}
    assert busy[1].startswith(f"1 foreign process(es): pid {foreign_pid()}")
    assert "30.0 GiB" in busy[1]
    assert "60.0 GiB of 140.0 GiB in use (43%)" in busy[3]

    # The seeds' rule on free GPUs only: (free - 2.5 GiB headroom) // model size.
    assert res.workers_per_gpu(10 * GIB) == {0: 13, 2: 13}
    assert res.workers_per_gpu(10 * GIB, headroom_bytes=30 * GIB, max_workers=4) == {0: 4, 2: 4}
    data = json.loads(json.dumps(res.to_dict()))
    assert data["advice"]["free_gpus"] == [0, 2]
    assert data["gpus"][1]["foreign_process_count"] == 1


def test_memory_held_by_our_own_process_does_not_make_a_gpu_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [
        FakeGpu(uuid=uuid(0), used_gib=40.5, processes=[(os.getpid(), 40 * GIB)]),
        FakeGpu(uuid=uuid(1), used_gib=40.5, processes=[(os.getpid(), 10 * GIB)]),
    ]
    res = inspect_resources(nvml=FakeNvml(gpus))
    assert res.advice.free_gpus == (0,)
    (busy,) = res.advice.busy_gpus
    assert busy.index == 1 and busy.reason.startswith("30.5 GiB of 140.0 GiB in use (22%)")


def test_cpu_worker_budget_is_split_among_device_processes() -> None:
    gpus = tuple(inspect_resources(nvml=FakeNvml([FakeGpu(uuid=uuid(i)) for i in range(8)])).gpus)
    advice = derive_advice(CpuInfo(16, 8, 16, None), gpus)
    assert advice.device_processes == 8 and advice.cpu_workers_per_process == 1
    advice = derive_advice(CpuInfo(64, 32, 64, 16.0), gpus[:2])
    assert advice.device_processes == 2 and advice.cpu_workers_per_process == 7  # (16-2)//2
    assert derive_advice(CpuInfo(2, 2, 2, None), ()).cpu_workers_per_process == 1
    assert derive_advice(CpuInfo(4, 2, 1, None), ()).cpu_workers_per_process == 0


@pytest.mark.parametrize(
    ("env", "expected", "note"),
    [
        (None, [0, 1, 2, 3], None),
        ("2,0", [2, 0], None),
        (f"{uuid(3)},1", [3, 1], None),
        ("GPU-00000002", [2], None),  # a unique UUID prefix, as CUDA accepts
        ("", [], "set but empty"),
        ("0,foo,1", [0], "entry 'foo' is neither a GPU index nor a GPU UUID"),
        ("1,7", [1], "entry '7' is not a GPU index on this machine"),
        ("-1", [], "is negative"),
        ("1,1", [1], "lists the same GPU twice"),
        ("GPU-0000", [], "matches several GPU UUIDs"),
        ("MIG-1234", [], "MIG instance"),
    ],
)
def test_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, env: str | None, expected: list[int], note: str | None
) -> None:
    if env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    res = inspect_resources(nvml=FakeNvml(four_gpus()))
    assert [g.physical_index for g in res.gpus] == expected
    assert [g.index for g in res.gpus] == list(range(len(expected)))  # CUDA ordinals
    assert res.cuda_visible_devices == env
    if note is None:
        assert not any("CUDA_VISIBLE_DEVICES" in n for n in res.notes)
    else:
        (msg,) = [n for n in res.notes if "CUDA_VISIBLE_DEVICES" in n]
        assert note in msg
        if env:
            assert f"the visible GPUs are {expected}" in msg and "Fix:" in msg


def test_visible_devices_hides_busy_gpu_from_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    res = inspect_resources(nvml=FakeNvml(four_gpus()))
    assert res.advice.free_gpus == (1,)  # ordinal 1 is physical GPU 0
    assert [b.index for b in res.advice.busy_gpus] == [0]


def test_parse_visible_devices_is_pure() -> None:
    assert parse_visible_devices("0", [(0, None)]) == ([0], [])


def test_nvml_init_failure_falls_back_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gpu_probe, "has_gpu_driver", lambda: False)
    probe = probe_gpus(FakeNvml([], init_error=NVMLError("Driver Not Loaded")))
    assert probe.gpus == () and probe.backend == "none"
    assert probe.notes[0] == "NVML not available: NVMLError: Driver Not Loaded"
    assert "torch fallback skipped" in probe.notes[1]


def test_missing_pynvml_module_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    monkeypatch.setattr(_gpu_probe, "has_gpu_driver", lambda: False)
    probe = probe_gpus()
    assert "pynvml is not installed" in probe.notes[0]
    assert "pip install nvidia-ml-py" in probe.notes[0]


def test_torch_fallback_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(_gpu_probe, "has_gpu_driver", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    probe = probe_gpus(FakeNvml([], init_error=NVMLError_NotSupported()))
    assert probe.backend == "none"
    assert probe.notes[-1] == "torch.cuda.is_available() is False"


class _ShutdownFails(FakeNvml):
    def nvmlShutdown(self) -> None:
        super().nvmlShutdown()
        raise NVMLError("Uninitialized")


def test_a_failed_nvml_shutdown_is_a_note_and_keeps_the_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = _ShutdownFails([FakeGpu(uuid=uuid(0))])
    probe = probe_gpus(nvml)
    assert probe.backend == "nvml" and len(probe.gpus) == 1 and nvml.shutdowns == 1
    assert probe.notes[-1] == "NVML shutdown: NVMLError: Uninitialized"


class _CountBreaks(FakeNvml):
    def nvmlDeviceGetCount(self) -> int:
        raise TypeError("a bug, not an NVML error")


def test_an_error_nvml_does_not_raise_is_raised_not_a_torch_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only NVML's own errors (and OSError) mean "no NVML here"; a bug must not become a note.
    monkeypatch.setattr(_gpu_probe, "has_gpu_driver", lambda: False)
    nvml = _CountBreaks([FakeGpu(uuid=uuid(0))])
    with pytest.raises(TypeError, match="a bug, not an NVML error"):
        probe_gpus(nvml)
    assert nvml.shutdowns == 1  # NVML is shut down all the same
    no_library = FakeNvml([], init_error=OSError("libnvidia-ml.so.1: cannot open"))
    probe = probe_gpus(no_library)
    assert probe.notes[0] == "NVML not available: OSError: libnvidia-ml.so.1: cannot open"


@RunIf(min_cuda_gpus=1)
def test_real_gpu_probe_matches_torch() -> None:
    import torch

    res = inspect_resources()
    assert len(res.gpus) == torch.cuda.device_count()
    assert res.gpus[0].memory_total_bytes == pytest.approx(
        torch.cuda.get_device_properties(0).total_memory, rel=0.02
    )


# --- host side: cgroup files, /dev/shm, disk --------------------------------------------------


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limits(tmp_path: Path) -> None:
    write(tmp_path / "job.slice" / "cpu.max", "150000 100000\n")
    write(tmp_path / "job.slice" / "memory.max", str(4 * GIB))
    write(tmp_path / "job.slice" / "memory.current", str(1 * GIB))
    write(tmp_path / "cpu.max", "max 100000")  # the mount root: less specific, must lose
    proc = "0::/job.slice\n"
    assert read_cgroup_cpu_quota(tmp_path, proc) == (1.5, None)
    assert read_cgroup_memory(tmp_path, proc) == (4 * GIB, 1 * GIB, None)
    cpu = probe_cpus(tmp_path, proc)
    assert cpu.cgroup_quota == 1.5 and cpu.effective == 1
    mem = probe_memory(tmp_path, cgroup_root=tmp_path, proc_cgroup=proc)
    assert mem.cgroup_limit_bytes == 4 * GIB
    assert mem.effective_available_bytes == min(3 * GIB, mem.available_bytes or 0)


def test_cgroup_v2_unlimited(tmp_path: Path) -> None:
    write(tmp_path / "cpu.max", "max 100000")
    write(tmp_path / "memory.max", "max")
    assert read_cgroup_cpu_quota(tmp_path, "0::/\n") == (None, None)
    assert read_cgroup_memory(tmp_path, "0::/\n") == (None, None, None)


def test_cgroup_v1_limits_and_unlimited(tmp_path: Path) -> None:
    proc = "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n"
    write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "400000")
    write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000")
    write(tmp_path / "memory" / "memory.limit_in_bytes", "9223372036854771712")
    assert read_cgroup_cpu_quota(tmp_path, proc) == (4.0, None)
    assert read_cgroup_memory(tmp_path, proc) == (None, None, None)
    write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "-1")
    assert read_cgroup_cpu_quota(tmp_path, proc) == (None, None)


def test_missing_or_garbled_cgroup_files_are_notes(tmp_path: Path) -> None:
    quota, note = read_cgroup_cpu_quota(tmp_path / "nothing", "")
    assert quota is None and note is not None and "no cgroup CPU controller" in note
    write(tmp_path / "cpu.max", "lots 100000")
    assert read_cgroup_cpu_quota(tmp_path, "0::/")[1] == "cgroup cpu.max unreadable: 'lots 100000'"
    cpu = probe_cpus(tmp_path / "nothing", "")
    assert any("no cgroup CPU controller" in n for n in cpu.notes)


def test_unreadable_shm_and_disk_are_notes(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    mem = probe_memory(missing, shm_path=str(missing / "shm"))
    assert mem.shm_total_bytes is None and mem.disk_free_bytes is None
    assert any("shm" in n and "DataLoader workers need it" in n for n in mem.notes)
    assert any(n.startswith(f"disk at {missing}") for n in mem.notes)


# --- advice arithmetic and the readable form --------------------------------------------------


def test_workers_for_memory_rule_and_errors() -> None:
    assert workers_for_memory(80 * GIB, 10 * GIB) == 7  # (80 - 2.5) // 10
    assert workers_for_memory(2 * GIB, 1 * GIB) == 0
    assert workers_for_memory(None, 1 * GIB) == 0
    with pytest.raises(ValueError, match=r"`model_bytes` must be a positive number.*got 0"):
        workers_for_memory(80 * GIB, 0)
    with pytest.raises(ValueError, match=r"`headroom_bytes` must be >= 0, got -1"):
        workers_for_memory(80 * GIB, GIB, headroom_bytes=-1)
    with pytest.raises(ValueError, match=r"`max_workers` must be None or >= 1, got 0"):
        workers_for_memory(80 * GIB, GIB, max_workers=0)


def test_str_is_a_readable_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    res: Resources = inspect_resources(nvml=FakeNvml(four_gpus()))
    text = str(res)
    for word in ("machine", "cpu", "memory", "/dev/shm", "disk", "gpus      4 visible via nvml"):
        assert word in text
    assert "free GPUs: [0, 2]" in text
    assert "GPU 1 busy: 1 foreign process(es)" in text
    assert "GPU 2: utilization: NVMLError_NotSupported" in text


def test_the_worker_ceiling_is_every_core_with_gpus_and_twice_them_without() -> None:
    from lightning_maxtp.loader.budget import limits_from
    from lightning_maxtp.resources.probe import worker_ceiling, workers_per_process

    res = inspect_resources()
    cpu = SimpleNamespace(effective=16)  # what the rules read of a CpuInfo
    assert workers_per_process(cpu, 1) == 15  # the H200 reference host: 15 workers to start
    assert worker_ceiling(cpu, 1, has_gpus=True) == 16
    assert worker_ceiling(cpu, 1, has_gpus=False) == 32
    assert (
        worker_ceiling(cpu, 4, has_gpus=True) == 4 and worker_ceiling(cpu, 4, has_gpus=False) == 8
    )
    one = SimpleNamespace(effective=1)
    assert workers_per_process(one, 1) == 0 and worker_ceiling(one, 1, has_gpus=False) == 2
    machine = dataclasses.replace(res, cpu=cpu, gpus=())
    free = limits_from(machine, max_workers=None, local_world_size=2, memory_budget_bytes=None)
    assert (free.cpu_workers, free.ceiling_workers, free.ranks) == (7, 16, 2)
    capped = limits_from(machine, max_workers=3, local_world_size=2, memory_budget_bytes=None)
    assert (capped.cpu_workers, capped.ceiling_workers) == (3, None)  # a hard cap, never passed


def test_gpus_seen_from_a_container_are_judged_by_memory_not_by_unmatched_pids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # In a container NVML lists host PIDs: this job's own process is one of them and matches
    # nothing here. It is neither ours nor foreign by its pid; the memory in use decides.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    res = inspect_resources(nvml=FakeNvml([
        FakeGpu(uuid=uuid(0), used_gib=2.5, processes=[(HOST_PID, 2 * GIB)]),
        FakeGpu(uuid=uuid(1), used_gib=40.5, processes=[(HOST_PID + 1, 40 * GIB)]),
    ]))  # fmt: skip
    g0, g1 = res.gpus
    assert g0.foreign_processes == () and [p.pid for p in g0.unseen_processes] == [HOST_PID]
    assert not g0.unseen_processes[0].own
    assert res.advice.free_gpus == (0,)
    (busy,) = res.advice.busy_gpus
    assert busy.index == 1
    assert "40.5 GiB of 140.0 GiB in use (29%) by pid(s) 4190001 that name no" in busy.reason
    assert "pass the GPUs explicitly" in busy.reason
    # What this process's torch holds there is its own: with the 40 GiB in its allocator the
    # GPU is free again.
    mine = dataclasses.replace(g1, torch_reserved_bytes=40 * GIB)
    assert derive_advice(res.cpu, (g0, mine)).free_gpus == (0, 1)
