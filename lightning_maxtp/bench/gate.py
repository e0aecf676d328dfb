"""The regression gate: a run against a baseline, per configuration and metric (pure).

A metric regressed when both hold:

* its median fell by more than ``max_regression`` (a share: 0.10 is 10 %), and
* the fall is larger than the measured spread: the fastest round of this run is slower than
  the slowest round of the baseline, so the two sets of rounds do not overlap.

The default ``ratio`` gate compares each metric divided by the reference workload's rate of the
same run, so a baseline recorded on one runner holds on a faster or slower one, and the job
getting slower still shows; ``absolute`` compares raw samples/s (the same machine only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_maxtp.bench.result import METRICS, BenchResult, Spread

__all__ = ["GATES", "Check", "GateResult", "compare"]

GATES = ("ratio", "absolute")
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

    @property
    def change(self) -> float:
        """Relative change of the median (``-0.12``: 12 % lower)."""
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
        }

    def __str__(self) -> str:
        unit = " per reference sample/s" if self.key.endswith("_per_reference") else ""
        digits = 4 if unit else 1
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
        lines.append(
            f"maxtp bench gate ({self.gate}, limit -{self.max_regression:.0%} beyond the "
            f"spread): {verdict} against {self.baseline}"
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
    if gate not in GATES:
        raise ValueError(f"gate must be one of {', '.join(GATES)}, got {gate!r}")
    if not 0 < max_regression < 1:
        raise ValueError(f"max_regression must be in (0, 1), e.g. 0.10, got {max_regression!r}")
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
