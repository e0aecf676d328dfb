"""The regression gate: a run against a baseline, per configuration and metric (pure).

A metric regressed when both hold:

* its median fell by more than ``max_regression`` (a share: 0.10 is 10 %), and
* the fall is larger than the measured spread: the fastest round of this run is slower than
  the slowest round of the baseline, so the two sets of rounds do not overlap.

The default ``ratio`` gate compares each metric divided by the reference workload's rate of the
same run, so a baseline recorded on one runner holds on a faster or slower one, and the job
getting slower still shows; ``absolute`` compares raw samples/s (the same machine only).

The ``paired`` gate judges a bench that ran the code to hold the job to in the same process
tree, round by round (``run_against``): each round's two runs shared the machine's minute, so
their ratio cancels the drift a stored baseline cannot. A metric regressed when both hold:

* the median of the per-round ratios fell by more than ``max_regression``, and
* the fall is beyond the rounds' noise: so many rounds are slower that an unchanged job, each
  of whose rounds is slower or faster with even odds, would show that many at most 5 % of the
  time (a sign test: 15 of 20 rounds, 5 of 5). On a shared machine a run can land 30 % off
  the next for its whole life; a count of slower rounds is not moved by how far off one is.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from lightning_maxtp.bench.result import METRICS, BenchResult, Spread

__all__ = [
    "GATES",
    "MIN_PAIRED_ROUNDS",
    "PAIRED",
    "PAIRED_ROUNDS",
    "Check",
    "GateResult",
    "compare",
]

GATES = ("ratio", "absolute")
"""The gates against a stored baseline (``--gate``)."""
PAIRED = "paired"
"""The gate of a bench that ran both sides itself (``--against``)."""
PAIRED_GATED = ("steady",)
"""What the paired gate fails on: the job's speed. The whole fit's rate is reported beside it;
on this project's 2-core machine its start-up alone moved it more, run to run, than a 10 %
slower step did."""
PAIRED_ROUNDS = 20
"""Pairs a paired bench runs by default. On this project's 2-core machine one run of a job can
land 30 % faster or slower than the next for its whole life (the log-ratio of two runs of the
same job varied by 14 %, sd): telling a 10 % slowdown from that with 1 false alarm in 20 takes
about 20 pairs."""
MIN_PAIRED_ROUNDS = 5
"""Fewer rounds all slower happen by chance more than 1 time in 20 (4 of 4: 1 in 16)."""
SIGN_LEVEL = 0.05
"""Largest chance that an unchanged job shows as many slower rounds as the gate asks for."""


def slower_rounds_needed(rounds: int) -> int | None:
    """Fewest slower rounds out of ``rounds`` that chance alone gives at most 5 % of the time.

    Each round of an unchanged job is slower or faster with even odds, so the count of slower
    rounds is binomial(rounds, 1/2); ``None`` when even every round slower is not that rare.
    """
    for needed in range(rounds + 1):
        tail = sum(math.comb(rounds, k) for k in range(needed, rounds + 1)) / 2**rounds
        if tail <= SIGN_LEVEL:
            return needed
    return None


_COMPARABLE = ("steps", "warmup", "reference")
_NAMES = {"steady": "steady samples/s", "fit": "whole-fit samples/s"}


@dataclass(frozen=True)
class Check:
    """One metric of one configuration against the baseline."""

    config: str
    metric: str
    key: str
    before: Spread
    after: Spread
    limit: float
    regressed: bool
    pairs: tuple[float, ...] = ()
    """The paired gate's per-round ratios (now / before), in round order; empty otherwise."""

    @property
    def change(self) -> float:
        """Relative change of the median (``-0.12``: 12 % lower); of the ratios when paired."""
        if self.pairs:
            return statistics.median(self.pairs) - 1
        return self.after.median / self.before.median - 1 if self.before.median > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "config": self.config,
            "metric": self.metric,
            "key": self.key,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "change": self.change,
            "limit": self.limit,
            "regressed": self.regressed,
            "pairs": list(self.pairs),
        }

    def __str__(self) -> str:
        unit = " per reference sample/s" if self.key.endswith("_per_reference") else ""
        digits = 4 if unit else 1
        if self.pairs:
            ratios = " ".join(f"{r:.3f}" for r in self.pairs)
            return (
                f"{self.config} {_NAMES[self.metric]}: {self.before.median:.1f} -> "
                f"{self.after.median:.1f} (median of the rounds' ratios {self.change:+.1%}; "
                f"limit -{self.limit:.0%}; {sum(r < 1 for r in self.pairs)} of {len(self.pairs)} "
                f"rounds slower, {slower_rounds_needed(len(self.pairs))} needed; "
                f"ratio per round {ratios})"
            )
        return (
            f"{self.config} {_NAMES[self.metric]}{unit}: {self.before.median:.{digits}f} -> "
            f"{self.after.median:.{digits}f} ({self.change:+.1%}; limit -{self.limit:.0%}; "
            f"rounds now {self.after.low:.{digits}f}-{self.after.high:.{digits}f}, baseline "
            f"{self.before.low:.{digits}f}-{self.before.high:.{digits}f})"
        )


@dataclass(frozen=True)
class GateResult:
    """Every check, the regressions among them, and what the comparison could not cover."""

    gate: str
    max_regression: float
    baseline: str
    checks: tuple[Check, ...]
    notes: tuple[str, ...] = ()

    @property
    def regressions(self) -> tuple[Check, ...]:
        """The checks that regressed."""
        return tuple(c for c in self.checks if c.regressed)

    @property
    def passed(self) -> bool:
        """No regression."""
        return not self.regressions

    @property
    def exit_code(self) -> int:
        """0 when passed, 1 on a regression."""
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "gate": self.gate,
            "max_regression": self.max_regression,
            "baseline": self.baseline,
            "passed": self.passed,
            "checks": [c.to_dict() for c in self.checks],
            "regressions": [str(c) for c in self.regressions],
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        lines = [f"REGRESSION {c}" for c in self.regressions]
        lines += [f"note: {n}" for n in self.notes]
        verdict = "FAILED" if self.regressions else "passed"
        rule = ", most rounds slower" if self.gate == PAIRED else " beyond the spread"
        lines.append(
            f"maxtp bench gate ({self.gate}, limit -{self.max_regression:.0%}{rule}): "
            f"{verdict} against {self.baseline}"
        )
        return "\n".join(lines)


def _machine_key(machine: dict[str, Any]) -> tuple[Any, ...]:
    gpus = tuple(str(g.get("name")) for g in machine.get("gpus") or [])
    return machine.get("hostname"), (machine.get("cpu") or {}).get("effective"), gpus


def compare(
    current: BenchResult,
    baseline: BenchResult,
    max_regression: float = 0.10,
    gate: str = "ratio",
    where: str = "the baseline",
) -> GateResult:
    """Check every configuration of ``current`` that ``baseline`` also has.

    Args:
        current: This run.
        baseline: The run to hold it to.
        max_regression: Largest tolerated fall of a median, as a share in (0, 1).
        gate: ``"ratio"`` (per reference workload) or ``"absolute"`` (raw samples/s).
        where: How to name the baseline in messages (its path).

    Raises:
        ValueError: A bad ``gate`` or ``max_regression``, or a baseline timed differently
            (steps, warm-up or reference workload), which no gate can compare.
    """
    if gate not in (*GATES, PAIRED):
        raise ValueError(f"gate must be one of {', '.join((*GATES, PAIRED))}, got {gate!r}")
    if not 0 < max_regression < 1:
        raise ValueError(f"max_regression must be in (0, 1), e.g. 0.10, got {max_regression!r}")
    if gate == PAIRED:
        return _compare_paired(current, baseline, max_regression, where)
    _refuse_paired(current, baseline, gate, where)
    for key in _COMPARABLE:
        now, then = current.params.get(key), baseline.params.get(key)
        if now != then:
            raise ValueError(
                f"{where} was recorded with {key}={then!r}, this run has {key}={now!r}; run with "
                "the baseline's settings or record a new baseline"
            )
    notes = []
    if current.target != baseline.target:
        notes.append(f"the baseline timed {baseline.target!r}, this run {current.target!r}")
    devices = [str(r.params.get("device", "?")).split(":")[0] for r in (current, baseline)]
    if devices[0] != devices[1]:
        raise ValueError(
            f"{where} ran on {devices[1]}, this run on {devices[0]}; a baseline holds for one "
            "kind of device (pass --accelerator, or record a baseline on this one)"
        )
    if gate == "absolute" and _machine_key(dict(current.machine)) != _machine_key(
        dict(baseline.machine)
    ):
        notes.append("--gate absolute across different machines: raw samples/s may not compare")
    if not set(current.configs) & set(baseline.configs):
        raise ValueError(
            f"{where} has configs {list(baseline.configs)}, this run {list(current.configs)}: "
            "nothing to compare; run the baseline's --configs or record a new baseline"
        )
    checks = []
    for config in current.configs:
        if config not in baseline.configs:
            notes.append(f"config {config!r} has no baseline; record one to gate it")
            continue
        now, then = current.summary(config), baseline.summary(config)
        for metric in METRICS:
            key = f"{metric}_per_reference" if gate == "ratio" else metric
            after, before = now[key], then[key]
            fell = after.median < (1 - max_regression) * before.median
            apart = after.high < before.low
            checks.append(Check(config, metric, key, before, after, max_regression, fell and apart))
    return GateResult(gate, max_regression, where, tuple(checks), tuple(notes))


def _refuse_paired(current: BenchResult, baseline: BenchResult, gate: str, where: str) -> None:
    if current.params.get("paired") or baseline.params.get("paired"):
        raise ValueError(
            f"a paired bench (--against) timed no reference workload; gate it with "
            f"gate='paired' against its own other side, not {gate!r} against {where}"
        )


def _pairs(current: BenchResult, baseline: BenchResult, config: str, metric: str) -> list[float]:
    key = f"{metric}_samples_per_s"
    now = {r["round"]: float(r[key]) for r in current.runs if r["config"] == config}
    then = {r["round"]: float(r[key]) for r in baseline.runs if r["config"] == config}
    return [now[r] / then[r] for r in sorted(now) if r in then and then[r] > 0]


def _compare_paired(
    current: BenchResult, baseline: BenchResult, max_regression: float, where: str
) -> GateResult:
    if not (current.params.get("paired") and baseline.params.get("paired")):
        raise ValueError(
            "gate='paired' compares the two sides of one paired bench (run_against, or maxtp "
            f"bench --against); {where} and this run were not timed together"
        )
    if current.params.get("against") != baseline.target:
        raise ValueError(
            f"this run was paired with {current.params.get('against')!r}, not with "
            f"{baseline.target!r} ({where})"
        )
    checks, notes = [], []
    for config in current.configs:
        now, then = current.summary(config), baseline.summary(config)
        for metric in METRICS:
            pairs = _pairs(current, baseline, config, metric)
            assert len(pairs) >= MIN_PAIRED_ROUNDS, "run_against refuses fewer rounds"
            fell = statistics.median(pairs) < 1 - max_regression
            needed = slower_rounds_needed(len(pairs))
            beyond_noise = needed is not None and sum(r < 1 for r in pairs) >= needed
            regressed = fell and beyond_noise and metric in PAIRED_GATED
            if metric not in PAIRED_GATED:
                notes.append(
                    f"{config} {_NAMES[metric]}: median of the rounds' ratios "
                    f"{statistics.median(pairs) - 1:+.1%}, shown, not gated (start-up moves it "
                    "run to run more than the job's own speed does)"
                )
            check = Check(
                config,
                metric,
                metric,
                then[metric],
                now[metric],
                max_regression,
                regressed,
                tuple(pairs),
            )
            checks.append(check)
    return GateResult(PAIRED, max_regression, where, tuple(checks), tuple(notes))
