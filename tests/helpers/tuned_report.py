"""A tuned run's report built by hand, shaped like the demo's: two trials, one kept, one reverted.

Steps 1..49 are timed (step 0 never is); the baseline window is steps 2-5, ``num_workers`` 0 -> 2
is tried from step 6 (settle 6-7, window 8-11, kept), ``intra_op_threads`` 2 -> 1 from step 12
(window 13-24, reverted after step 24), then the final settings are monitored (26-37, 38-49).
Every window's step times are the very floats of its steps in the step log, as in a real fit.
"""

from __future__ import annotations

from lightning_maxtp.observe import (
    BottleneckKind,
    Diagnosis,
    JobContext,
    KnobChange,
    Recommendation,
    SamplerSeries,
    ThroughputReport,
    Window,
)
from lightning_maxtp.tuning.cost import TuningCost
from lightning_maxtp.tuning.trials import KnobTrial, TuningSummary

BATCH = 32


def _step_s(step: int) -> tuple[float, float]:
    """(step time, data wait) of each phase: waiting on data, then workers, then final."""
    if step <= 7:
        return 0.27, 0.2
    if step <= 11:
        return 0.1, 0.003
    if step <= 24:
        return 0.104, 0.002
    return 0.12, 0.002


def tuned_report() -> ThroughputReport:
    """The report (its ``to_dict()`` is what ``report.json`` holds)."""
    log, t = [], 0.5
    for step in range(1, 50):
        step_s, wait_s = _step_s(step)
        # Unique floats per step, as measured ones are: a window is found by its run of times.
        step_s += step * 1e-6
        t += step_s
        log.append((t, step_s, wait_s))
    end = {step: log[step - 1][0] for step in range(1, 50)}

    def window(first: int, steps: int, workers: int, threads: int) -> Window:
        rows = log[first - 1 : first - 1 + steps]
        context = JobContext(device_type="cpu", host_cpus=2, num_workers=workers,
                             pin_memory=False, intra_op_threads=threads)  # fmt: skip
        return Window(
            step_time_s=tuple(r[1] for r in rows), data_wait_s=tuple(r[2] for r in rows),
            samples=(BATCH,) * steps, first_step=first, context=context,
        )  # fmt: skip

    baseline = window(2, 4, 0, 2)
    workers = window(8, 4, 2, 2)
    threads = window(13, 12, 2, 1)
    final = (window(26, 12, 2, 2), window(38, 12, 2, 2))
    kept = KnobTrial(
        "num_workers", 0, 2, "workers wait on reads", baseline.samples_per_s,
        workers.samples_per_s, kept=True, first_step=6, steps=4, expected_gain=1.06,
    )  # fmt: skip
    reverted = KnobTrial(
        "intra_op_threads", 2, 1, "2 worker(s) share 2 CPUs", workers.samples_per_s,
        threads.samples_per_s, kept=False, first_step=12, steps=12, verdict="reverted",
        lost_s=0.1,
    )  # fmt: skip
    changes = (
        KnobChange(end[5] + 0.01, "num_workers", "num_workers=0", "num_workers=2",
                   "trying: workers wait on reads"),
        KnobChange(end[11] + 0.01, "intra_op_threads", "intra_op_threads=2",
                   "intra_op_threads=1", "trying: 2 worker(s) share 2 CPUs"),
        KnobChange(end[24] + 0.01, "intra_op_threads", "intra_op_threads=1",
                   "intra_op_threads=2", f"reverted: {reverted.gain:+.1%} < 5%"),
    )  # fmt: skip
    in_force = (workers, *final)
    tuned_rate = sum(sum(w.samples) for w in in_force) / sum(
        sum(w.samples) / w.samples_per_s for w in in_force
    )
    cost = TuningCost(lost_s=0.1, switch_s=0.3, budget_s=1.6, step_s=0.27, batches=50.0,
                      fit_s=7.0, steps_run=48)  # fmt: skip
    summary = TuningSummary(
        trials=(kept, reverted), baseline_samples_per_s=baseline.samples_per_s,
        tuned_samples_per_s=tuned_rate, tuning_s=end[24] - log[0][0], tuning_steps=22,
        stop_reason="no auto-applicable knob left for the compute bottleneck",
        settings={"num_workers": 2, "prefetch_factor": 2, "pin_memory": False},
        notes=("not allowed: compile (allow='all' tries it behind a numerics guard)",),
        finished=True, cost=cost,
    )  # fmt: skip
    diagnosis = Diagnosis(
        BottleneckKind.COMPUTE, 0.95, "the device is the limit", {"data_wait_share": 0.02},
        (Recommendation("compile", False, True, "torch.compile fuses kernels", False),),
    )  # fmt: skip
    samples = [0.1 * i for i in range(1, int(t / 0.1))]
    timeline = SamplerSeries(t_s=tuple(samples), main_cpu_percent=(150.0,) * len(samples),
                             worker_cpu_percent=(40.0,) * len(samples))  # fmt: skip
    return ThroughputReport(
        windows=(baseline, workers, threads, *final),
        diagnoses=(diagnosis,),
        step_log=tuple(log),
        timeline=timeline,
        knob_changes=changes,
        notes=(*str(summary).split("\n")[:2], str(kept), str(reverted), *summary.notes),
        final_windows=in_force,
        tuning=summary.to_dict(),
        spans=(("tuning", end[1], end[24] + 0.01),),
    )
