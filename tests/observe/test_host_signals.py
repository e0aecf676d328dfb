"""Host overhead from constructed windows: GC pauses, a busy GPU host, per-step syncs."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_maxtp.knobs.advisor import diagnose
from lightning_maxtp.observe import JobContext, SamplerSeries
from lightning_maxtp.observe.diagnosis import BottleneckKind
from lightning_maxtp.observe.gc_pauses import GcSummary
from lightning_maxtp.observe.sampler import NvmlSource, build_series
from lightning_maxtp.observe.syncs import SyncCount
from tests.helpers.fake_nvml import FakeGpu, FakeNvml
from tests.observe.test_diagnosis import H200, gpu, window


def _gc(share: float, count: int = 400, gen2: int = 1) -> GcSummary:
    return GcSummary(count, share, 0.2, gen2, share, slow_steps=1)


def test_collections_over_five_percent_of_the_step_name_host_overhead_and_the_gc_knob() -> None:
    # A CPU job: 40 % of its step in the collector, more than its compute findings.
    w = dataclasses.replace(window(100, 0, context=JobContext(num_workers=0)), gc=_gc(0.4))
    top = diagnose(w)[0]
    assert top.kind is BottleneckKind.HOST_OVERHEAD and top.confidence > 0.9
    assert "garbage collection takes 40% of step time" in top.summary
    assert "1 slow step(s) ran during a full one" in top.summary
    assert top.evidence["gc_share"] == 0.4 and top.evidence["gc_full_collections"] == 1
    assert [r.knob for r in top.recommendations] == ["gc"] and top.recommendations[0].auto_apply
    # On: no knob left to offer, the share is still reported.
    tuned = dataclasses.replace(w, context=JobContext(num_workers=0, gc_tuned=True))
    top = diagnose(tuned)[0]
    assert top.kind is BottleneckKind.HOST_OVERHEAD and not top.recommendations


def test_collections_under_five_percent_are_not_a_finding() -> None:
    w = dataclasses.replace(window(100, 0, context=JobContext(num_workers=0)), gc=_gc(0.04))
    assert BottleneckKind.HOST_OVERHEAD not in {d.kind for d in diagnose(w)}


def test_a_busy_gpu_host_says_who_uses_its_cpus() -> None:
    # 16 CPUs 60 % busy: this job's process 1.5 cores and its workers 2.5, others 5.6 cores.
    ctx = dataclasses.replace(H200, host_cpus=16, num_workers=2)
    sampler = gpu(95, system_cpu_percent=(60.0,) * 5, main_cpu_percent=(150.0,) * 5,
                  worker_cpu_percent=(250.0,) * 5, num_worker_processes=2)  # fmt: skip
    found = {d.kind: d for d in diagnose(window(100, 0, sampler=sampler, context=ctx))}
    host = found[BottleneckKind.HOST_OVERHEAD]
    assert host.evidence == {
        "host_cpu_percent": 60.0, "host_cores_this_process": 4.0, "host_cores_other_processes": 5.6,
    }  # fmt: skip
    assert "mostly other processes" in host.summary and host.confidence < 0.5
    assert diagnose(window(100, 0, sampler=sampler, context=ctx))[0].kind is BottleneckKind.COMPUTE
    # An idle host: nothing said.
    quiet = dataclasses.replace(sampler, system_cpu_percent=(20.0,) * 5)
    kinds = {d.kind for d in diagnose(window(100, 0, sampler=quiet, context=ctx))}
    assert BottleneckKind.HOST_OVERHEAD not in kinds


def test_counted_syncs_name_their_source_lines() -> None:
    syncs = SyncCount(3, 12, (("train.py:42", 9), ("train.py:57", 3)))
    sampler = gpu(30, main_cpu_percent=(40.0,) * 5)
    w = dataclasses.replace(window(100, 0, sampler=sampler, context=H200), syncs=syncs)
    found = {d.kind: d for d in diagnose(w)}
    host = found[BottleneckKind.HOST_OVERHEAD]
    assert host.evidence["syncs_per_step"] == 4.0
    rec = next(r for r in host.recommendations if r.knob == "syncs per step")
    assert rec.current == 4.0 and "at train.py:42, train.py:57" in rec.reason
    assert str(syncs) == "4.0 device syncs/step from train.py:42 (9), train.py:57 (3)"


def test_energy_per_sample_from_the_mean_power() -> None:
    # 300 W over a 1 s window of 320 samples: 0.9375 J per sample.
    w = window(100, 0, steps=10, sampler=SamplerSeries(power_w=300.0))
    assert w.joules_per_sample == pytest.approx(300.0 * 1.0 / 320)
    assert window(100, 0).joules_per_sample is None
    assert w.to_dict()["joules_per_sample"] == w.joules_per_sample


def test_the_nvml_energy_counter_gives_the_mean_power_and_a_device_without_one_none() -> None:
    # 600 J over 2 s between the first and the last reading: 300 W.
    source = NvmlSource(nvml=FakeNvml([FakeGpu(energy_mj=[1_000_000, 1_300_000, 1_600_000])]))
    readings = [(t, source.read()) for t in (0.0, 1.0, 2.0)]
    assert build_series(readings).power_w == pytest.approx(300.0)
    bare = NvmlSource(nvml=FakeNvml([FakeGpu()]))
    readings = [(t, bare.read()) for t in (0.0, 1.0)]
    assert build_series(readings).power_w is None and "energy_mj" not in readings[-1][1]
