"""What ``maxtp bench`` measured: every run in order, and per configuration medians and spreads.

Pure data: built from the child processes' records, written as JSON (the baseline file) and
read back from it. Two metrics per configuration, both higher-is-better: ``steady`` (samples/s
after warm-up) and ``fit`` (samples over the whole fit's wall-clock, start-up and tuning
included). Each is kept raw and divided by the reference workload's rate of the same run.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SCHEMA", "BenchResult", "Spread", "summarize"]

SCHEMA = "maxtp-bench/1"
METRICS = ("steady", "fit")


@dataclass(frozen=True)
class Spread:
    """The median of some rounds' values and how far apart they lie."""

    median: float
    low: float
    high: float

    @property
    def spread(self) -> float:
        """``(high - low) / median``: 0 for one round."""
        return (self.high - self.low) / self.median if self.median > 0 else 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values`` (at least one)."""
        assert values, "a spread needs at least one value"
        return cls(statistics.median(values), min(values), max(values))

    def to_dict(self) -> dict[str, float]:
        """JSON-safe view."""
        return {"median": self.median, "low": self.low, "high": self.high, "spread": self.spread}


def summarize(runs: Sequence[Mapping[str, Any]], config: str) -> dict[str, Spread]:
    """Per metric, raw (``steady``, ``fit``) and per reference (``steady_per_reference``, ...).

    A paired bench's runs time no reference workload: they have the raw metrics only.
    """
    mine = [r for r in runs if r["config"] == config]
    out: dict[str, Spread] = {}
    timed = all(r.get("reference_samples_per_s") is not None for r in mine)
    ref = [float(r["reference_samples_per_s"]) for r in mine] if timed else []
    for metric in METRICS:
        raw = [float(r[f"{metric}_samples_per_s"]) for r in mine]
        out[metric] = Spread.of(raw)
        if timed:
            per = [v / x for v, x in zip(raw, ref, strict=True)]
            out[f"{metric}_per_reference"] = Spread.of(per)
    out["fit_seconds"] = Spread.of([float(r["fit_seconds"]) for r in mine])
    if timed:
        out["reference"] = Spread.of(ref)
    return out


@dataclass(frozen=True)
class BenchResult:
    """One ``maxtp bench`` run.

    Attributes:
        target: The ``FILE:FUNCTION`` timed.
        configs: Configuration names, in the order each round ran them.
        params: ``steps``, ``warmup``, ``rounds``, ``accelerator`` and the reference's name
            (``None`` for one side of a paired bench, with ``paired`` true and ``against``
            naming the other side's target on the run's side).
        runs: One record per child process, in run order (``round`` and ``config`` in each).
        machine: The probe's description of the machine (``Resources.to_dict()``).
        versions: Python, torch, lightning and lightning_maxtp, as the children saw them.
        git: ``commit`` and ``dirty`` of the repository the bench ran in (``None`` outside one).
        timestamp: When the run ended (UTC, ISO 8601).
        load_avg: ``os.getloadavg()`` before and after the runs: what else the machine did.
    """

    target: str
    configs: tuple[str, ...]
    params: Mapping[str, Any]
    runs: tuple[Mapping[str, Any], ...]
    machine: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    git: Mapping[str, Any] = field(default_factory=dict)
    timestamp: str = ""
    load_avg: Mapping[str, Any] = field(default_factory=dict)

    def summary(self, config: str) -> dict[str, Spread]:
        """Medians and spreads of ``config`` (see ``summarize``)."""
        return summarize(self.runs, config)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view; ``from_dict`` reads it back."""
        return {
            "schema": SCHEMA,
            "target": self.target,
            "configs": list(self.configs),
            "params": dict(self.params),
            "summary": {
                c: {k: s.to_dict() for k, s in self.summary(c).items()} for c in self.configs
            },
            "runs": [dict(r) for r in self.runs],
            "machine": dict(self.machine),
            "versions": dict(self.versions),
            "git": dict(self.git),
            "timestamp": self.timestamp,
            "load_avg": dict(self.load_avg),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "the result") -> BenchResult:
        """Read a result written by ``to_dict`` (the summary is recomputed from the runs).

        Raises:
            ValueError: Not a ``maxtp bench`` result, or one missing its runs.
        """
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(
                f"{where} is not a maxtp bench result (schema {found!r}, expected {SCHEMA!r}); "
                "record one with `maxtp bench TARGET --json FILE`"
            )
        try:
            result = cls(
                target=str(data["target"]),
                configs=tuple(data["configs"]),
                params=dict(data["params"]),
                runs=tuple(dict(r) for r in data["runs"]),
                machine=dict(data.get("machine") or {}),
                versions=dict(data.get("versions") or {}),
                git=dict(data.get("git") or {}),
                timestamp=str(data.get("timestamp", "")),
                load_avg=dict(data.get("load_avg") or {}),
            )
            empty = [c for c in result.configs if not any(r["config"] == c for r in result.runs)]
            paired = result.params.get("reference") is None
            zero = not paired and any(float(r["reference_samples_per_s"]) <= 0 for r in result.runs)
            for config in result.configs:
                if config not in empty and not zero:
                    result.summary(config)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where} is an incomplete maxtp bench result ({err!r})") from err
        if empty:
            raise ValueError(f"{where} has no runs of config(s) {empty}")
        if zero:
            raise ValueError(f"{where} has a run whose reference rate is not > 0")
        return result
