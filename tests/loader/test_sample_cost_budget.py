"""The sample-cost budget bounds the wait: no sample starts that the slowest so far says would
end past it (a fake clock, so nothing here depends on this machine's speed)."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_maxtp.loader import sample_cost
from lightning_maxtp.loader.sample_cost import measure_sample_costs


class FakeClock:
    """``perf_counter`` that only moves when a sample is loaded."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class Costly:
    """A map-style dataset whose samples each take ``seconds`` on the fake clock."""

    def __init__(self, clock: FakeClock, seconds: list[float]) -> None:
        self.clock, self.seconds, self.loaded = clock, seconds, 0

    def __len__(self) -> int:
        return len(self.seconds)

    def __getitem__(self, index: int) -> Any:
        self.clock.now += self.seconds[index]
        self.loaded += 1
        return index


@pytest.mark.parametrize(
    ("seconds", "budget_s", "timed"),
    [
        ([0.09] * 4, 0.25, 2),  # a third would end at 0.27 s: not started
        ([0.02] * 4, 0.25, 4),  # all four fit
        ([0.4, 0.01, 0.01, 0.01], 0.25, 1),  # the first is always timed, however slow
    ],
)
def test_no_sample_starts_that_would_end_past_the_budget(
    monkeypatch: pytest.MonkeyPatch, seconds: list[float], budget_s: float, timed: int
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(sample_cost, "time", clock)
    dataset = Costly(clock, seconds)
    costs = measure_sample_costs(dataset, count=4, budget_s=budget_s)
    assert costs is not None and costs.samples == timed and dataset.loaded == timed
    assert clock.now <= max(budget_s, seconds[0])
