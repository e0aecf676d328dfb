"""Every bottleneck kind from constructed windows: the rules, their evidence, their knobs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_maxtp.knobs.advisor import diagnose
from lightning_maxtp.observe import CaptureSummary, JobContext, SamplerSeries, Window
from lightning_maxtp.observe.data_path import DataFacts
from lightning_maxtp.observe.diagnosis import BottleneckKind, Diagnosis, needs_capture
from lightning_maxtp.observe.recommendation import Recommendation

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30
H200 = JobContext(
    device_type="cuda", gpu_name="NVIDIA H200", compute_capability="9.0",
    gpu_memory_total_bytes=140 * GIB, precision="32-true", batch_size=32, num_workers=2,
    prefetch_factor=2, pin_memory=False, persistent_workers=False, cpu_worker_budget=15,
)  # fmt: skip


def window(
    step_ms: float = 100.0,
    wait_ms: float = 0.0,
    *,
    steps: int = 10,
    batch: int = 32,
    wait_cpu: float | None = None,
    sampler: SamplerSeries | None = None,
    context: JobContext | None = None,
    capture: CaptureSummary | None = None,
) -> Window:
    return Window(
        step_time_s=(step_ms / 1e3,) * steps,
        data_wait_s=(wait_ms / 1e3,) * steps,
        samples=(batch,) * steps,
        wait_cpu_s=() if wait_cpu is None else (wait_cpu * wait_ms / 1e3,) * steps,
        compute_cpu_s=(1.0 * (step_ms - wait_ms) / 1e3,) * steps,
        sampler=sampler or SamplerSeries(),
        context=context or JobContext(),
        capture=capture,
    )


def gpu(util: float, used_gib: float = 15.0, **kw: object) -> SamplerSeries:
    return SamplerSeries(
        gpu_util_percent=(util,) * 5, gpu_memory_used_bytes=(int(used_gib * GIB),) * 5,
        gpu_memory_total_bytes=140 * GIB, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def kinds(found: list[Diagnosis]) -> list[str]:
    return [d.kind.value for d in found]


def test_kind_values_are_the_design_table() -> None:
    assert [k.value for k in BottleneckKind] == [
        "data_pipeline", "storage", "compute", "kernel_launch", "vram", "host_overhead",
        "under_occupied", "healthy",
    ]  # fmt: skip
    assert BottleneckKind("vram") is BottleneckKind.VRAM and str(BottleneckKind.VRAM) == "vram"


def test_fast_loader_in_the_main_process_is_named_serial_not_slow() -> None:
    # 0 workers: 30 ms of each 100 ms step is loading: alone the loader gives 32/30 ms = 1067/s,
    # more than the device's 32/70 ms = 457/s, yet the step waits because the two run in series.
    ctx = JobContext(batch_size=32, num_workers=0, cpu_worker_budget=1, persistent_workers=False)
    top = diagnose(window(100, 30, wait_cpu=1.0, context=ctx))[0]
    assert top.kind is BottleneckKind.DATA_PIPELINE
    assert "must be" not in top.summary and "runs in series with the step" in top.summary
    rec = str(top.recommendations[0])
    assert rec.startswith("num_workers: 0 -> 1 (loading (1067/s alone) is fast enough")
    assert "a worker overlaps it" in rec


def test_data_pipeline_says_how_much_faster_the_loader_must_be() -> None:
    # 0 workers: 60 ms of each 100 ms step is loading at one full core.
    ctx = JobContext(batch_size=32, num_workers=0, cpu_worker_budget=6, persistent_workers=False)
    found = diagnose(window(100, 60, wait_cpu=1.0, context=ctx))
    top = found[0]
    assert top.kind is BottleneckKind.DATA_PIPELINE and top.confidence > 0.8
    # device takes 32 samples per 40 ms = 800/s; loading alone gives 32 per 60 ms = 533/s
    assert top.evidence["device_samples_per_s"] == pytest.approx(800.0)
    assert top.evidence["loader_samples_per_s"] == pytest.approx(533.3, abs=0.1)
    assert top.evidence["loader_speedup_needed"] == pytest.approx(1.5)
    assert "loader must be 1.5x faster" in top.summary
    recs = [str(r) for r in top.recommendations]
    assert recs[0].startswith("num_workers: 0 -> 2 (loader must be 1.5x faster")
    assert recs[0].endswith("[auto]")
    # Loading alone in the main process gave 533/s: two workers beside the step predict the
    # device's 800/s, against the 320/s of the window now.
    assert top.recommendations[0].expected_gain == pytest.approx(800 / 320 - 1)
    # Prefetch and persistence do nothing without workers: the next round, once workers pay.
    assert recs[1:] == []
    assert found[1].kind is BottleneckKind.STORAGE and found[1].confidence < 0.5
    with_workers = JobContext(batch_size=32, num_workers=2, cpu_worker_budget=6,
                              persistent_workers=False)  # fmt: skip
    sampler = SamplerSeries(worker_cpu_percent=(95.0,) * 5, num_worker_processes=2)
    tail = diagnose(window(100, 60, sampler=sampler, context=with_workers))[0].recommendations
    assert tail[0].expected_gain is None, (
        "with workers already, the window measures no loader alone"
    )
    assert [str(r) for r in tail[1:]] == [
        "prefetch_factor: 2 -> 4 (absorb batch-to-batch variation in load time) [auto]",
        "persistent_workers: False -> True (no worker restart at every epoch) [auto]",
    ]


def test_an_iterable_dataset_gets_more_workers_only_as_a_condition() -> None:
    ctx = JobContext(batch_size=32, num_workers=0, cpu_worker_budget=6, iterable_dataset=True)
    (rec,) = diagnose(window(100, 60, wait_cpu=1.0, context=ctx))[0].recommendations
    assert (rec.knob, rec.current, rec.proposed, rec.auto_apply) == ("num_workers", 0, 2, False)
    assert "only if the IterableDataset splits its stream by" in rec.reason


def test_data_pipeline_over_cpu_budget_names_the_data_path_that_fits() -> None:
    ctx = JobContext(num_workers=2, cpu_worker_budget=6, prefetch_factor=4)
    sampler = SamplerSeries(worker_cpu_percent=(190.0,) * 5, num_worker_processes=2)
    top = diagnose(window(100, 80, sampler=sampler, context=ctx))[0]
    assert top.kind is BottleneckKind.DATA_PIPELINE
    assert top.evidence["loader_speedup_needed"] == pytest.approx(5.0)
    assert [(r.knob, r.current, r.proposed, r.auto_apply) for r in top.recommendations] == [
        ("num_workers", 2, 6, True),
        ("data path", "batches made by workers", "pre_encode", False),  # nothing measured
    ]
    reason = top.recommendations[1].reason
    assert "needs ~11 workers, CPU budget allows 6" in reason
    assert "80% short" in reason and "decode share not measurable" in reason

    def path(facts: DataFacts, device: str = "cpu") -> tuple[str, str]:
        on = dataclasses.replace(ctx, data_facts=facts, device_type=device)
        rec = diagnose(window(100, 80, sampler=sampler, context=on))[0].recommendations[-1]
        return rec.proposed, rec.reason

    # Float images shipped and decoding a small share: uint8 to the device, with the bytes.
    floats = DataFacts(sample_bytes=196608, pixel_dtype="float32", per_sample_s=2.9e-3,
                       decode_s=0.7e-3, files="jpeg")  # fmt: skip
    proposed, why = path(floats, "cuda")
    assert proposed == "uint8_to_device"
    assert "192 KiB a sample as float32, uint8 would be 48 KiB" in why
    assert "decoding is 24% of a sample's 2.90 ms" in why
    # Decoding most of a sample: GPU decode for JPEGs on CUDA, else pre-encoding.
    decode_bound = dataclasses.replace(floats, decode_s=2.0e-3)
    assert path(decode_bound, "cuda")[0] == "gpu_decode"
    assert path(decode_bound, "cpu")[0] == "pre_encode"
    png = dataclasses.replace(decode_bound, files="png")
    assert "GPU decode needs JPEG files, these are png" in path(png, "cuda")[1]
    in_memory = dataclasses.replace(ctx, dataset="TensorDataset")
    kept = diagnose(window(100, 80, sampler=sampler, context=in_memory))[0].recommendations
    assert [r.knob for r in kept] == ["num_workers"]  # tensors in memory: nothing to pre-encode


def test_storage_when_workers_idle_and_io_wait_high() -> None:
    sampler = SamplerSeries(
        worker_cpu_percent=(20.0,) * 5, num_worker_processes=4, iowait_percent=(35.0,) * 5,
        disk_read_bytes_per_s=(4e8,) * 5, system_cpu_percent=(20.0,) * 5,
    )  # fmt: skip
    ctx = JobContext(num_workers=4, cpu_worker_budget=4)
    found = diagnose(window(100, 50, sampler=sampler, context=ctx))
    assert kinds(found)[:2] == ["storage", "data_pipeline"]
    top = found[0]
    assert top.evidence["loader_busy_cores"] == pytest.approx(0.05)
    assert top.evidence["iowait_percent"] == 35.0
    assert [str(r) for r in top.recommendations[:2]] == [
        "num_workers: 4 -> 8 (workers wait on reads: more reads in flight hide latency) [auto]",
        "prefetch_factor: 2 -> 8 (deeper read-ahead per worker) [auto]",
    ]
    assert not top.recommendations[2].auto_apply  # moving the data set is the user's call


def test_compute_on_gpu_recommends_batch_and_bf16_with_values() -> None:
    top = diagnose(window(100, 1, sampler=gpu(98, used_gib=15.4), context=H200))[0]
    assert top.kind is BottleneckKind.COMPUTE
    assert top.evidence["gpu_util_percent"] == 98.0
    recs = [str(r) for r in top.recommendations]
    assert recs[0] == (
        "batch_size: 32 -> 128 (VRAM 11% used; scale the learning rate with it) [opt-in]"
    )
    assert recs[1] == (
        "precision: 32-true -> bf16-mixed (NVIDIA H200, compute capability 9.0, supports bf16; "
        "tensor cores at 2x the fp32 rate) [opt-in]"
    )
    assert not any(r.auto_apply for r in top.recommendations)


def test_past_the_cpu_budget_one_more_worker_at_a_time_up_to_the_ceiling() -> None:
    ctx = JobContext(num_workers=1, cpu_worker_budget=1, cpu_worker_ceiling=4, prefetch_factor=4,
                     persistent_workers=True)  # fmt: skip
    sampler = SamplerSeries(worker_cpu_percent=(95.0,) * 5, num_worker_processes=1)
    top = diagnose(window(100, 80, sampler=sampler, context=ctx))[0]
    assert top.kind is BottleneckKind.DATA_PIPELINE
    first = top.recommendations[0]
    assert (first.knob, first.current, first.proposed, first.auto_apply) == (
        "num_workers", 1, 2, True)  # fmt: skip
    assert "past the CPU budget of 1 workers one at a time" in first.reason
    assert "ceiling 4" in first.reason
    at_ceiling = dataclasses.replace(ctx, num_workers=4)
    sampler4 = dataclasses.replace(sampler, num_worker_processes=4)
    recs = diagnose(window(100, 80, sampler=sampler4, context=at_ceiling))[0].recommendations
    assert "num_workers" not in [r.knob for r in recs]
    no_ceiling = dataclasses.replace(ctx, cpu_worker_ceiling=None)
    recs = diagnose(window(100, 80, sampler=sampler, context=no_ceiling))[0].recommendations
    assert "num_workers" not in [r.knob for r in recs]  # the budget is a hard cap then


def test_on_the_cpu_the_main_threads_shrink_beside_busy_workers() -> None:
    ctx = JobContext(intra_op_threads=2, compiled=False, num_workers=1, cpus_per_rank=2)
    w = window(100, 1, context=ctx, sampler=SamplerSeries(main_cpu_percent=(192.0,) * 5))
    top = diagnose(w)[0]
    assert top.kind is BottleneckKind.COMPUTE
    first = top.recommendations[0]
    assert (first.knob, first.current, first.proposed, first.auto_apply) == (
        "intra_op_threads", 2, 1, True)  # fmt: skip
    assert "1 worker(s) share 2 CPUs with the step's 2 threads" in first.reason
    for other in (dataclasses.replace(ctx, num_workers=0),
                  dataclasses.replace(ctx, intra_op_threads=1)):  # fmt: skip
        recs = diagnose(
            window(100, 1, context=other, sampler=SamplerSeries(main_cpu_percent=(96.0,) * 5))
        )[0]
        assert "intra_op_threads" not in [r.knob for r in recs.recommendations]


def test_compute_with_every_knob_in_use_is_healthy() -> None:
    ctx = JobContext(**{**H200.to_dict(), "precision": "bf16-mixed", "compiled": True,
                        "unused_free_gpus": ()})  # fmt: skip
    found = diagnose(window(100, 1, sampler=gpu(99, used_gib=100), context=ctx))
    assert kinds(found) == ["healthy"]
    assert found[0].confidence == 1.0 and found[0].evidence["gpu_util_percent"] == 99.0


def test_compute_on_cpu_from_busy_threads() -> None:
    ctx = JobContext(intra_op_threads=2, compiled=False)
    # the main thread is one core; the sampler sees the process's intra-op threads too
    w = window(100, 1, context=ctx, sampler=SamplerSeries(main_cpu_percent=(192.0,) * 5))
    top = diagnose(w)[0]
    assert top.kind is BottleneckKind.COMPUTE
    assert top.evidence["compute_cpu_cores"] == pytest.approx(1.92, abs=0.01)
    assert [r.knob for r in top.recommendations] == ["compile"]


def test_vram_from_ooms_and_reserved_memory() -> None:
    sampler = gpu(95, used_gib=137, allocator_reserved_bytes=(int(136 * GIB),) * 5,
                  alloc_retries=4, ooms=1)  # fmt: skip
    top = diagnose(window(100, 1, sampler=sampler, context=H200))[0]
    assert top.kind is BottleneckKind.VRAM and top.confidence == 0.99
    assert top.evidence == {"memory_peak_share": 0.979, "alloc_retries": 4, "ooms": 1}
    assert str(top.recommendations[0]) == (
        "batch_size x accumulate_grad_batches: 32 x 1 -> 16 x 2 (same effective batch, half the "
        "activation memory) [opt-in]"
    )


def test_kernel_launch_confirmed_by_capture() -> None:
    cap = CaptureSummary(steps=3, kernels_per_step=900, median_kernel_us=4.0,
                         gpu_idle_share=0.7, pageable_h2d_per_step=0, syncs_per_step=0)  # fmt: skip
    sampler = gpu(30, main_cpu_percent=(100.0,) * 5)
    w = window(50, 1, sampler=sampler, context=H200, capture=cap)
    assert not needs_capture(w)
    top = diagnose(w)[0]
    assert top.kind is BottleneckKind.KERNEL_LAUNCH and top.confidence == 0.85
    assert top.evidence["capture_median_kernel_us"] == 4.0
    assert str(top.recommendations[0]).startswith("batch_size: 32 -> 128 (same launches")
    assert top.recommendations[1].proposed == "reduce-overhead"


def test_host_overhead_confirmed_by_capture() -> None:
    cap = CaptureSummary(steps=3, kernels_per_step=40, median_kernel_us=300.0,
                         gpu_idle_share=0.45, pageable_h2d_per_step=2,
                         syncs_per_step=3)  # fmt: skip
    w = window(50, 1, sampler=gpu(40, main_cpu_percent=(95.0,) * 5), context=H200, capture=cap)
    top = diagnose(w)[0]
    assert top.kind is BottleneckKind.HOST_OVERHEAD and top.confidence == 0.9
    assert [(r.knob, r.current, r.proposed, r.auto_apply) for r in top.recommendations] == [
        ("pin_memory", False, True, True),
        ("persistent_workers", False, True, True),
        ("syncs per step", 3.0, 0, False),
    ]


def test_ambiguous_gpu_signals_ask_for_a_capture() -> None:
    w = window(50, 1, sampler=gpu(30, main_cpu_percent=(100.0,) * 5), context=H200)
    assert needs_capture(w)
    found = diagnose(w)
    assert kinds(found)[:2] == ["kernel_launch", "host_overhead"]
    assert all(d.needs_capture for d in found[:2])
    assert "a short profiler capture would confirm this" in str(found[0])


def test_under_occupied_when_free_gpus_are_unused() -> None:
    ctx = JobContext(**{**H200.to_dict(), "unused_free_gpus": (1, 2, 3)})
    found = diagnose(window(100, 1, sampler=gpu(96, used_gib=15.4), context=ctx))
    assert kinds(found)[0] == "under_occupied"
    assert str(found[0].recommendations[0]) == (
        "devices: 1 -> 4 (GPUs [1, 2, 3] are free; DDP multiplies the global batch) [opt-in]"
    )
    assert "compute" in kinds(found)


def test_under_occupied_when_gpu_and_host_both_idle() -> None:
    w = window(50, 1, sampler=gpu(10, main_cpu_percent=(20.0,) * 5), context=H200)
    assert kinds(diagnose(w))[0] == "under_occupied"


def test_cpu_run_only_considers_cpu_kinds() -> None:
    # GPU-looking readings on a CPU job must not produce GPU kinds.
    w = window(100, 1, sampler=gpu(10, used_gib=139, ooms=3), context=JobContext())
    assert set(kinds(diagnose(w))) <= {"data_pipeline", "storage", "compute", "healthy"}


def test_small_data_wait_is_healthy_not_an_alarm() -> None:
    ctx = JobContext(num_workers=0, intra_op_threads=4)  # 1 of 4 threads busy: not saturated
    found = diagnose(window(100, 4, wait_cpu=1.0, context=ctx))
    assert kinds(found) == ["healthy"]
    assert found[0].evidence["data_wait_share"] == 0.04


def test_too_few_steps_say_nothing_and_bad_windows_raise() -> None:
    assert diagnose(window(steps=2)) == []
    with pytest.raises(ValueError, match="must have the same length, got 2, 1, 2"):
        Window((0.1, 0.1), (0.0,), (1, 1))


def test_to_dict_is_json_and_str_lists_recommendations() -> None:
    found = diagnose(window(100, 60, wait_cpu=1.0, context=JobContext(num_workers=0)))
    data = json.loads(json.dumps([d.to_dict() for d in found]))
    assert data[0]["kind"] == "data_pipeline"
    assert data[0]["recommendations"][0]["knob"] == "num_workers"
    assert str(found[0]).splitlines()[1].startswith("  1. num_workers: 0 -> ")


def test_diagnosis_imports_no_torch() -> None:
    code = (
        "import sys\nfrom lightning_maxtp.knobs.advisor import diagnose\n"
        "import lightning_maxtp.observe.window, lightning_maxtp.observe.report\n"
        "print([m for m in ('torch', 'lightning') if m in sys.modules])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout  # fmt: skip
    assert out.strip() == "[]"


def test_vram_at_the_ceiling_outranks_compute() -> None:
    found = diagnose(window(100, 1, sampler=gpu(99, used_gib=134), context=H200))
    assert kinds(found)[:2] == ["vram", "compute"]
    compute = found[1]
    # no batch growth with 96 % of VRAM in use: precision first
    assert [r.knob for r in compute.recommendations] == ["precision", "compile"]


def test_vram_without_nvml_reads_the_allocator_against_the_device_total() -> None:
    sampler = SamplerSeries(allocator_reserved_bytes=(int(120 * GIB), int(130 * GIB)))
    top = diagnose(window(100, 1, sampler=sampler, context=H200))[0]
    assert top.kind is BottleneckKind.VRAM
    assert top.evidence["memory_peak_share"] == round(130 / 140, 3)


def test_storage_gets_reads_in_flight_even_when_ranks_take_every_core() -> None:
    # Two DDP ranks on two CPUs: the CPU budget is 0 workers, but waiting workers use little CPU.
    sampler = SamplerSeries(iowait_percent=(35.0,) * 5, system_cpu_percent=(20.0,) * 5)
    ctx = JobContext(num_workers=0, cpu_worker_budget=0)
    found = diagnose(window(100, 90, wait_cpu=0.05, sampler=sampler, context=ctx))
    storage = next(d for d in found if d.kind is BottleneckKind.STORAGE)
    (workers,) = [r for r in storage.recommendations if r.knob == "num_workers"]
    assert (workers.current, workers.proposed, workers.auto_apply) == (0, 2, True)


def test_compute_bound_with_busy_workers_keeps_the_workers_the_loading_needs() -> None:
    # 4 JPEG-decoding workers on 2 CPUs: the step is compute-bound and the workers use 1.6 cores.
    ctx = JobContext(intra_op_threads=2, compiled=False, num_workers=4, cpus_per_rank=2)
    busy = SamplerSeries(
        main_cpu_percent=(100.0,) * 5,
        worker_cpu_percent=(160.0,) * 5,
        num_worker_processes=4,
        system_cpu_percent=(97.0,) * 5,
    )
    top = diagnose(window(100, 1, context=ctx, sampler=busy))[0]
    assert top.kind is BottleneckKind.COMPUTE
    # The loading needs 1.6 cores a step: in the main process it would run in series with the
    # step (1.6x the step's own time), and 2 workers take the same cores as 4. The job model
    # keeps them, and one thread for the step would leave it slower: the loading and the step
    # already fill both cores with work (3.1 ms a sample measured, 3.1 ms of CPU on each).
    assert [r.knob for r in top.recommendations if r.auto_apply] == []
    # Workers on 0.6 of a core: the step's two threads wait on the one they displace, and the
    # model predicts one thread (the core the loading leaves) faster.
    half = dataclasses.replace(busy, worker_cpu_percent=(60.0,) * 5)
    first = diagnose(window(100, 1, context=ctx, sampler=half))[0].recommendations[0]
    assert (first.knob, first.current, first.proposed) == ("intra_op_threads", 2, 1)
    assert first.expected_gain is not None and first.expected_gain > 0.05
    assert "the job model predicts" in first.reason
    # Workers that use a fifth of a core cost a step on both cores more than their CPU
    # (each displaced thread stalls the other): none, predicted from the model.
    idle = dataclasses.replace(busy, worker_cpu_percent=(17.0,) * 5)
    rec = diagnose(window(100, 1, context=ctx, sampler=idle))[0].recommendations[0]
    assert (rec.knob, rec.proposed) == ("num_workers", 0)
    assert "the job model predicts" in rec.reason and "0.2 cores" in rec.reason
    # The model's own time per sample now (the step stretched by 2.5x the 0.17 of loading
    # beside it) against none: the step alone, the loading in series
    from lightning_maxtp.observe.job_model import JobModel

    model = JobModel.from_window(window(100, 1, context=ctx, sampler=idle))
    assert model is not None
    now, none = model.fit_seconds_per_sample(4, False), model.fit_seconds_per_sample(0, False)
    # ...and against the rate measured, whichever promises less (here the measured rate, a
    # little faster than the model's own figure for the settings in force).
    measured = 1 / model.measured_samples_per_s
    gain = min(now, measured) / none - 1
    assert now > none and rec.expected_gain == pytest.approx(gain, abs=1e-3)
    # ...but leave it nothing to win back on a machine with CPUs to spare.
    spare = dataclasses.replace(idle, system_cpu_percent=(60.0,) * 5)
    recs = diagnose(window(100, 1, context=ctx, sampler=spare))[0].recommendations
    assert "num_workers" not in [r.knob for r in recs]


def test_on_a_gpu_host_fewer_workers_only_when_the_host_cpus_are_busy() -> None:
    ctx = dataclasses.replace(H200, num_workers=16, precision="bf16-mixed", compiled=True)

    def sampler(system: float) -> SamplerSeries:
        return gpu(
            99,
            used_gib=100,
            worker_cpu_percent=(480.0,) * 5,
            num_worker_processes=16,
            system_cpu_percent=(system,) * 5,
        )

    busy = diagnose(window(100, 1, sampler=sampler(70.0), context=ctx))[0]
    assert busy.kind is BottleneckKind.COMPUTE
    rec = busy.recommendations[0]
    # 16 workers use 4.8 cores: 6 of one core each deliver 1.25x the consumption.
    assert (rec.knob, rec.current, rec.proposed, rec.auto_apply) == ("num_workers", 16, 6, True)
    assert "host CPUs 70 % busy" in rec.reason
    quiet = diagnose(window(100, 1, sampler=sampler(20.0), context=ctx))
    assert all(r.knob != "num_workers" for d in quiet for r in d.recommendations)


def test_a_compute_bound_step_beside_busy_workers_gets_every_loader_knob_down() -> None:
    ctx = JobContext(intra_op_threads=1, compiled=False, num_workers=4, cpus_per_rank=2,
                     prefetch_factor=4, pin_memory=True, persistent_workers=True)  # fmt: skip
    busy = SamplerSeries(
        main_cpu_percent=(100.0,) * 5, worker_cpu_percent=(160.0,) * 5, num_worker_processes=4,
        system_cpu_percent=(97.0,) * 5, available_ram_bytes=(GIB,) * 5,
    )  # fmt: skip
    top = diagnose(window(100, 1, context=ctx, sampler=busy))[0]
    assert top.kind is BottleneckKind.COMPUTE
    auto = [(r.knob, r.current, r.proposed) for r in top.recommendations if r.auto_apply]
    # The workers stay (the job model: their 1.6 cores of loading would run in series with
    # the step without them); pinning only matters for copies to a GPU, so it is left alone.
    assert auto == [("prefetch_factor", 4, 2), ("persistent_workers", True, False)]
    assert "1.0 GiB of host RAM left" in top.recommendations[1].reason
    # With RAM to spare persistence stays; with idle workers on idle CPUs nothing moves down.
    roomy = dataclasses.replace(busy, available_ram_bytes=(20 * GIB,) * 5)
    recs = diagnose(window(100, 1, context=ctx, sampler=roomy))[0].recommendations
    assert "persistent_workers" not in [r.knob for r in recs]
    spare = dataclasses.replace(busy, worker_cpu_percent=(2.0,) * 5, system_cpu_percent=(50.0,) * 5)
    recs = diagnose(window(100, 1, context=ctx, sampler=spare))[0].recommendations
    assert not {"num_workers", "prefetch_factor", "persistent_workers"} & {r.knob for r in recs}


def test_on_a_busy_gpu_host_pinning_is_tried_off() -> None:
    ctx = dataclasses.replace(H200, num_workers=16, precision="bf16-mixed", compiled=True,
                              pin_memory=True)  # fmt: skip

    def recs(system: float) -> list[tuple[str, object, object]]:
        sampler = gpu(99, used_gib=100, worker_cpu_percent=(480.0,) * 5,
                      num_worker_processes=16, system_cpu_percent=(system,) * 5)  # fmt: skip
        found = diagnose(window(100, 1, sampler=sampler, context=ctx))
        return [(r.knob, r.current, r.proposed) for d in found for r in d.recommendations]

    assert ("pin_memory", True, False) in recs(70.0)
    assert ("pin_memory", True, False) not in recs(20.0)


def test_a_cpu_step_on_fewer_threads_than_free_cores_gets_more() -> None:
    ctx = JobContext(intra_op_threads=1, compiled=False, num_workers=0, cpus_per_rank=4)
    top = diagnose(window(100, 1, context=ctx, sampler=SamplerSeries(main_cpu_percent=(99.0,) * 5)))
    rec = top[0].recommendations[0]
    assert top[0].kind is BottleneckKind.COMPUTE
    assert (rec.knob, rec.current, rec.proposed, rec.auto_apply) == ("intra_op_threads", 1, 4, True)
    assert "computes on 1 of the 4 CPUs its workers leave" in rec.reason


def test_on_a_cpu_whose_step_keeps_every_core_busy_a_worker_is_predicted_for_reads_only() -> None:
    ctx = JobContext(intra_op_threads=2, compiled=False, num_workers=0, cpus_per_rank=2)

    def workers(wait_cpu: float, context: JobContext = ctx) -> Recommendation:
        sampler = SamplerSeries(main_cpu_percent=(180.0,) * 5)
        found = diagnose(window(100, 15, wait_cpu=wait_cpu, sampler=sampler, context=context))
        return next(r for d in found for r in d.recommendations if r.knob == "num_workers")

    # Decoding in the main process (its wait is CPU work) beside a step on both cores: a
    # worker would decode on the step's cores, each displaced thread stalling the other; the
    # job model predicts a loss, so no worker is recommended (nor measured alone).
    sampler = SamplerSeries(main_cpu_percent=(180.0,) * 5)
    found = diagnose(window(100, 15, wait_cpu=1.0, sampler=sampler, context=ctx))
    assert "num_workers" not in [r.knob for d in found for r in d.recommendations]
    # Waiting on reads (little CPU): a worker hides the wait, whatever the cores do; the
    # 1.5 ms of its CPU beside the step stretch it by 2.5x that.
    reads = workers(0.1)
    assert reads.auto_apply and reads.expected_gain == pytest.approx(0.128, abs=0.01)
    # A step on one thread leaves a core free: the whole loading runs there, beside the step.
    one = dataclasses.replace(ctx, intra_op_threads=1)
    single = SamplerSeries(main_cpu_percent=(100.0,) * 5)
    found = diagnose(window(100, 15, wait_cpu=1.0, sampler=single, context=one))
    rec = next(r for d in found for r in d.recommendations if r.knob == "num_workers")
    assert rec.auto_apply and rec.expected_gain == pytest.approx(100 / 85 - 1, abs=0.01)


def test_workers_whose_waits_a_saturated_reading_hides_are_read_from_what_they_delivered() -> None:
    # 4 workers that wait 3 ms a sample off the CPU, read at the fit's start while the machine
    # looked saturated: taken for CPU work alone (0.08 ms a sample), the model sent the loader
    # back to the main process (+19 %, measured -79 %) or deepened a queue never full (+512 %).
    # Yet the window ran at 1,194 samples/s waiting 84 % of the time: 2.8 ms a sample at least.
    sampler = SamplerSeries(
        worker_cpu_percent=(9.9,) * 5, num_worker_processes=4, system_cpu_percent=(93.0,) * 5,
        main_cpu_percent=(89.0,) * 5,
    )  # fmt: skip
    ctx = JobContext(device_type="cpu", num_workers=4, prefetch_factor=2, cpus_per_rank=2,
                     cpu_worker_budget=1, intra_op_threads=2, batch_size=16)  # fmt: skip
    found = diagnose(window(13.4, 11.3, batch=16, steps=8, sampler=sampler, context=ctx))
    first = found[0].recommendations[0]
    assert found[0].kind is BottleneckKind.STORAGE
    assert (first.knob, first.current) == ("num_workers", 4) and first.proposed > 4, str(first)
    assert "(97% of it waiting)" in first.reason
    assert not any(r.knob == "prefetch_factor" for d in found for r in d.recommendations)
