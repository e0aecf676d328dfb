"""The closed loop's state machine on constructed windows (no Lightning, no loader)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from lightning_maxtp.observe import (
    BottleneckKind,
    Diagnosis,
    JobContext,
    Recommendation,
    SamplerSeries,
    Window,
)
from lightning_maxtp.tuning.config import TuningConfig
from lightning_maxtp.tuning.decisions import ASK, AskMath, MeasureLoader, Remeasure, Stop, Try
from lightning_maxtp.tuning.judge import judge
from lightning_maxtp.tuning.trials import KnobTrial, remaining
from lightning_maxtp.tuning.tuning_loop import TuningLoop

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


def loop(**kwargs: Any) -> TuningLoop:
    args = {"warmup_steps": 2, "settle_steps": 1, "min_gain": 0.05, "max_trials": 5,
            "time_budget_s": 60.0, "max_workers": None} | kwargs  # fmt: skip
    return TuningLoop(TuningConfig(**args))


def measure(lp: TuningLoop, step_ms: float, found: tuple[Diagnosis, ...]) -> object:
    """Settle, measure one trial window of ``step_ms`` steps, act on the loop's own verdict."""
    assert lp.phase == "settle"
    assert (
        lp.on_step(switched=False, now=0.0) is False
    )  # settle steps count once the switch happened
    assert lp.on_step(switched=True, now=0.0) is True and lp.phase == "trial" and lp.measuring
    w = window(step_ms)
    return lp.advance(lp.judge(w), w, found)


def test_no_trial_starts_that_could_not_be_read_before_the_fit_ends() -> None:
    # A settle step and the first 5 steps of a 20-step window: 6 steps at least.
    lp = loop(window_steps=20)
    [lp.on_step(switched=False, now=0.0) for _ in range(2)]
    lp.record_baseline(window(100.0), data_bound())
    assert lp.room(6) and not lp.room(5)
    assert lp.decide(SETTINGS, device_type="cpu", now=0.0, steps_left=5) == Stop(
        "the fit ends in 5 steps, too few to read a trial"
    )
    assert isinstance(lp.decide(SETTINGS, device_type="cpu", now=0.0, steps_left=6), Try)


def test_a_gain_is_re_measured_reference_then_trial_before_it_is_kept() -> None:
    lp = loop()
    assert [lp.on_step(switched=False, now=0.0) for _ in range(2)] == [False, True]
    assert lp.phase == "baseline" and lp.measuring
    lp.record_baseline(window(100.0), data_bound())
    change = lp.decide(SETTINGS, device_type="cpu", now=0.0)
    assert change == Try("num_workers", {"num_workers": 1}, "a worker overlaps loading")
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 1}, "why", step=12)
    assert lp.phase == "settle" and not lp.measuring
    # R1 = 100 ms, T1 = 50 ms: looks like 2x; re-measure the reference, then the trial.
    assert lp.judge(window(50.0)) == Remeasure("old")
    assert measure(lp, 50.0, compute()) is None
    assert lp.judge(window(98.0)) == Remeasure("new")
    assert measure(lp, 98.0, data_bound()) is None
    trial = measure(lp, 52.0, compute())
    assert isinstance(trial, KnobTrial)
    assert (trial.verdict, trial.kept, trial.old, trial.new, trial.windows) == (
        "kept", True, 0, 1, 4,
    )  # fmt: skip
    rate = 32 / 0.01  # samples/s of a 10 ms step of 32 samples; a 100 ms step gives rate / 10
    assert trial.before_samples_per_s == pytest.approx((rate / 10 + rate / 9.8) / 2)
    assert trial.after_samples_per_s == pytest.approx((rate / 5 + rate / 5.2) / 2)
    ref, new = (1 / 10 + 1 / 9.8) / 2, (1 / 5 + 1 / 5.2) / 2  # mean rates, in rate units
    noise = max(abs(1 / 10 - 1 / 9.8) / ref, abs(1 / 5 - 1 / 5.2) / new)
    assert trial.noise == pytest.approx(noise) and trial.gain > 2 * noise
    # Its windows at the faster settings already saved time: half a baseline step each of T1's
    # 10 steps, 0.48 of T2's; R2, at the reference's settings, saved 2 % of one each.
    banked = 10 * (1 - 50 / 100) + 10 * (1 - 52 / 100) + 10 * (1 - 98 / 100)
    assert lp.banked_steps == pytest.approx(banked) and lp.kept_at == lp.steps
    settings = SETTINGS | {"num_workers": 1, "prefetch_factor": 2}
    assert lp.decide(settings, device_type="cpu", now=0.0) == Stop(
        "no auto-applicable knob left for the compute bottleneck"
    )
    lp.stop("done", now=0.0)
    summary = lp.summary(settings, (), now=0.0)
    assert summary.finished and summary.speedup is not None and summary.speedup > 1.9


def test_a_gain_no_larger_than_the_noise_is_undecided_and_the_original_stays() -> None:
    lp = loop()
    lp.record_baseline(window(100.0), data_bound())
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 1}, "why", step=12)
    # T1 looked 25 % faster, but the reference measured again was as fast: the baseline window
    # had been slowed by something else (another job on a shared machine).
    assert measure(lp, 80.0, compute()) is None
    assert measure(lp, 78.0, data_bound()) is None
    trial = measure(lp, 82.0, compute())
    assert isinstance(trial, KnobTrial)
    assert (trial.verdict, trial.kept) == ("undecided", False)
    assert "undecided: kept the original" in str(trial)
    assert ("num_workers", "1") in lp.tried and lp.ref is not None
    assert lp.ref.median_step_s == pytest.approx(0.078)  # the reference measured last


def test_a_large_gain_left_undecided_by_a_slow_window_gets_a_third_pair() -> None:
    lp = loop()
    lp.record_baseline(window(100.0), data_bound())
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 1}, "why", step=12)
    # +40 % at first, then a stalled trial window: two pairs leave it within twice the noise.
    for step_ms in (70.0, 100.0, 95.0, 99.0):  # T1, R2, T2 (slow), R3
        assert measure(lp, step_ms, compute()) is None
    trial = measure(lp, 68.0, compute())  # T3
    assert isinstance(trial, KnobTrial) and trial.windows == 6
    assert (trial.verdict, trial.kept) == ("kept", True)
    assert lp.ref is not None and lp.ref.median_step_s == pytest.approx(0.068)


def test_after_a_revert_the_reference_window_decides_not_the_reverted_trial() -> None:
    lp = loop()
    lp.on_step(switched=False, now=0.0)
    lp.on_step(switched=False, now=0.0)
    lp.record_baseline(window(100.0), data_bound())
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 1}, "why", step=12)
    # The trial window was slower and (with a worker competing for the CPUs) looked compute
    # bound; it is reverted at once (nothing to re-measure), so the data-bound baseline still
    # describes the job.
    assert lp.judge(window(102.0)) == "reverted"
    trial = measure(lp, 102.0, compute())
    assert isinstance(trial, KnobTrial)
    assert not trial.kept and trial.windows == 2 and ("num_workers", "1") in lp.tried
    reason = lp.decide(SETTINGS, device_type="cpu", now=0.0)
    assert reason == Stop("no auto-applicable knob left for the data_pipeline bottleneck")
    # prefetch needs workers: it is neither tried nor left in the report for a 0-worker loader.
    left = remaining(data_bound(), lp.tried, SETTINGS)[0].recommendations
    assert [r.knob for r in left] == ["decode"]
    assert [r.knob for r in remaining(data_bound(), set(), SETTINGS)[0].recommendations] == [
        "num_workers", "prefetch_factor", "decode",
    ]  # fmt: skip


def test_a_fit_that_ends_mid_trial_records_it_as_unfinished() -> None:
    lp = loop()
    lp.record_baseline(window(100.0), data_bound())
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 1}, "why", step=12)
    assert measure(lp, 50.0, compute()) is None  # re-measuring: the fit ends here
    trial = lp.end(now=0.0)
    assert trial is not None and (trial.verdict, trial.kept) == ("unfinished", False)
    assert lp.summary(SETTINGS, (), now=0.0).stop_reason == "the fit ended during a trial"
    assert lp.end(now=0.0) is None


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([100, 104], ("reverted", None)),  # under min_gain: no re-measure
        ([100, 130], ("old", None)),
        ([100, 130, 101], ("new", None)),
        ([100, 130, 101, 131], ("kept", 1 / 100.5)),
        # +14 %, +20 %, +13 % but not beyond twice the noise: a third pair decides
        ([100, 130, 128, 131], ("old", None)),  # the reference caught up?
        ([100, 140, 100, 104], ("old", None)),  # the trial did not repeat its gain?
        ([100, 115, 112, 125], ("old", None)),  # +13 % against 11 % noise: too close
        ([100, 130, 128, 131, 129], ("new", None)),
        ([100, 130, 120, 118], ("undecided", 20 / 110)),  # unordered: a third pair cannot pass
        ([100, 130, 128, 131, 129, 130], ("reverted", 29 / 128)),  # medians: 130 vs 128
        ([100, 140, 100, 104, 101, 150], ("kept", 46 / 140)),  # every T beats every R, +40 %
        ([100, 115, 112, 125, 116, 122], ("undecided", 16 / 112)),  # +9 %, but 116 > 115
        ([100, 118, 100, 88], ("reverted", 30 / 103)),  # the trial's mean gains under 5 %
        ([100, 115, 100, 125], ("kept", 10 / 120)),  # +20 % against 8 % noise
        ([100, 112, 108, 110], ("undecided", 8 / 104)),  # +6.7 %: under 2x min_gain, no 3rd
    ],
)
def test_judge_reads_alternating_windows(rates: list[float], expected: tuple[str, object]) -> None:
    verdict, noise = judge([float(r) for r in rates], 0.05)
    assert (verdict, noise) == (expected[0], pytest.approx(expected[1]))


def test_limits_stop_the_loop_and_the_user_worker_cap_applies() -> None:
    lp = loop(max_trials=0)
    lp.record_baseline(window(100.0), data_bound())
    assert lp.decide(SETTINGS, device_type="cpu", now=0.0) == Stop("max_trials=0 reached")
    capped = loop(max_workers=0)
    capped.record_baseline(window(100.0), data_bound())
    assert capped.decide(SETTINGS, device_type="cpu", now=0.0) == Stop(
        "no auto-applicable knob left for the data_pipeline bottleneck"
    )
    plan = Try("loader plan", {"num_workers": 4}, "4 workers reach the target")
    planned = loop()
    planned.record_baseline(window(100.0), data_bound())
    # Data-bound: the loop asks for the loader measured alone, then tries what it proposes.
    assert planned.decide(SETTINGS, device_type="cpu", now=0.0, plan=ASK) == MeasureLoader()
    assert planned.decide(SETTINGS, device_type="cpu", now=0.0, plan=plan) == plan
    nothing = planned.decide(SETTINGS, device_type="cpu", now=0.0, plan=None)  # it proposed nothing
    assert nothing == Try("num_workers", {"num_workers": 1}, "a worker overlaps loading")
    unplanned = loop()
    unplanned.record_baseline(window(100.0), compute())  # not data-bound: no loader measurement
    assert unplanned.decide(SETTINGS, device_type="cpu", now=0.0, plan=ASK) == Stop(
        "no auto-applicable knob left for the compute bottleneck"
    )


def test_math_knobs_are_asked_for_only_when_no_loader_knob_is_left() -> None:
    lp = loop()
    lp.record_baseline(window(100.0), compute())
    assert lp.decide(SETTINGS, device_type="cpu", now=0.0, math=ASK) == AskMath("compute")
    bf16 = Try("precision", {"precision": "bf16-mixed"}, "compute bottleneck: mixed precision")
    assert lp.decide(SETTINGS, device_type="cpu", now=0.0, math=bf16) == bf16
    assert lp.decide(SETTINGS, device_type="cpu", now=0.0, math=None) == Stop(
        "no auto-applicable knob left for the compute bottleneck"
    )
    data = loop()
    data.record_baseline(window(100.0), data_bound())  # a loader knob is left: no question
    assert isinstance(data.decide(SETTINGS, device_type="cpu", now=0.0, math=ASK), Try)
    assert Stop("x").to_dict() == {"reason": "x"} and bf16.to_dict()["knob"] == "precision"


def compute_with_busy_workers(workers: int) -> tuple[Diagnosis, ...]:
    rec = Recommendation("num_workers", workers, workers // 2, "workers take the CPUs", True)
    return (
        Diagnosis(BottleneckKind.COMPUTE, 0.8, "the step is the limit", recommendations=(rec,)),
    )


def test_fewer_workers_are_tried_past_the_users_cap_and_never_back_once_kept() -> None:
    lp = loop(max_workers=2)  # the cap limits growth only: 4 -> 2 is tried with it
    lp.record_baseline(window(100.0), compute_with_busy_workers(4))
    change = lp.decide(SETTINGS | {"num_workers": 4}, device_type="cpu", now=0.0)
    assert change == Try("num_workers", {"num_workers": 2}, "workers take the CPUs")
    lp.start("num_workers", {"num_workers": 4}, {"num_workers": 2}, "why", step=12)
    measure(lp, 70.0, compute())
    measure(lp, 99.0, compute())
    trial = measure(lp, 71.0, data_bound())
    assert isinstance(trial, KnobTrial) and trial.kept
    # The data-bound diagnosis would now want more workers; 4 was measured slower: not again.
    more = (
        Diagnosis(
            BottleneckKind.DATA_PIPELINE,
            0.9,
            "waits",
            recommendations=(Recommendation("num_workers", 2, 4, "more", True),),
        ),
    )
    lp.ref_found = more
    assert isinstance(lp.decide(SETTINGS | {"num_workers": 2}, device_type="cpu", now=0.0), Stop)


def test_automatic_changes_the_loop_did_not_try_say_why_in_the_report() -> None:
    from lightning_maxtp.tuning.trials import labelled_untried

    found = labelled_untried(data_bound(), "the tuning budget was spent (3.8 s of 2.1 s)")
    recs = found[0].recommendations
    assert recs[0].reason == (
        "a worker overlaps loading; not tried: the tuning budget was spent (3.8 s of 2.1 s)"
    )
    assert recs[0].auto_apply and "not tried" in str(recs[1])
    assert recs[2].reason == "pre-encode", "an opt-in change is the user's to make, unlabelled"


def test_a_trial_carries_the_gain_its_recommendation_predicts() -> None:
    lp = loop()
    rec = Recommendation("num_workers", 0, 2, "reads wait", True, expected_gain=1.3)
    lp.record_baseline(
        window(100.0), (Diagnosis(BottleneckKind.STORAGE, 0.9, "reads", recommendations=(rec,)),)
    )
    assert lp.decide(SETTINGS, device_type="cpu", now=0.0) == Try(
        "num_workers", {"num_workers": 2}, "reads wait", 1.3
    )


def test_a_loader_plan_does_not_bring_back_settings_measured_slower() -> None:
    lp = loop()
    lp.record_baseline(window(100.0), data_bound())
    lp.tried = {("num_workers", "4")}  # a kept 4 -> 0 trial replaced them
    plan = Try("loader plan", {"num_workers": 4, "prefetch_factor": 4}, "measured alone")
    assert lp.decide(SETTINGS, device_type="cpu", now=0.0, plan=plan) != plan
    other = Try("loader plan", {"num_workers": 2, "prefetch_factor": 4}, "measured alone")
    assert lp.decide(SETTINGS, device_type="cpu", now=0.0, plan=other) == other


def test_a_capped_worker_change_already_tried_is_not_offered_again() -> None:
    from lightning_maxtp.tuning.trials import next_change

    recs = (Recommendation("num_workers", 0, 6, "more workers", True),)
    found = (Diagnosis(BottleneckKind.DATA_PIPELINE, 0.9, "waits", recommendations=recs),)
    assert next_change(found, SETTINGS, set(), max_workers=2) == ("num_workers", 2, "more workers")
    # The capped value (2), not the proposed one (6), is what was tried or skipped.
    assert next_change(found, SETTINGS, {("num_workers", "2")}, max_workers=2) is None


def test_without_the_loader_s_settings_only_the_other_knobs_are_proposed() -> None:
    from lightning_maxtp.tuning.trials import next_change

    recs = (
        Recommendation("num_workers", 1, 0, "fewer workers", True),
        Recommendation("intra_op_threads", 2, 1, "a worker shares the cores", True),
    )
    found = (Diagnosis(BottleneckKind.COMPUTE, 0.9, "busy", recommendations=recs),)
    threads = {"intra_op_threads": 2}
    assert next_change(found, {**SETTINGS, "num_workers": 1, **threads}, set())[0] == "num_workers"
    # A train loader that cannot be switched has no settings in force: its knobs are skipped.
    rec = ("intra_op_threads", 1, "a worker shares the cores")
    assert next_change(found, threads, set()) == rec


def test_the_report_says_why_the_knobs_of_a_loader_never_switched_were_not_tried() -> None:
    from lightning_maxtp.tuning.trials import labelled_untried, remaining

    recs = (
        Recommendation("prefetch_factor", 2, 4, "deeper read-ahead", True),
        Recommendation("intra_op_threads", 2, 1, "a worker shares the cores", True),
    )
    found = (Diagnosis(BottleneckKind.DATA_PIPELINE, 0.9, "waits", recommendations=recs),)
    # Without the loader's settings (it was never switched) its workers' knobs stay.
    kept = remaining(found, set(), {"intra_op_threads": 2})
    assert [r.knob for r in kept[0].recommendations] == ["prefetch_factor", "intra_op_threads"]
    why = "the train loader is a StreamingDataLoader, not a plain torch DataLoader"
    labelled = labelled_untried(kept, "tuning had stopped", loader_why=why)
    reasons = [r.reason for r in labelled[0].recommendations]
    assert reasons == [f"deeper read-ahead; not tried: {why}",
                       "a worker shares the cores; not tried: tuning had stopped"]  # fmt: skip


def test_tuning_that_converged_stays_converged_after_one_more_trial_stopped_by_a_budget() -> None:
    lp = loop()
    lp.record_baseline(window(100.0), compute())
    lp.stop("no auto-applicable knob left for the compute bottleneck", now=0.0)
    assert lp.converged and lp.finished
    lp.resume(window(100.0), data_bound(), now=0.0)
    assert lp.ref_found == data_bound()
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 1}, "why", step=40)
    trial = measure(lp, 50.0, compute())  # looks like a gain: re-measured...
    assert trial is None
    lp.stop("tuning cost budget spent: 1.0 s of 1.0 s", now=0.0)  # ...but the budget ends it
    assert lp.converged, "the settings before the extra trial had converged"


def predicted(*recs: Recommendation) -> tuple[Diagnosis, ...]:
    return (Diagnosis(BottleneckKind.DATA_PIPELINE, 0.9, "waits on data", recommendations=recs),)


def test_a_modelled_change_is_tried_at_once_and_one_the_judge_could_not_keep_is_not() -> None:
    lp = loop()
    two = Recommendation("num_workers", 0, 2, "the job model predicts", True, expected_gain=0.8)
    # A prediction replaces measuring the loader alone: no MeasureLoader is asked for.
    lp.record_baseline(window(100.0), predicted(two))
    change = lp.decide(SETTINGS, device_type="cpu", now=0.0, plan=ASK)
    assert change == Try("num_workers", {"num_workers": 2}, "the job model predicts", 0.8)
    # Without a prediction the loader is measured alone first, as before.
    lp.record_baseline(window(100.0), data_bound())
    assert lp.decide(SETTINGS, device_type="cpu", now=0.0, plan=ASK) == MeasureLoader()
    # A predicted +12 %: two pairs keep 15 % at the least, so it is not worth a trial.
    small = Recommendation("num_workers", 0, 1, "barely", True, expected_gain=0.12)
    lp.record_baseline(window(100.0), predicted(small, two))
    assert lp.next_try(lp.ref_found, SETTINGS, device_type="cpu") == Try(
        "num_workers", {"num_workers": 2}, "the job model predicts", 0.8
    )
    # Workers the model ranks best persistent are tried with their persistence, in one trial.
    both = dataclasses.replace(two, also=(("persistent_workers", True),))
    assert lp.next_try(predicted(both), SETTINGS, device_type="cpu") == Try(
        "num_workers", {"num_workers": 2, "persistent_workers": True}, "the job model predicts", 0.8
    )


def test_a_trial_that_misses_its_prediction_re_ranks_the_next_change_the_same_way() -> None:
    lp = loop()
    two = Recommendation("num_workers", 0, 2, "m", True, expected_gain=1.0)
    three = Recommendation("num_workers", 0, 3, "m", True, expected_gain=0.3)
    lp.record_baseline(window(100.0), predicted(two, three))
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 2}, "m", 12, expected_gain=1.0)
    for step_ms in (101.0, 100.0):  # T1 misses a large prediction: R2, then T2
        assert measure(lp, step_ms, compute()) is None
    trial = measure(lp, 101.0, compute())  # predicted 2x, measured no faster: reverted
    assert isinstance(trial, KnobTrial) and trial.verdict == "reverted"
    assert trial.expected_gain == 1.0 and "predicted +100%" in str(trial)
    # 3 workers were predicted +30 %: scaled by the miss (1 - 1 %) / 2, under any gain.
    assert lp.next_try(lp.ref_found, SETTINGS, device_type="cpu") is None
    # Fewer workers (the other direction) are not re-ranked by it.
    fewer = Recommendation("num_workers", 4, 1, "m", True, expected_gain=0.3)
    change = lp.next_try(predicted(fewer), SETTINGS | {"num_workers": 4}, device_type="cpu")
    assert change is not None and change.expected_gain == 0.3


def test_after_a_kept_change_a_knob_that_lost_before_it_gets_one_more_try() -> None:
    lp = loop()
    lp.record_baseline(window(100.0), data_bound())
    lp.start("prefetch_factor", {"prefetch_factor": 2}, {"prefetch_factor": 4}, "m", 12)
    assert isinstance(measure(lp, 101.0, compute()), KnobTrial)  # reverted
    assert ("prefetch_factor", "4") in lp.tried
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 2}, "m", 30)
    for step_ms in (50.0, 100.0):  # T1, R2
        assert measure(lp, step_ms, compute()) is None
    kept = measure(lp, 50.0, compute())  # T2
    assert isinstance(kept, KnobTrial) and kept.kept
    # Knobs interact: the deeper prefetch may be tried once more under the new settings...
    assert ("prefetch_factor", "4") not in lp.tried
    assert ("num_workers", "0") in lp.tried  # ...never the settings the kept change replaced
    lp.start("prefetch_factor", {"prefetch_factor": 2}, {"prefetch_factor": 4}, "m", 60)
    assert isinstance(measure(lp, 51.0, compute()), KnobTrial)  # lost again
    lp.start("num_workers", {"num_workers": 2}, {"num_workers": 3}, "m", 80)
    for step_ms in (25.0, 50.0):
        assert measure(lp, step_ms, compute()) is None
    assert isinstance(measure(lp, 25.0, compute()), KnobTrial)  # kept again
    assert ("prefetch_factor", "4") in lp.tried  # once only


def test_a_first_window_that_misses_a_large_prediction_is_measured_again() -> None:
    lp = loop()
    lp.record_baseline(window(100.0), data_bound())
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 2}, "m", 12, expected_gain=0.8)
    # The trial's first window no faster (an epoch start in it, another job's burst): one
    # window against a measured prediction of +80 % is not yet a verdict.
    assert lp.judge(window(99.0)) == Remeasure("old")
    assert measure(lp, 99.0, compute()) is None  # T1
    assert measure(lp, 100.0, compute()) is None  # R2
    trial = measure(lp, 101.0, compute())  # T2: no faster again
    assert isinstance(trial, KnobTrial) and trial.verdict == "reverted" and trial.windows == 4
    # Without a prediction, one losing window reverts at once.
    lp.start("prefetch_factor", {"prefetch_factor": 2}, {"prefetch_factor": 4}, "m", 40)
    assert lp.judge(window(101.0)) == "reverted"


def test_a_compiles_settle_goes_on_while_its_steps_still_compile() -> None:
    from lightning_maxtp.tuning.tuning_loop import MAX_EXTRA_SETTLE, STILL_SETTLING

    lp = loop(settle_steps=2)
    assert [lp.on_step(switched=False, now=0.0) for _ in range(2)] == [False, True]
    lp.record_baseline(window(50.0), compute())
    lp.start("compile", {"compile": False}, {"compile": True}, "fuses kernels", step=12)
    assert lp.settle_left == 2 and not lp.settle_longer(30.0)  # only at the last one
    assert lp.on_step(switched=True, now=0.0) is False and lp.settle_left == 1
    # A 30 s compile step, then a recompile: two more settle steps; a step near the
    # reference's 50 ms again ends the settle and the window starts.
    for slow_s in (30.0, 4.0):
        assert lp.settle_longer(slow_s)
        lp.extend_settle()
        assert lp.on_step(switched=True, now=0.0) is False and lp.settle_left == 1
    assert not lp.settle_longer(STILL_SETTLING * 0.05 * 0.9)
    assert lp.on_step(switched=True, now=0.0) is True and lp.phase == "trial"
    # A model that recompiles at every step is measured as it is after MAX_EXTRA_SETTLE.
    lp2 = loop(settle_steps=1)
    [lp2.on_step(switched=False, now=0.0) for _ in range(2)]
    lp2.record_baseline(window(50.0), compute())
    lp2.start("compile", {"compile": False}, {"compile": True}, "fuses kernels", step=12)
    for _ in range(MAX_EXTRA_SETTLE):
        assert lp2.settle_longer(30.0)
        lp2.extend_settle()
        assert lp2.on_step(switched=True, now=0.0) is False
    assert not lp2.settle_longer(30.0)


def test_a_settle_after_workers_start_lasts_until_their_queued_batches_are_used() -> None:
    lp = loop(settle_steps=2)
    assert [lp.on_step(switched=False, now=0.0) for _ in range(2)] == [False, True]
    lp.record_baseline(window(50.0), data_bound())
    lp.start("num_workers", {"num_workers": 0}, {"num_workers": 3}, "reads wait", step=12)
    assert not lp.draining(9)  # only at the last settle step
    assert lp.on_step(switched=True, now=0.0) is False and lp.settle_left == 1
    # 3 workers, prefetch 2: 9 batches may be ready when they start; 2 settle steps, 7 more.
    extra = 0
    while lp.draining(9):
        lp.extend_settle()
        extra += 1
        assert lp.on_step(switched=True, now=0.0) is False
    assert extra == 7
    assert lp.on_step(switched=True, now=0.0) is True and lp.phase == "trial"
    # A switch that starts no workers (or fewer batches than the settle): no longer settle.
    lp2 = loop(settle_steps=2)
    [lp2.on_step(switched=False, now=0.0) for _ in range(2)]
    lp2.record_baseline(window(50.0), data_bound())
    lp2.start("num_workers", {"num_workers": 4}, {"num_workers": 0}, "contention", step=12)
    lp2.on_step(switched=True, now=0.0)
    assert not lp2.draining(0) and not lp2.draining(2)


def test_decide_is_a_function_of_its_inputs_the_clock_one_of_them() -> None:
    # Two loops fed the same windows decide the same, however long apart they are asked;
    # ``time_budget_s`` counts on the caller's clock from the end of the warm-up.
    def fed() -> TuningLoop:
        lp = loop(time_budget_s=10.0)
        [lp.on_step(switched=False, now=100.0) for _ in range(2)]
        lp.record_baseline(window(100.0), data_bound())
        return lp

    first, second = fed(), fed()
    for now in (100.0, 109.9):
        assert first.decide(SETTINGS, device_type="cpu", now=now) == second.decide(
            SETTINGS, device_type="cpu", now=now
        )
        assert isinstance(first.decide(SETTINGS, device_type="cpu", now=now), Try)
    assert first.decide(SETTINGS, device_type="cpu", now=110.0) == Stop("time_budget_s=10 spent")
    assert first.time_left(109.9) and not first.time_left(110.0)
    first.stop("done", now=104.0)
    assert first.summary(SETTINGS, (), now=500.0).tuning_s == 4.0  # fixed when it stopped
    assert second.summary(SETTINGS, (), now=103.0).tuning_s == 3.0  # still under way


def test_the_warm_up_lasts_until_the_first_queue_of_workers_is_used_never_less() -> None:
    lp = loop(warmup_steps=5)
    lp.drain_first(3)  # fewer queued batches than the warm-up: it stays
    assert lp.warmup_steps == 5
    lp.drain_first(12)
    assert [lp.on_step(switched=True, now=0.0) for _ in range(12)] == [False] * 11 + [True]
    assert lp.phase == "baseline"


def test_a_re_measure_costs_the_slower_sides_window_and_without_one_only_sure_gains_stay() -> None:
    # R1 = 100 ms a step, T1 = 80 ms: the trial looks 25 % faster. Measuring the reference
    # again runs 10 steps of 32 samples at its rate, 1 s where the trial's rate takes 0.8 s.
    lp = loop()
    [lp.on_step(switched=False, now=0.0) for _ in range(2)]
    lp.record_baseline(window(100.0), data_bound())
    lp.start("num_workers", {"num_workers": 4}, {"num_workers": 0}, "why", step=12)
    assert lp.judge(window(80.0)) == Remeasure("old")
    assert lp.remeasure_loss_s(window(80.0), "old") == pytest.approx(1.0 - 0.8)
    assert lp.remeasure_loss_s(window(80.0), "new") == 0.0  # the faster side loses nothing
    # Unpaid, one pair without a prediction is no evidence: the original comes back.
    assert lp.without_remeasure(window(80.0)) == "undecided"
    assert lp.without_remeasure(window(120.0)) == "reverted"
    # R2 closes and the trial's re-measure is unpaid: the reference's settings, in force, stay.
    assert measure(lp, 80.0, compute()) is None  # T1, then the reference again
    assert lp.without_remeasure(window(98.0)) == "undecided"
    assert measure(lp, 98.0, data_bound()) is None  # R2, then the trial again
    # Two pairs that earn a third (every trial window faster, 2x min_gain) are kept unpaid;
    # 10 more steps at the reference's mean rate (99 ms a step) against the trial's (81 ms).
    assert lp.remeasure_loss_s(window(82.0), "old") == pytest.approx(0.18, abs=0.005)
    assert lp.without_remeasure(window(82.0)) == "kept"
    assert lp.without_remeasure(window(99.5)) == "undecided"  # T2 no faster than R1


def test_an_unpaid_re_measure_keeps_a_first_pair_that_confirms_its_prediction() -> None:
    lp = loop()
    [lp.on_step(switched=False, now=0.0) for _ in range(2)]
    lp.record_baseline(window(100.0), data_bound())
    lp.start("num_workers", {"num_workers": 4}, {"num_workers": 0}, "why", step=12,
             expected_gain=0.3)  # fmt: skip
    assert lp.without_remeasure(window(80.0)) == "kept"  # +25 %: half of +30 % and more
    assert lp.without_remeasure(window(90.0)) == "undecided"  # +11 %: under half
