"""The worker search rule on canned measurements: which settings it tries, in which order, and
which it keeps. The measurement is the hardware boundary; the rule itself runs for real."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lightning_maxtp.loader.candidate import LoaderCandidate, expected_rate, meets_target
from lightning_maxtp.loader.explain import explain
from lightning_maxtp.loader.order import persistence
from lightning_maxtp.loader.search import search

MIB = 2**20


class Table:
    """``measure`` from a rate function; records the ``(workers, prefetch)`` sequence tried."""

    def __init__(
        self,
        rate: Callable[[int, int | None], float],
        *,
        main_s: float = 0.0,
        worker_bytes: int = 10 * MIB,
        batch_bytes: int = MIB,
        calls_allowed: int = 100,
        cpu_share: float = 1.0,
    ) -> None:
        self.rate, self.main_s, self.cpu_share = rate, main_s, cpu_share
        self.worker_bytes, self.batch_bytes = worker_bytes, batch_bytes
        self.calls_allowed = calls_allowed
        self.tried: list[tuple[int, int | None]] = []

    def __call__(self, workers: int, prefetch: int | None) -> LoaderCandidate | None:
        if len(self.tried) >= self.calls_allowed:
            return None
        self.tried.append((workers, prefetch))
        r = self.rate(workers, prefetch)
        return LoaderCandidate(
            num_workers=workers,
            prefetch_factor=prefetch,
            pin_memory=False,
            samples_per_s=r,
            startup_s=0.1 * workers,
            timed_batches=20,
            timed_s=1.0,
            main_thread_s_per_sample=1 / r if workers == 0 else self.main_s,
            worker_memory_bytes=self.worker_bytes if workers else None,
            batch_bytes=self.batch_bytes,
            cpu_share=self.cpu_share if workers == 0 else None,
        )


def saturating(knee: int, per_worker: float = 100.0) -> Callable[[int, int | None], float]:
    """Rate grows linearly with workers up to ``knee``, flat after; 0 workers = 1 worker."""
    return lambda w, p: per_worker * min(max(w, 1), knee)


def test_grows_by_doubling_then_bisects_to_the_fewest_workers_at_the_knee() -> None:
    table = Table(saturating(knee=5))
    result = search(table, cpu_workers=8)
    # 4 -> 8 still gained 25 %, the cap stopped growth; bisection finds 5 as the fewest at best.
    assert table.tried == [(0, None), (1, 2), (2, 2), (4, 2), (8, 2), (6, 2), (5, 2), (5, 4)]
    assert result.stop == "cap"
    assert result.chosen is not None and result.chosen.num_workers == 5
    assert result.chosen.prefetch_factor == 2  # prefetch 4 gained nothing


def test_stops_growing_when_a_step_gains_less_than_five_percent() -> None:
    table = Table(lambda w, p: {0: 100, 1: 100, 2: 190, 4: 197}.get(w, 197))
    result = search(table, cpu_workers=16, try_deep_prefetch=False)
    # 2 -> 4 looked flat, so both were measured again (4 first) before growth stopped.
    assert table.tried == [(0, None), (1, 2), (2, 2), (4, 2), (4, 2), (2, 2)]
    assert result.stop == "no_gain"
    assert result.chosen is not None and result.chosen.num_workers == 2


def test_a_step_that_looked_flat_in_a_busy_moment_is_measured_again() -> None:
    calls: dict[int, int] = {}

    def rate(w: int, p: int | None) -> float:
        calls[w] = calls.get(w, 0) + 1
        return 100.0 if (w, calls[w]) == (2, 1) else 100.0 * max(w, 1)  # 2 was disturbed once

    table = Table(rate)
    result = search(table, cpu_workers=4, try_deep_prefetch=False)
    assert table.tried == [(0, None), (1, 2), (2, 2), (2, 2), (1, 2), (4, 2), (3, 2)]
    assert result.chosen is not None and result.chosen.num_workers == 4
    assert [c.samples_per_s for c in result.candidates if c.num_workers == 2] == [200.0]


def test_loading_in_main_process_wins_only_when_clearly_faster() -> None:
    # Assumed device as fast as the fastest loader: 0 workers halve it, so it must be > 2x.
    cheap = Table(lambda w, p: 300_000.0 if w == 0 else 50_000.0 * w, main_s=1e-5)
    result = search(cheap, cpu_workers=2)
    assert result.chosen is not None and result.chosen.num_workers == 0
    assert "workers do not measurably help" in explain(result, _budget(result), None, "").reason
    # As fast alone is not enough: with workers, loading overlaps with the step.
    heavy = Table(lambda w, p: 100.0 if w == 0 else 98.0)
    result = search(heavy, cpu_workers=1)
    assert result.chosen is not None and result.chosen.num_workers == 1
    reason = explain(result, _budget(result), None, "").reason
    assert "no more workers were tried: the cap is the CPU budget: 1 worker(s) (test)" in reason


def test_stops_at_the_target_and_takes_the_fewest_workers_reaching_it() -> None:
    table = Table(saturating(knee=16), main_s=1e-5)
    result = search(table, cpu_workers=16, consumption_rate=400.0)  # target 500/s
    assert table.tried == [(0, None), (1, 2), (2, 2), (4, 2), (8, 2), (6, 2), (5, 2)]
    assert result.stop == "target" and result.target_met
    assert result.chosen is not None and result.chosen.num_workers == 5


def test_main_process_meets_the_target_only_when_its_serial_cost_is_small() -> None:
    # 0 workers at 40x the consumption rate costs the step 2.4 %: good enough, no worker tried.
    table = Table(lambda w, p: 40_000.0 if w == 0 else 30_000.0)
    result = search(table, cpu_workers=8, consumption_rate=1_000.0)
    assert table.tried == [(0, None)]
    assert result.chosen is not None and result.chosen.num_workers == 0 and result.target_met


def test_memory_cap_limits_workers_and_says_so() -> None:
    table = Table(saturating(knee=16), worker_bytes=100 * MIB)
    result = search(table, cpu_workers=8, memory_bytes=250 * MIB)
    assert max(w for w, _ in table.tried) == 2
    assert result.memory_workers == 2 and result.limited_by == "memory"
    assert result.chosen is not None and result.chosen.num_workers == 2
    reason = explain(result, _budget(result, memory_bytes=250 * MIB), None, "").reason
    assert "RAM: each worker uses 100 MiB and 250 MiB are set aside for workers, so 2 fit" in reason


def test_loading_that_waits_on_reads_may_use_more_workers_than_cpus() -> None:
    # Loading in the main process keeps a CPU busy 20 % of the time: a worker costs a fifth
    # of a core, so the budget of 1 worker is raised to 1 / 0.2 = 5, at most 4 x 1.
    table = Table(saturating(knee=16), cpu_share=0.2)
    result = search(table, cpu_workers=1, try_deep_prefetch=False)
    assert table.tried == [(0, None), (1, 2), (2, 2), (4, 2), (3, 2)]  # 3: the bisection
    assert result.io_workers == 4 and result.max_workers == 4 and result.stop == "cap"
    assert result.chosen is not None and result.chosen.num_workers == 4
    reason = explain(result, _budget(result), None, "").reason
    raised = "raised to 4 because loading waits on I/O (the main process ran or waited for a CPU 20"
    assert raised in reason
    # The share sets the multiple below 4; a CPU-bound loader and a user cap are never raised.
    assert search(Table(saturating(16), cpu_share=0.4), cpu_workers=1).io_workers == 2
    assert search(Table(saturating(16), cpu_share=0.9), cpu_workers=1).io_workers is None
    capped = search(Table(saturating(16), cpu_share=0.2), cpu_workers=1, raise_for_io=False)
    assert capped.io_workers is None and capped.max_workers == 1


def test_shm_cap_counts_batches_in_flight() -> None:
    table = Table(saturating(knee=16), batch_bytes=100 * MIB)
    result = search(table, cpu_workers=8, shm_bytes=450 * MIB, try_deep_prefetch=False)
    assert result.shm_workers == 2 and result.limited_by == "shm"  # 2 batches per worker
    assert result.chosen is not None and result.chosen.num_workers == 2


def test_time_budget_ends_the_search_with_what_was_measured() -> None:
    table = Table(saturating(knee=16), calls_allowed=3)
    result = search(table, cpu_workers=16)
    assert table.tried == [(0, None), (1, 2), (2, 2)]
    assert result.stop == "time"
    assert result.chosen is not None and result.chosen.num_workers == 2


def test_shortfall_recommends_pre_encoding_and_gpu_decode() -> None:
    table = Table(saturating(knee=16))
    result = search(table, cpu_workers=2, consumption_rate=1_000.0)
    text = explain(result, _budget(result), 1_000.0, "")
    assert text.shortfall == pytest.approx(0.8)
    assert "80% short of the 1,000 samples/s the device consumes" in text.reason
    assert text.recommendations[0].startswith("num_workers: more than 2 would still help")
    assert any("pre-encode" in r for r in text.recommendations)
    assert any("decode_jpeg(..., device='cuda')" in r for r in text.recommendations)


def test_expected_rate_counts_the_main_threads_share_as_serial() -> None:
    c = Table(lambda w, p: 1000.0, main_s=0.0005)(1, 2)
    assert c is not None
    assert expected_rate(c, None) == 1000.0
    assert expected_rate(c, 1000.0) == pytest.approx(1 / (0.0005 + 0.001))
    assert not meets_target(c, 1000.0)  # 1000 < 1.25 x 1000
    assert meets_target(c, 800.0)  # the hand-off costs the same with any number of workers
    main = Table(lambda w, p: 1000.0)(0, None)
    assert main is not None and not meets_target(main, 800.0)  # serial: 444/s of 800


def test_persistence_follows_start_up_share_of_an_epoch() -> None:
    c = Table(lambda w, p: 100.0)(2, 2)  # start-up 0.2 s, 0.05 s per batch
    assert c is not None
    assert persistence(c, 100, "fork") == (
        True, "persistent workers: start-up 0.20 s is 4.0% of an epoch"
    )  # fmt: skip
    assert persistence(c, 10_000, "fork")[0] is False
    assert persistence(c, 10_000, "spawn")[0] is True
    assert persistence(c, None, "fork")[0] is True
    keep, why = persistence(c, 100, "fork", keeps_order=False)
    assert keep is False and "would change the shuffling order after the first epoch" in why


def test_goes_past_the_cpu_budget_while_each_step_gains_and_says_so() -> None:
    table = Table(saturating(knee=3))
    result = search(table, cpu_workers=1, ceiling=4)
    # Budget 1: past it, one worker at a time; 3 -> 4 looked flat and was measured again.
    assert table.tried == [(0, None), (1, 2), (2, 2), (3, 2), (4, 2), (4, 2), (3, 2), (3, 4)]
    assert result.stop == "no_gain"
    assert result.chosen is not None and result.chosen.num_workers == 3
    budget = _budget(result)
    assert budget.past_budget and budget.ceiling_workers == 4
    reason = explain(result, budget, None, "").reason
    assert "past the CPU budget of 1 worker(s)" in reason
    assert "4 workers (prefetch 2) gave +0%" in reason


def test_a_ram_cap_between_doubling_steps_is_measured() -> None:
    # 10 MiB per worker and 35 MiB for workers: 3 fit, between the doubling steps 2 and 4.
    table = Table(saturating(knee=8))
    result = search(table, cpu_workers=8, memory_bytes=35 * MIB, try_deep_prefetch=False)
    assert table.tried == [(0, None), (1, 2), (2, 2), (3, 2)]
    assert result.stop == "cap" and result.chosen is not None
    assert result.chosen.num_workers == 3 and result.limited_by == "memory"


def test_past_the_budget_a_flat_step_stops_the_search_at_the_budget() -> None:
    table = Table(saturating(knee=1))
    result = search(table, cpu_workers=1, ceiling=4, try_deep_prefetch=False)
    assert table.tried == [(0, None), (1, 2), (2, 2), (2, 2), (1, 2)]
    assert result.chosen is not None and result.chosen.num_workers == 1
    assert not _budget(result).past_budget


def test_past_the_budget_a_small_gain_is_measured_again_before_growing() -> None:
    # +8 % past the budget: over the 5 % threshold but under 10 %, so both sides run again.
    table = Table(lambda w, p: {0: 50, 1: 100, 2: 108}.get(w, 108))
    result = search(table, cpu_workers=1, ceiling=3, try_deep_prefetch=False)
    assert table.tried[:5] == [(0, None), (1, 2), (2, 2), (2, 2), (1, 2)]
    assert (3, 2) in table.tried
    assert result.chosen is not None and result.chosen.num_workers == 2


def test_reaching_the_ceiling_while_gaining_names_the_ceiling() -> None:
    table = Table(saturating(knee=8))
    result = search(table, cpu_workers=1, ceiling=4, try_deep_prefetch=False)
    assert result.stop == "cap" and result.chosen is not None
    assert result.chosen.num_workers == 4
    reason = explain(result, _budget(result), None, "").reason
    assert "the cap is the CPU ceiling of 4 worker(s), past the CPU budget: 1" in reason


def test_the_loaders_own_faster_setting_is_never_replaced_by_a_slower_one() -> None:
    table = Table(saturating(knee=8))
    result = search(table, cpu_workers=2, own=(4, 2), try_deep_prefetch=False)
    assert result.own_kept and result.chosen is not None
    assert (result.chosen.num_workers, result.chosen.prefetch_factor) == (4, 2)
    reason = explain(result, _budget(result), None, "").reason
    assert reason.startswith("the loader's own setting (4 workers, prefetch 2) is kept")


def test_a_search_cut_short_by_time_still_compares_with_the_loaders_own_setting() -> None:
    # The loader already has 4 workers; the time budget allows three measurements: the own
    # setting comes first, so the search's 1 worker cannot replace a faster own setting.
    table = Table(saturating(knee=8), calls_allowed=3)
    result = search(table, cpu_workers=8, own=(4, 2))
    assert table.tried == [(4, 2), (0, None), (1, 2)]
    assert result.stop == "time" and result.chosen is not None
    assert (result.chosen.num_workers, result.chosen.prefetch_factor) == (4, 2)


def test_a_close_win_over_the_loaders_own_setting_is_measured_again() -> None:
    # The own setting (8 workers) is 3 % slower than the pick (2 workers): measured again,
    # and the cheaper pick, still not slower, stays.
    table = Table(lambda w, p: {0: 50, 1: 100, 2: 200, 8: 194}.get(w, 200))
    result = search(table, cpu_workers=2, own=(8, 2), try_deep_prefetch=False)
    assert table.tried.count((8, 2)) == 2 and table.tried.count((2, 2)) >= 2
    assert not result.own_kept and result.chosen is not None
    assert result.chosen.num_workers == 2 and result.own is not None
    reason = explain(result, _budget(result), None, "").reason
    assert "the loader's own setting (8 workers, prefetch 2) gave 194" in reason


def _budget(result, *, memory_bytes=None):  # type: ignore[no-untyped-def]
    from lightning_maxtp.loader.budget import Limits, budget_from

    limits = Limits(
        result.cpu_workers, result.cpu_workers, "test", memory_bytes, None,
        ceiling_workers=result.ceiling_workers,
    )  # fmt: skip
    return budget_from(result, limits, 15.0)
