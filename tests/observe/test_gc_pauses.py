"""GC pauses timed through ``gc.callbacks``: counted, summarized per span, never left installed."""

from __future__ import annotations

import gc
import time

import pytest

from lightning_maxtp.observe.gc_pauses import GcPauses


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def _cycles(n: int) -> None:
    """``n`` reference cycles left for the collector."""
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a


def test_every_collection_is_timed_and_summarized_for_its_span() -> None:
    pauses = GcPauses()
    pauses.install()
    pauses.install()  # idempotent
    try:
        start = time.perf_counter()
        _cycles(20_000)
        gc.collect()  # a full collection, timed
        end = time.perf_counter()
    finally:
        pauses.uninstall()
    assert not pauses.installed and pauses._callback not in gc.callbacks
    summary = pauses.summary(start, end, step_s=end - start)
    assert summary.count >= 1 and summary.gen2 >= 1
    assert 0 < summary.longest_s <= summary.total_s <= end - start
    assert 0 < summary.share <= 1
    assert "collection(s)" in str(summary) and summary.to_dict()["gen2"] == summary.gen2
    # Nothing ended outside the span; nothing is timed once uninstalled.
    assert pauses.summary(end + 1, end + 2, 1.0).count == 0
    before = len(pauses.pauses)
    gc.collect()
    assert len(pauses.pauses) == before


def test_a_collection_running_when_it_is_installed_is_not_counted_half() -> None:
    pauses = GcPauses(keep=2)
    pauses._callback("stop", {"generation": 0})  # the end of one that started before
    assert pauses.pauses == []
    for _ in range(3):
        pauses._callback("start", {"generation": 1})
        pauses._callback("stop", {"generation": 1})
    assert len(pauses.pauses) == 2, "the oldest beyond `keep` are dropped"
    with pytest.raises(ValueError, match=r"`keep` must be >= 1, got 0"):
        GcPauses(keep=0)


def test_only_pauses_inside_timed_steps_count_and_slow_full_ones_are_named() -> None:
    from lightning_maxtp.observe.gc_pauses import GcPause

    pauses = GcPauses()
    # Steps: [0, 1], [1, 2] and a slow one [5, 9] (validation ran in the gap 2..5).
    steps = [(1.0, 1.0), (2.0, 1.0), (9.0, 4.0)]
    pauses.pauses = [
        GcPause(0, 0.5, 0.1),  # inside step 1
        GcPause(2, 4.0, 0.5),  # in the gap: validation's, not a step's
        GcPause(2, 8.0, 2.0),  # a full one inside the slow step
    ]
    summary = pauses.summary(0.0, 9.0, 6.0, steps)
    assert (summary.count, summary.gen2, summary.slow_steps) == (2, 1, 1)
    assert summary.total_s == pytest.approx(2.1) and summary.share == pytest.approx(0.35)
    assert pauses.summary(0.0, 9.0, 6.0).count == 3  # without steps: the whole span
    pauses.clear_before(5.0)
    assert [p.end_s for p in pauses.pauses] == [8.0]
