"""Time named configurations of a workload A/B/A/B and report a table plus one JSON line.

Throughput on a shared or thermally limited machine drifts over minutes. Running every config
once per round, in the same order, for several rounds (A, B, A, B, ...) exposes all configs to
the same drift, and the median over rounds ignores a single disturbed round. Each config is a
callable returning one ``Measurement``, typically from ``time_fit`` (re-exported here), which
times a real ``Trainer.fit`` with warm-up steps left out.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from benchmarks.timing import Measurement, StepTimer, time_fit
from lightning_maxtp.resources import inspect_resources

__all__ = [
    "BenchmarkResult",
    "Config",
    "Measurement",
    "StepTimer",
    "format_table",
    "report",
    "run_ab",
    "time_fit",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Config:
    """A named way to run the workload once; ``run`` returns one measurement per call."""

    name: str
    run: Callable[[], Measurement]
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchmarkResult:
    """Every round of every config, plus what is needed to compare runs later.

    ``rounds[r][c]`` is config ``c``'s measurement in round ``r``.
    """

    benchmark: str
    configs: tuple[str, ...]
    settings: tuple[Mapping[str, Any], ...]
    rounds: tuple[tuple[Measurement, ...], ...]
    params: Mapping[str, Any]
    machine: Mapping[str, Any]
    timestamp: str
    git_commit: str | None
    git_dirty: bool | None
    load_avg: Mapping[str, list[float] | None] = field(default_factory=dict)
    """``os.getloadavg()`` (1/5/15 min) ``"before"`` and ``"after"`` the rounds: others' load."""

    def values(self, config: str) -> list[float]:
        """Samples/s of ``config`` in round order."""
        i = self.configs.index(config)
        return [r[i].samples_per_s for r in self.rounds]

    def medians(self) -> dict[str, float]:
        """Median samples/s per config."""
        return {c: statistics.median(self.values(c)) for c in self.configs}

    def ratios(self) -> dict[str, float]:
        """Each config's median divided by the first config's median."""
        medians = self.medians()
        first = medians[self.configs[0]]
        return {c: m / first if first > 0 else float("nan") for c, m in medians.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (the final line of the report)."""
        return {
            "schema": SCHEMA_VERSION,
            "benchmark": self.benchmark,
            "timestamp": self.timestamp,
            "git_commit": self.git_commit,
            "git_dirty": self.git_dirty,
            "load_avg": dict(self.load_avg),
            "params": dict(self.params),
            "configs": [
                {"name": c, "settings": dict(s)}
                for c, s in zip(self.configs, self.settings, strict=True)
            ],
            "order": [c for _ in self.rounds for c in self.configs],
            "rounds": [
                {c: m.to_dict() for c, m in zip(self.configs, r, strict=True)} for r in self.rounds
            ],
            "medians": self.medians(),
            "ratios": self.ratios(),
            "machine": dict(self.machine),
        }


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_state() -> tuple[str | None, bool | None]:
    """``(HEAD commit, work tree differs from it)``, or ``None`` for what git cannot tell.

    Untracked files count as changes (a new benchmark not yet committed is part of the run).
    """
    status = _git("status", "--porcelain")
    return _git("rev-parse", "HEAD"), None if status is None else bool(status)


def run_ab(
    benchmark: str,
    configs: Sequence[Config],
    *,
    rounds: int = 3,
    params: Mapping[str, Any] | None = None,
    machine: Mapping[str, Any] | None = None,
) -> BenchmarkResult:
    """Run each config once per round, in the given order, for ``rounds`` rounds.

    Args:
        benchmark: Name recorded in the result.
        configs: The configs; the first is the reference for ratios.
        rounds: Number of rounds (each runs every config once).
        params: Workload parameters recorded in the result.
        machine: Machine description; defaults to ``inspect_resources().to_dict()``.

    Returns:
        The result, rounds in run order.
    """
    names = [c.name for c in configs]
    if not configs or len(set(names)) != len(names):
        raise ValueError(f"need at least one config and unique names, got {names}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if machine is None:
        machine = inspect_resources().to_dict()
    load_before = _load_avg()
    results: list[tuple[Measurement, ...]] = []
    for r in range(rounds):
        row = []
        for config in configs:
            measurement = config.run()
            log.info(
                "round %d/%d %s: %.1f samples/s",
                r + 1,
                rounds,
                config.name,
                measurement.samples_per_s,
            )
            row.append(measurement)
        results.append(tuple(row))
    commit, dirty = git_state()
    return BenchmarkResult(
        benchmark=benchmark,
        configs=tuple(names),
        settings=tuple(c.settings for c in configs),
        rounds=tuple(results),
        params=dict(params or {}),
        machine=machine,
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        git_commit=commit,
        git_dirty=dirty,
        load_avg={"before": load_before, "after": _load_avg()},
    )


def describe_machine(machine: Mapping[str, Any]) -> str:
    """One line: host, CPUs, memory, GPUs and versions, from ``Resources.to_dict()``."""
    cpu, mem, ver = machine.get("cpu", {}), machine.get("memory", {}), machine.get("versions", {})
    gpus = machine.get("gpus") or []
    gpu_text = ", ".join(str(g.get("name", "?")) for g in gpus) if gpus else "none"
    avail = mem.get("effective_available_bytes")
    mem_text = f"{avail / 2**30:.1f} GiB available" if avail else "memory ?"
    return (
        f"machine: {machine.get('hostname', '?')} | {machine.get('platform', '?')} | "
        f"{cpu.get('effective', '?')} CPUs | {mem_text} | GPUs: {gpu_text} | "
        f"python {ver.get('python')} torch {ver.get('torch')} lightning {ver.get('lightning')}"
    )


def format_table(result: BenchmarkResult) -> str:
    """The human-readable report: header, one row per config, then each config's settings."""
    medians, ratios = result.medians(), result.ratios()
    width = max(len("config"), *(len(c) for c in result.configs))
    lines = [
        f"benchmark: {result.benchmark}  ({len(result.rounds)} rounds, order per round: "
        f"{', '.join(result.configs)})",
        describe_machine(result.machine),
        "load average (1/5/15 min): "
        + ", ".join(f"{k} {v or '?'}" for k, v in result.load_avg.items()),
        "params: " + (" ".join(f"{k}={v}" for k, v in result.params.items()) or "(none)"),
        "",
        f"{'config':<{width}}  {'median/s':>10}  {'min/s':>10}  {'max/s':>10}  {'vs first':>8}"
        "  per round (samples/s)",
    ]
    for c in result.configs:
        vals = result.values(c)
        per_round = " ".join(f"{v:.1f}" for v in vals)
        lines.append(
            f"{c:<{width}}  {medians[c]:>10.1f}  {min(vals):>10.1f}  {max(vals):>10.1f}"
            f"  {ratios[c]:>7.2f}x  {per_round}"
        )
    lines.append("")
    for c, s in zip(result.configs, result.settings, strict=True):
        lines.append(f"{c}: " + " ".join(f"{k}={v}" for k, v in s.items()))
    return "\n".join(lines)


def report(
    result: BenchmarkResult,
    *,
    stream: TextIO | None = None,
    json_out: Path | None = None,
    table_out: Path | None = None,
) -> None:
    """Print the table, then the result as ONE JSON line (always the last line printed).

    Args:
        result: What ``run_ab`` returned.
        stream: Where to print (default ``sys.stdout``).
        json_out: Also write the JSON line to this file.
        table_out: Also write the table to this file.
    """
    emit(format_table(result), result.to_dict(), stream=stream, json_out=json_out,
         table_out=table_out)  # fmt: skip


def tuning_account(tuning: Any) -> dict[str, Any]:
    """What a ``MaxThroughputCallback`` did in one fit, JSON-safe, for a benchmark's record.

    Args:
        tuning: The callback's ``TuningSummary`` (``callback.tuning``).
    """
    return {
        "settings": {k: str(v) for k, v in tuning.settings.items()},
        "stop_reason": tuning.stop_reason, "trials": [str(t) for t in tuning.trials],
        "kept": [t.knob for t in tuning.trials if t.kept], "notes": list(tuning.notes),
        "cost": None if tuning.cost is None else tuning.cost.to_dict(),
    }  # fmt: skip


def emit(
    table: str,
    record: dict[str, Any],
    *,
    stream: TextIO | None = None,
    json_out: Path | None = None,
    table_out: Path | None = None,
) -> None:
    """Print ``table``, then ``record`` as ONE JSON line (the last line printed); keep both.

    Args:
        table: The human-readable table.
        record: The JSON-safe result.
        stream: Where to print (default ``sys.stdout``).
        json_out: Also write the JSON line to this file.
        table_out: Also write the table to this file.
    """
    stream = stream or sys.stdout
    line = json.dumps(record)
    for path, text in ((json_out, line), (table_out, table)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
    print(table, file=stream)
    print(line, file=stream, flush=True)
