"""The closed loop's state machine on constructed windows (no Lightning, no loader)."""

from __future__ import annotations

from lightning_maxtp.callbacks.trials import remaining
from lightning_maxtp.callbacks.tuning_loop import TuningLoop
from lightning_maxtp.observe import (
    BottleneckKind,
    Diagnosis,
    JobContext,
    Recommendation,
    SamplerSeries,
    Window,
)

SETTINGS = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False,
            "persistent_workers": False}  # fmt: skip


def window(step_ms: float, steps: int = 10) -> Window:
    return Window(
        step_time_s=(step_ms / 1e3,) * steps, data_wait_s=(0.0,) * steps, samples=(32,) * steps,
        sampler=SamplerSeries(), context=JobContext(),
    )  # fmt: skip


def data_bound() -> tuple[Diagnosis, ...]:
    recs = (
        Recommendation("num_workers", 0, 1, "a worker overlaps loading", True),
        Recommendation("prefetch_factor", 2, 4, "absorb variation", True),
        Recommendation("decode", "CPU", "GPU", "pre-encode", False),
    )
    return (Diagnosis(BottleneckKind.DATA_PIPELINE, 0.9, "waits on data", recommendations=recs),)


def compute() -> tuple[Diagnosis, ...]:
    return (Diagnosis(BottleneckKind.COMPUTE, 0.8, "the step is the limit"),)


def loop(**kwargs: object) -> TuningLoop:
    args = {"warmup_steps": 2, "settle_steps": 1, "min_gain": 0.05, "max_trials": 5,
            "time_budget_s": 60.0, "max_workers": None} | kwargs  # fmt: skip
    return TuningLoop(**args)  # type: ignore[arg-type]


def test_phases_warmup_baseline_settle_trial_then_monitor() -> None:
    lp = loop()
    assert [lp.on_step(switched=False) for _ in range(2)] == [False, True]
    assert lp.phase == "baseline" and lp.measuring
    lp.record_baseline(window(100.0), data_bound())
    change = lp.decide(SETTINGS, device_type="cpu")
    assert change == ("num_workers", {"num_workers": 1}, "a worker overlaps loading")
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 1}, "why", step=12)
    assert lp.phase == "settle" and not lp.measuring
    assert lp.on_step(switched=False) is False  # settle steps count once the switch happened
    assert lp.on_step(switched=True) is True and lp.phase == "trial"
    trial = lp.finish(window(50.0), lp.pays(window(50.0)), compute())
    assert trial.kept and trial.old == 0 and trial.new == 1 and round(trial.gain, 6) == 1.0
    settings = SETTINGS | {"num_workers": 1, "prefetch_factor": 2}
    assert lp.decide(settings, device_type="cpu") == (
        "no auto-applicable knob left for the compute bottleneck"
    )
    lp.stop("done")
    summary = lp.summary(settings, ())
    assert summary.finished and summary.speedup is not None and round(summary.speedup, 6) == 2.0


def test_after_a_revert_the_reference_window_decides_not_the_reverted_trial() -> None:
    lp = loop()
    lp.on_step(switched=False)
    lp.on_step(switched=False)
    lp.record_baseline(window(100.0), data_bound())
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 1}, "why", step=12)
    # The trial window was slower and (with a worker competing for the CPUs) looked compute
    # bound; it is reverted, so the data-bound baseline still describes the job.
    slow = window(102.0)
    assert not lp.pays(slow)
    trial = lp.finish(slow, False, compute())
    assert not trial.kept and ("num_workers", "1") in lp.tried
    reason = lp.decide(SETTINGS, device_type="cpu")
    assert reason == "no auto-applicable knob left for the data_pipeline bottleneck"
    # prefetch needs workers: it is neither tried nor left in the report for a 0-worker loader.
    left = remaining(data_bound(), lp.tried, SETTINGS)[0].recommendations
    assert [r.knob for r in left] == ["decode"]
    assert [r.knob for r in remaining(data_bound(), set(), SETTINGS)[0].recommendations] == [
        "num_workers", "prefetch_factor", "decode",
    ]  # fmt: skip


def test_limits_stop_the_loop_and_the_user_worker_cap_applies() -> None:
    lp = loop(max_trials=0)
    lp.record_baseline(window(100.0), data_bound())
    assert lp.decide(SETTINGS, device_type="cpu") == "max_trials=0 reached"
    capped = loop(max_workers=0)
    capped.record_baseline(window(100.0), data_bound())
    assert capped.decide(SETTINGS, device_type="cpu") == (
        "no auto-applicable knob left for the data_pipeline bottleneck"
    )
    asked: list[bool] = []

    def plan() -> tuple[str, dict[str, object], str]:
        asked.append(True)
        return "loader plan", {"num_workers": 4}, "4 workers reach the target"

    planned = loop()
    planned.record_baseline(window(100.0), data_bound())
    assert planned.decide(SETTINGS, device_type="cpu", loader_plan=plan)[0] == "loader plan"
    assert asked == [True]
    unplanned = loop()
    unplanned.record_baseline(window(100.0), compute())  # not data-bound: no loader measurement
    assert unplanned.decide(SETTINGS, device_type="cpu", loader_plan=plan) == (
        "no auto-applicable knob left for the compute bottleneck"
    )
    assert asked == [True]
