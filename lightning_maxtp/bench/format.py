"""A bench result (and its gate) as a terminal table or as Markdown for a pull request.

The Markdown suits a pull-request comment or a GitHub Actions job summary
(``cat bench.md >> "$GITHUB_STEP_SUMMARY"``).
"""

from __future__ import annotations

import statistics
from typing import Any

from lightning_maxtp.bench.gate import PAIRED, Check, GateResult
from lightning_maxtp.bench.result import BenchResult

__all__ = ["format_markdown", "format_text"]

_HEAD = (
    "config",
    "steady samples/s",
    "spread",
    "fit wall-clock",
    "per reference",
    "vs first",
    "vs baseline (steady, fit)",
)


def _machine(result: BenchResult) -> str:
    machine: dict[str, Any] = dict(result.machine)
    cpus = (machine.get("cpu") or {}).get("effective", "?")
    gpus = ", ".join(str(g.get("name", "?")) for g in machine.get("gpus") or []) or "no GPU"
    versions = " ".join(f"{k} {v}" for k, v in result.versions.items())
    commit = result.git.get("commit")
    where = (
        f"commit {commit[:10]}{' (dirty)' if result.git.get('dirty') else ''}"
        if commit
        else ("not a git checkout")
    )
    return f"{machine.get('hostname', '?')}: {cpus} CPUs, {gpus}; {versions}; {where}"


def _changes(config: str, gate: GateResult | None) -> str:
    if gate is None:
        return "-"
    mine = {c.metric: c for c in gate.checks if c.config == config}
    if not mine:
        return "no baseline"

    def one(check: Check | None) -> str:
        if check is None:
            return "?"
        return f"{check.change:+.1%}{' REGRESSION' if check.regressed else ''}"

    return f"{one(mine.get('steady'))}, {one(mine.get('fit'))}"


def _rows(result: BenchResult, gate: GateResult | None) -> list[tuple[str, ...]]:
    key = "steady_per_reference"
    first = result.summary(result.configs[0])
    rows: list[tuple[str, ...]] = []
    for config in result.configs:
        s = result.summary(config)
        vs_first = s["steady"].median / first["steady"].median if first["steady"].median else 0
        rows.append(
            (
                config,
                f"{s['steady'].median:,.1f}",
                f"{s['steady'].spread:.1%}",
                f"{s['fit_seconds'].median:.1f} s",
                f"{s[key].median:.4f}" if key in s else "-",
                f"{vs_first:.2f}x",
                _changes(config, gate),
            )
        )
    return rows


def _header(result: BenchResult) -> str:
    p = result.params
    return (
        f"{p.get('rounds')} round(s) of {', '.join(result.configs)} (alternating, each a fresh "
        f"process); {p.get('steps')} timed steps after {p.get('warmup')} warm-up; device "
        f"{p.get('device')}"
    )


def _reference(result: BenchResult) -> str:
    if result.params.get("paired"):
        return (
            f"paired with {result.params.get('against')!r}: both ran in every round, the order "
            "flipping each round; no reference workload (the other side is the reference)"
        )
    ref = [float(r["reference_samples_per_s"]) for r in result.runs]
    return (
        f"reference workload ({result.params.get('reference')}): {statistics.median(ref):,.0f}"
        f" samples/s ({min(ref):,.0f}-{max(ref):,.0f} over the runs); 'per reference' is steady "
        "samples/s divided by it"
    )


def _tuning(result: BenchResult) -> list[str]:
    lines = []
    for run in result.runs:
        tuning = run.get("tuning")
        if tuning is not None:
            kept = ", ".join(tuning["kept"]) or "nothing"
            settings = ", ".join(f"{k}={v}" for k, v in tuning["settings"].items())
            lines.append(
                f"{run['config']} round {run['round']}: kept {kept}; {settings} "
                f"({tuning['stop_reason']})"
            )
    return lines


def format_text(result: BenchResult, gate: GateResult | None = None) -> str:
    """The table a terminal shows, then the gate's verdict when there is one."""
    rows = [_HEAD, *_rows(result, gate)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD))]
    lines = [f"maxtp bench {result.target}", _header(result), _machine(result), ""]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    lines += ["", _reference(result), *(f"tuning: {t}" for t in _tuning(result))]
    if gate is not None:
        lines += ["", str(gate)]
    return "\n".join(lines)


def format_markdown(result: BenchResult, gate: GateResult | None = None) -> str:
    """A Markdown report: verdict, table, reference, machine, and any regression line."""
    verdict = "" if gate is None else (" passed" if gate.passed else " **REGRESSION**")
    lines = [f"### maxtp bench `{result.target}`{verdict}", "", _header(result), ""]
    lines.append("| " + " | ".join(_HEAD) + " |")
    lines.append("|" + "---|" + "---:|" * (len(_HEAD) - 1))
    lines += ["| " + " | ".join(row) + " |" for row in _rows(result, gate)]
    lines += ["", _reference(result) + ".", "", f"Machine: {_machine(result)}."]
    tuning = _tuning(result)
    if tuning:
        lines += ["", "<details><summary>what MaxThroughputCallback kept</summary>", ""]
        lines += [f"- {t}" for t in tuning] + ["", "</details>"]
    if gate is not None:
        rule = (
            "the median of the rounds' ratios falls more than "
            f"{gate.max_regression:.0%} and more of its rounds are slower than chance gives 1 "
            "time in 20 (a sign test)"
            if gate.gate == PAIRED
            else f"median falls more than {gate.max_regression:.0%} and beyond the rounds' spread"
        )
        lines += [
            "",
            f"Gate `{gate.gate}` against `{gate.baseline}`: a metric fails when its {rule}.",
        ]
        lines += [f"- **REGRESSION** {c}" for c in gate.regressions]
        lines += [f"- note: {n}" for n in gate.notes]
    return "\n".join(lines) + "\n"
