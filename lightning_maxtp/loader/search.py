"""The search behind ``tune_dataloader``: which DataLoader settings to measure, and which to keep.

Pure: it calls a ``measure(num_workers, prefetch_factor)`` function it is given (which runs the
real loader, see ``measure``) and decides from the numbers alone, so the rule can be
tested with canned measurements. The rule, from the project's seeds:

1. Measure loading in the main process (``num_workers=0``): the reference, and the winner for
   data sets so cheap that handing batches between processes costs more than it saves.
2. Grow workers 1, 2, 4, 8, ... while each step gains >= 5 % (a step that looks flat is
   measured again, both sides, before growth stops); stop as soon as the loader reaches 1.25x
   the consumption rate (when known). The CPU budget is where doubling stops, not where the
   search must: past it workers grow by half their number at a time, each step gaining >= 5 %
   (measured again when the gain is under 10 %), up to the ceiling (``worker_ceiling``), RAM
   and ``/dev/shm`` measured per worker. When loading in the main process keeps the CPU busy
   less than half the time it takes (it waits on reads: network storage, a slow disk), a
   worker costs that share of a core, so the CPU budget is divided by the share, at most
   ``IO_FACTOR`` times (the ``storage`` diagnosis uses the same multiple).
3. Bisect between the last two counts for the fewest workers within 5 % of the best (or the
   fewest that reach the target), so doubling never buys workers that do not measurably help.
4. At that count, try a deeper prefetch (4 instead of 2); keep it only if it gains >= 5 %.
5. Never slower than the loader's own setting: it is measured first (after nothing else, so a
   search the time budget cuts short still has it), and when the choice beats it by less than
   5 %, both are measured again; the choice must then still be faster (or as fast
   with fewer workers), else the loader's own setting stays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from lightning_maxtp.loader.candidate import (
    DEEP_PREFETCH,
    DEFAULT_PREFETCH,
    IO_BOUND_SHARE,
    LoaderCandidate,
    SearchResult,
    expected_rate,
    meets_target,
)
from lightning_maxtp.observe.thresholds import IO_WORKER_FACTOR as IO_FACTOR
from lightning_maxtp.observe.thresholds import MIN_GAIN

__all__ = ["IO_FACTOR", "search"]


class _Search:
    def __init__(
        self,
        measure: Callable[[int, int | None], LoaderCandidate | None],
        *,
        cpu_workers: int,
        consumption_rate: float | None,
        memory_bytes: int | None,
        shm_bytes: int | None,
        raise_for_io: bool,
        ceiling: int | None = None,
    ) -> None:
        self.measure, self.consumption, self.ceiling = measure, consumption_rate, ceiling
        self.cpu_workers, self.memory_bytes, self.shm_bytes = cpu_workers, memory_bytes, shm_bytes
        self.raise_for_io = raise_for_io
        self.io_workers: int | None = None
        self.memory_workers: int | None = None
        self.shm_workers: int | None = None
        self.tried: list[LoaderCandidate] = []
        self.out_of_time = False

    @property
    def budget(self) -> int:
        """The CPU budget (raised for I/O): doubling stops here, careful steps go on."""
        return self.io_workers or self.cpu_workers

    @property
    def cap(self) -> int:
        cpu = max(self.ceiling or 0, self.budget)
        caps = [cpu, self.memory_workers, self.shm_workers]
        return min(c for c in caps if c is not None)

    def next_count(self, workers: int) -> int:
        """Double up to the budget; past it, grow by half (at least one) up to the cap."""
        if workers < self.budget:
            return min(2 * workers, self.budget, self.cap)
        return min(workers + max(1, workers // 2), self.cap)

    def raise_cap_for_io(self, base: LoaderCandidate) -> None:
        """Divide the CPU budget by the CPU share of loading when it mostly waits on I/O."""
        share = base.cpu_share
        if not self.raise_for_io or not base.complete or share is None:
            return
        if share >= IO_BOUND_SHARE:
            return
        cpus = max(self.cpu_workers, 1)
        raised = min(IO_FACTOR * cpus, int(cpus / max(share, 1e-9)))
        if raised > self.cpu_workers:
            self.io_workers = raised

    @property
    def device_rate(self) -> float | None:
        """The consumption rate, or else the fastest loader rate measured (see ``search``)."""
        if self.consumption is not None:
            return self.consumption
        return max((c.samples_per_s for c in self.tried if c.complete), default=None)

    def scored(self, c: LoaderCandidate) -> LoaderCandidate:
        if self.consumption is None and c.num_workers > 0:
            # The hand-off costs the same with any number of workers: without a real device
            # rate to weigh it against, worker settings compare by the loader's own rate.
            return replace(c, expected_rate=c.samples_per_s)
        return replace(c, expected_rate=expected_rate(c, self.device_rate))

    def run(self, workers: int, prefetch: int | None) -> LoaderCandidate | None:
        for c in self.tried:
            if (c.num_workers, c.prefetch_factor) == (workers, prefetch):
                return self.scored(c)
        if self.out_of_time:
            return None
        candidate = self.measure(workers, prefetch)
        if candidate is None:
            self.out_of_time = True
            return None
        self._update_caps(candidate)
        if candidate.num_workers > self.cap:
            candidate = replace(candidate, note=self._over_cap_note(candidate.num_workers))
        elif not candidate.complete:
            candidate = replace(candidate, note="too few batches timed (time budget)")
        self.tried.append(candidate)
        return self.scored(candidate)

    def confirm(
        self, previous: LoaderCandidate, current: LoaderCandidate
    ) -> tuple[LoaderCandidate, LoaderCandidate]:
        """Measure both again and keep each one's faster run before calling a step flat.

        Another job's burst of CPU use only ever slows a measurement down, so a busy moment
        can hide a real gain but not invent one.
        """
        result = []
        for first in (current, previous):
            again = None
            if not self.out_of_time:
                again = self.measure(first.num_workers, first.prefetch_factor)
            if again is None:
                self.out_of_time = True
                result.append(first)
                continue
            self._update_caps(again)
            kept = first
            if again.complete and again.samples_per_s > first.samples_per_s:
                index = next(i for i, c in enumerate(self.tried) if c.key() == first.key())
                kept = self.tried[index] = replace(again, note=self.tried[index].note)
            result.append(self.scored(kept))
        return result[1], result[0]

    def _update_caps(self, c: LoaderCandidate) -> None:
        if c.num_workers == 0:
            return
        per_worker = max(x.worker_memory_bytes or 0 for x in [*self.tried, c])
        if self.memory_bytes is not None and per_worker > 0:
            self.memory_workers = int(self.memory_bytes // per_worker)
        if self.shm_bytes is not None and c.batch_bytes:
            in_flight = (c.prefetch_factor or DEFAULT_PREFETCH) * c.batch_bytes
            self.shm_workers = int(self.shm_bytes // in_flight)

    def _over_cap_note(self, workers: int) -> str:
        if self.memory_workers is not None and workers > self.memory_workers:
            return f"over the RAM budget ({self.memory_workers} workers fit)"
        if self.shm_workers is not None and workers > self.shm_workers:
            return f"over the /dev/shm budget ({self.shm_workers} workers fit)"
        return f"over the CPU cap ({self.cap} workers)"

    def eligible(self) -> list[LoaderCandidate]:
        """Complete candidates within the caps, scored as of now."""
        return [self.scored(c) for c in self.tried if c.complete and c.num_workers <= self.cap]

    def good_enough(self) -> Callable[[LoaderCandidate], bool]:
        """The test a chosen setting must pass, given everything measured so far."""
        eligible = self.eligible()
        if any(meets_target(c, self.consumption) for c in eligible):
            return lambda c: meets_target(self.scored(c), self.consumption)
        best = max((c.expected_rate for c in eligible), default=0.0)
        return lambda c: c.complete and self.scored(c).expected_rate * (1 + MIN_GAIN) >= best

    def grow(self) -> str:
        base = self.run(0, None)
        if base is not None and meets_target(base, self.consumption):
            return "target"
        if base is not None:
            self.raise_cap_for_io(base)
        previous: LoaderCandidate | None = None
        workers = 1
        while workers <= self.cap:
            current = self.run(workers, DEFAULT_PREFETCH)
            if current is None:
                return "time"
            if meets_target(current, self.consumption):
                return "target"
            # Past the budget a worker takes a core training or another rank may need: a gain
            # close to the threshold is measured again before the search goes on.
            close = (1 + 2 * MIN_GAIN) if workers > self.budget else (1 + MIN_GAIN)
            if previous is not None and current.samples_per_s < previous.samples_per_s * close:
                previous, current = self.confirm(previous, current)
                if current.samples_per_s < previous.samples_per_s * (1 + MIN_GAIN):
                    return "no_gain"
            if workers >= self.cap:
                return "cap"
            previous, workers = current, self.next_count(workers)
        return "time" if self.out_of_time else "cap"

    def trim(self) -> None:
        """Bisect for the fewest workers that pass ``good_enough`` (at the default prefetch)."""
        while not self.out_of_time:
            passing = self.good_enough()
            plain = {
                c.num_workers: c
                for c in self.eligible()
                if c.prefetch_factor == (None if c.num_workers == 0 else DEFAULT_PREFETCH)
            }
            good = sorted(w for w, c in plain.items() if passing(c))
            if not good:
                return
            hi = good[0]
            lo = max((w for w in plain if w < hi), default=0)
            mid = (lo + hi) // 2
            if hi - lo <= 1 or any(c.num_workers == mid for c in self.tried):
                return
            self.run(mid, DEFAULT_PREFETCH)

    def choose(self) -> LoaderCandidate | None:
        passing = self.good_enough()
        good = [c for c in self.eligible() if passing(c)]
        return min(good, key=LoaderCandidate.key) if good else None


def search(
    measure: Callable[[int, int | None], LoaderCandidate | None],
    *,
    cpu_workers: int,
    consumption_rate: float | None = None,
    memory_bytes: int | None = None,
    shm_bytes: int | None = None,
    try_deep_prefetch: bool = True,
    raise_for_io: bool = True,
    ceiling: int | None = None,
    own: tuple[int, int | None] | None = None,
) -> SearchResult:
    """Measure settings by the rule in the module docstring and pick the cheapest good one.

    Settings are compared by ``expected_rate``: what training reaches when the main thread's
    share of loading is serial with the step. Without a consumption rate, worker settings
    compare by the loader's own rate, and loading in the main process is scored against a
    device as fast as the fastest loader setting measured: it then wins only when it is more
    than about twice as fast as with workers (the loader-alone rate cannot show that workers
    overlap with the step; this assumption does).

    Args:
        measure: Runs the loader with ``(num_workers, prefetch_factor)``; returns ``None`` when
            the time budget does not allow another measurement.
        cpu_workers: Worker cap from the CPU budget.
        consumption_rate: Samples/s the training step consumes, if known.
        memory_bytes: RAM the workers may use together (``None``: unlimited).
        shm_bytes: ``/dev/shm`` the in-flight batches may use (``None``: unlimited).
        try_deep_prefetch: Whether to try ``prefetch_factor=4`` at the chosen worker count.
        raise_for_io: Whether ``cpu_workers`` may be raised when loading waits on I/O (off
            when the caller's own ``max_workers`` set it).
        ceiling: Most workers the search may reach past ``cpu_workers`` while each step
            still gains (``None``: ``cpu_workers`` is a hard cap).
        own: The loader's own ``(num_workers, prefetch_factor)``: the choice must not be
            slower than it (``None``: not compared).

    Returns:
        Every candidate in the order measured (scored), the chosen one and why growing stopped.
    """
    s = _Search(
        measure,
        cpu_workers=cpu_workers,
        consumption_rate=consumption_rate,
        memory_bytes=memory_bytes,
        shm_bytes=shm_bytes,
        raise_for_io=raise_for_io,
        ceiling=ceiling,
    )
    if own is not None and own[0] > 0:
        # Measured first, while the time budget lasts: a search cut short by it must still
        # be compared with what the loader already does (rule 5).
        s.run(*own)
    stop = s.grow()
    s.trim()
    chosen = s.choose()
    target_met = chosen is not None and meets_target(chosen, consumption_rate)
    if try_deep_prefetch and chosen is not None and chosen.num_workers > 0 and not target_met:
        deep = s.run(chosen.num_workers, DEEP_PREFETCH)
        if deep is not None and deep.complete and deep.num_workers <= s.cap:
            deep, chosen = s.scored(deep), s.scored(chosen)
            if deep.expected_rate >= chosen.expected_rate * (1 + MIN_GAIN):
                chosen = deep
                target_met = meets_target(chosen, consumption_rate)
    mine, own_kept = None, False
    if own is not None and chosen is not None and chosen.key() != (own[0], own[1] or 0):
        mine, chosen = _against_own(s, chosen, own)
        own_kept = mine is not None and chosen.key() == mine.key()
        target_met = meets_target(chosen, consumption_rate)
    return SearchResult(
        candidates=tuple(s.scored(c) for c in s.tried),
        chosen=None if chosen is None else s.scored(chosen),
        cpu_workers=cpu_workers,
        memory_workers=s.memory_workers,
        shm_workers=s.shm_workers,
        stop=stop,
        target_met=target_met,
        device_rate=s.device_rate,
        io_workers=s.io_workers,
        ceiling_workers=ceiling,
        own=None if mine is None else s.scored(mine),
        own_kept=own_kept,
    )


def _against_own(
    s: _Search, chosen: LoaderCandidate, own: tuple[int, int | None]
) -> tuple[LoaderCandidate | None, LoaderCandidate]:
    """The loader's own setting measured beside the choice; the faster of the two (rule 5)."""
    mine = s.run(*own)
    if mine is None or not mine.complete:
        return mine, chosen
    # Measured first, the own setting was noted against the caps known then; the budget may
    # have been raised for reads that wait since, and a worker's memory measured.
    index = next(i for i, c in enumerate(s.tried) if c.key() == mine.key())
    note = s._over_cap_note(mine.num_workers) if mine.num_workers > s.cap else ""
    mine = s.tried[index] = replace(s.tried[index], note=note)
    # A user's own worker count over the CPU cap is theirs to keep when it is faster; over
    # the RAM or /dev/shm budget it risks the run, so it is never kept.
    over = [c for c in (s.memory_workers, s.shm_workers) if c is not None and mine.num_workers > c]
    if over:
        return mine, chosen
    mine, chosen = s.scored(mine), s.scored(chosen)
    if chosen.expected_rate < mine.expected_rate * (1 + MIN_GAIN):
        # Close: both again, each keeping its faster run (a busy moment only slows one down).
        mine, chosen = s.confirm(mine, chosen)
    cheaper = chosen.key() < mine.key()
    if chosen.expected_rate > mine.expected_rate * (1 + MIN_GAIN) or (
        cheaper and chosen.expected_rate >= mine.expected_rate
    ):
        return mine, chosen
    return mine, mine
