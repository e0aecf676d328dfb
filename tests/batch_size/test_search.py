"""The pure search: exact order of sizes, the cap, bisection, margin, budget, RAM guard, knee."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lightning_maxtp.batch_size.search import SearchOutcome, TrialResult, knee, search_batch_size


class FakeTrial:
    """Fits up to ``threshold``; throughput, seconds and peak memory are functions of the size."""

    def __init__(
        self,
        threshold: int,
        rate: Callable[[int], float] = lambda b: 5000 * b / (b + 4),
        seconds: Callable[[int], float] = lambda b: 0.0,
        peak: Callable[[int], int | None] = lambda b: None,
    ) -> None:
        self.threshold, self.rate, self.seconds, self.peak = threshold, rate, seconds, peak
        self.calls: list[tuple[int, bool]] = []

    def __call__(self, batch_size: int, timed: bool) -> TrialResult:
        self.calls.append((batch_size, timed))
        if batch_size > self.threshold:
            return TrialResult(batch_size, False, seconds=self.seconds(batch_size), error="OOM")
        rate = self.rate(batch_size) if timed else None
        return TrialResult(batch_size, True, rate, self.peak(batch_size), self.seconds(batch_size))


def search(trial: FakeTrial, **kwargs: object) -> SearchOutcome:
    args: dict[str, object] = dict(init=2, cap=8192, margin=0.2, tolerance=0.03, time_budget_s=20.0)
    args.update(kwargs)
    return search_batch_size(trial, **args)  # type: ignore[arg-type]


def test_doubles_bisects_to_the_exact_ceiling_then_times_the_safe_maximum() -> None:
    trial = FakeTrial(threshold=100)
    out = search(trial)
    assert trial.calls == [
        (2, True), (4, True), (8, True), (16, True), (32, True), (64, True), (128, True),
        (96, True),  # 96 <= 0.8 * 127: may end up under the margin, so it is timed
        (112, False), (104, False), (100, False), (102, False), (101, False),  # fit checks
        (80, True),  # throughput still rising at 64, the largest timed size under 80
    ]  # fmt: skip
    assert [t.phase for t in out.trials] == ["double"] * 7 + ["bisect"] * 6 + ["refine"]
    assert (out.ceiling, out.first_oom, out.safe_max, out.bound) == (100, 101, 80, "memory")
    # 5000 b / (b + 4): 64 -> 4705.9 is within 3 % of 80 -> 4761.9; 32 -> 4444.4 is not.
    assert (out.fastest, out.best) == (64, 80)


def test_picks_the_throughput_knee_not_the_ceiling_on_the_measured_h200_curve() -> None:
    # The reference job's anchors (ResNet-50, bf16, H200): 256/512/2048 -> 4720/4938/5055
    # images/s, and
    # BatchSizeFinder's binsearch pick of 3100 as the planted ceiling.
    rates = {256: 4720.0, 512: 4938.0, 1024: 5000.0, 2048: 5055.0, 2480: 5058.0, 3072: 5060.0}
    trial = FakeTrial(3100, rate=lambda b: rates.get(b, 18.0 * b))
    out = search(trial)
    assert [b for b, _ in trial.calls] == [
        2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
        3072, 3584, 3328, 3200, 3136, 3104, 3088, 3096, 3100, 3102, 3101, 2480,
    ]  # fmt: skip
    assert (out.ceiling, out.safe_max) == (3100, 2480)
    assert (out.fastest, out.best) == (512, 2480)  # 4938 >= 0.97 * 5058; 256's 4720 is not


def test_cap_is_tested_itself_and_never_exceeded() -> None:
    # Lightning's power mode returns 512 for max_val=300 without trying it; the cap is a trial.
    trial = FakeTrial(threshold=1000)
    out = search(trial, cap=300)
    assert [b for b, _ in trial.calls] == [2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert out.trials[-1].phase == "cap" and out.trials[-1].fits
    assert (out.bound, out.ceiling, out.safe_max) == ("cap", None, 300)
    assert out.fastest is not None and out.fastest <= 300


def test_a_cap_that_does_not_fit_starts_the_bisection() -> None:
    trial = FakeTrial(threshold=290)
    out = search(trial, cap=300)
    sizes = [b for b, _ in trial.calls]
    assert sizes == [2, 4, 8, 16, 32, 64, 128, 256, 300, 278, 289, 294, 291, 290, 232]
    assert (out.ceiling, out.first_oom, out.safe_max) == (290, 291, 232)
    assert max(sizes) == 300


def test_when_the_first_size_fails_the_search_bisects_down() -> None:
    trial = FakeTrial(threshold=1)
    out = search(trial, init=2)
    assert trial.calls == [(2, True), (1, False), (1, True)]
    assert (out.ceiling, out.safe_max, out.fastest) == (1, 1, 1)


def test_nothing_fits() -> None:
    trial = FakeTrial(threshold=0)
    out = search(trial, init=4)
    assert [b for b, _ in trial.calls] == [4, 2, 1]
    assert (out.largest_fit, out.fastest, out.first_oom) == (0, None, 1)


def test_time_budget_stops_before_a_trial_that_would_overrun() -> None:
    trial = FakeTrial(threshold=10_000, seconds=lambda b: 0.01 * b)
    out = search(trial, time_budget_s=1.0)
    # Spent after 32: 0.62 s; the estimate for 64 (0.32 * 2 = 0.64 s) would pass 1.0 s.
    assert [b for b, _ in trial.calls] == [2, 4, 8, 16, 32]
    assert out.bound == "time_budget" and out.budget_exhausted and out.ceiling is None
    assert sum(t.seconds for t in out.trials) <= 1.0
    assert out.safe_max == 32 and out.fastest == 32


def test_one_time_costs_of_the_first_trial_are_not_extrapolated() -> None:
    calls: list[int] = []

    def seconds(b: int) -> float:
        calls.append(b)
        return 0.1 * b + (3.0 if len(calls) == 1 else 0.0)  # the first trial pays 3 s once

    trial = FakeTrial(threshold=10_000, seconds=seconds)
    out = search(trial, time_budget_s=5.0)
    # 2 -> 3.2 s, 4 -> 0.4 s; then a line through the last two: 8 -> 0.8 s fits (4.4 s spent),
    # 16 -> 1.6 s would not. Scaling the first trial alone would have stopped before 4.
    assert [b for b, _ in trial.calls] == [2, 4, 8]
    assert out.budget_exhausted and out.bound == "time_budget"


def test_memory_limit_skips_sizes_projected_over_it_without_running_them() -> None:
    # The CPU guard: peak = 1000 + 10 b, limit 1500 -> 50 is the largest size allowed.
    trial = FakeTrial(threshold=10_000, peak=lambda b: 1000 + 10 * b)
    out = search(trial, memory_limit_bytes=1500)
    sizes = [t.batch_size for t in out.trials]
    assert sizes == [2, 4, 8, 16, 32, 64, 48, 56, 52, 50, 51, 40]
    assert [b for b, _ in trial.calls] == [2, 4, 8, 16, 32, 48, 50, 40]  # 64/56/52/51 not run
    skipped = next(t for t in out.trials if t.batch_size == 64)
    assert not skipped.fits and skipped.error is not None and "projected peak" in skipped.error
    assert (out.ceiling, out.safe_max, out.bound) == (50, 40, "memory")


def test_measured_peak_over_the_limit_counts_as_not_fitting() -> None:
    trial = FakeTrial(threshold=10_000, peak=lambda b: 10_000 if b >= 8 else 100)
    out = search(trial, memory_limit_bytes=5000, margin=0.0)
    assert trial.calls == [(2, True), (4, True), (8, True), (6, True), (7, True)]
    assert out.trials[2].error is not None and out.trials[2].error.startswith("peak")
    assert out.ceiling == 7 and out.trials[2].samples_per_s is None and out.fastest == 7


def test_zero_tolerance_and_margin_pick_the_best_measured() -> None:
    trial = FakeTrial(threshold=64, rate=lambda b: {16: 900.0}.get(b, float(b)))
    out = search(trial, margin=0.0, tolerance=0.0)
    assert (out.ceiling, out.safe_max, out.best, out.fastest) == (64, 64, 16, 16)


def test_knee_ignores_rows_that_did_not_fit_or_were_not_timed() -> None:
    rows = [
        TrialResult(8, True, 100.0),
        TrialResult(16, True, 98.0),
        TrialResult(32, True, None),
        TrialResult(64, False, None, error="OOM"),
    ]
    assert knee(rows, 0.03) == (8, 8)
    assert knee(rows, 0.0) == (8, 8)
    assert knee([TrialResult(4, False)], 0.03) is None


def test_trial_result_is_json_safe_and_readable() -> None:
    row = TrialResult(8, True, 12.5, 3 * 2**29, 0.5, None, "double")
    assert str(row) == "batch 8: fits, 12.5 samples/s, peak 1.50 GiB"
    assert str(TrialResult(16, False, error="OOM")) == "batch 16: does not fit (OOM)"
    assert row.to_dict() == {
        "batch_size": 8, "fits": True, "samples_per_s": 12.5, "peak_memory_bytes": 3 * 2**29,
        "seconds": 0.5, "error": None, "phase": "double",
    }  # fmt: skip


@pytest.mark.parametrize("init,cap", [(8, 8), (3, 5)])
def test_small_ranges(init: int, cap: int) -> None:
    trial = FakeTrial(threshold=100)
    out = search(trial, init=init, cap=cap)
    assert [b for b, _ in trial.calls] == ([8] if cap == 8 else [3, 5])
    assert out.bound == "cap" and out.safe_max == cap
