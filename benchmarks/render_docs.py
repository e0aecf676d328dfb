"""Render every measured number the README and the documentation quote, from committed results.

A measured number in ``README.md`` or ``docs/*.md`` lives in a generated region::

    <!-- numbers:NAME -->
    ...written by this script, never by hand...
    <!-- /numbers -->

NAME is a key of ``REGIONS``: a function that reads result files under ``benchmarks/results/``
(or, for a constant the documentation quotes, the code that defines it) and returns the
region's Markdown. A value is the median and range over the runs or rounds its file holds,
with the run's date and commit; favourable and unfavourable results are rendered alike. GPU
figures come from ``benchmarks/targets.py`` and are labelled targets until a GPU run is
committed under ``benchmarks/results/gpu/``. The README cannot include files on GitHub, so the
regions are rewritten in place, in the pages as in the README.

Usage, from the repository root::

    python -m benchmarks.render_docs           # rewrite every stale region
    python -m benchmarks.render_docs --check   # exit 1 naming the stale regions, write nothing
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"
REGION = re.compile(r"<!-- numbers:([a-z0-9-]+) -->(.*?)<!-- /numbers -->", re.S)
WIDTH = 95
"""Paragraphs are wrapped like the hand-written ones around them."""

UNSTAMPED: dict[str, tuple[str, str | None]] = {
    # Files written before their benchmark recorded the date (and, for mfu_cpu, the commit):
    # the date and commit `benchmarks/results/README.md` or `docs/measured.md` stated with them
    # when they were committed. Each run's commit, where the file has one, comes from the file.
    "allow_cpu_cpu-2core.json": ("2026-12-01", None),
    "bench_fork_cpu_cpu-2core.json": ("2026-12-02", None),
    "data_paths_cpu_cpu-2core.json": ("2026-12-01", None),
    "mfu_cpu_cpu-2core.json": ("2026-12-03", "8153b39bf9a7bc612989b39da54789cf408a65fd"),
    "net_wallclock_cpu-2core.json": ("2026-12-02", None),
}


class RenderError(Exception):
    """A region that cannot be rendered: an unknown name or a result file that is missing."""


@dataclass(frozen=True)
class Stat:
    """Values of one measure over the runs or rounds of a result, summarized by their median."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        """The median of the values."""
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        """The smallest value."""
        return min(self.values)

    @property
    def high(self) -> float:
        """The largest value."""
        return max(self.values)

    @property
    def n(self) -> int:
        """How many values."""
        return len(self.values)


@dataclass(frozen=True)
class Source:
    """Where a rendered number comes from: the result file, its date and commit."""

    path: str
    date: str
    commit: str | None
    dirty: bool = False

    @property
    def commit_text(self) -> str:
        """The short commit, ``-dirty`` when the tree had uncommitted changes (``git describe``)."""
        if self.commit is None:
            return "not recorded"
        return self.commit[:7] + ("-dirty" if self.dirty else "")


def stat(values: Iterable[float]) -> Stat:
    """A ``Stat`` of ``values``, refusing an empty one (a renamed key would read as no runs).

    Raises:
        RenderError: When there is no value.
    """
    values = tuple(float(v) for v in values)
    if not values:
        raise RenderError("no values to summarize (a renamed key in a result file?)")
    return Stat(values)


def fmt(value: float, spec: str) -> str:
    """``value`` formatted by ``spec``; from 1,000 on, whole and with thousands separators.

    Decimals past the thousands say nothing on a machine whose rounds differ by percents.
    """
    if abs(value) >= 1000:
        return format(value, ("+" if spec.startswith("+") else "") + ",.0f")
    return format(value, spec.replace(",", ""))


def _unit(text: str, unit: str) -> str:
    # A speed-up reads "2.56x"; every other unit is a word apart ("174.3 img/s", "42 %").
    return f"{text}{unit}" if unit == "x" else f"{text} {unit}"


def spread(s: Stat, spec: str, unit: str, runs: str = "rounds", note: str = "") -> str:
    """The median, range and count of ``s``: "median M unit (range L to H unit, N runs)".

    A single value reads "V unit (1 run)"; ``note`` (a commit, say) closes the parenthesis.
    """
    tail = f", {note}" if note else ""
    if s.n == 1:
        return f"{_unit(fmt(s.median, spec), unit)} (1 {runs.rstrip('s')}{tail})"
    # "to", not a dash: a range of signed values (-11.0 to +3.0 %) stays readable.
    low, high = fmt(s.low, spec), fmt(s.high, spec)
    span = f"{low}x to {high}x" if unit == "x" else _unit(f"{low} to {high}", unit)
    return f"median {_unit(fmt(s.median, spec), unit)} (range {span}, {s.n} {runs}{tail})"


def ratio(top: Stat, bottom: Stat, per_round: Stat, runs: str = "rounds", note: str = "") -> str:
    """The ratio of two medians, with the range of the paired per-round ratios.

    The ratio of the medians is what each benchmark itself reports; the per-round range shows
    how far single rounds moved on the shared machine. ``note`` closes the parenthesis.
    """
    value = top.median / bottom.median
    tail = f", {note}" if note else ""
    if per_round.n == 1:
        return f"{value:.2f}x (1 {runs.rstrip('s')}{tail})"
    return (
        f"{value:.2f}x (ratio of the medians; per round {per_round.low:.2f}x to "
        f"{per_round.high:.2f}x, {per_round.n} {runs}{tail})"
    )


def load(root: Path, name: str) -> dict[str, Any]:
    """The JSON result ``benchmarks/results/<name>``.

    Raises:
        RenderError: When the file is missing.
    """
    path = root / RESULTS / name
    if not path.is_file():
        raise RenderError(f"{RESULTS}/{name}: no such result file")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def source(root: Path, name: str, data: dict[str, Any]) -> Source:
    """The date and commit of the run a result file holds.

    Raises:
        RenderError: When neither the file nor ``UNSTAMPED`` dates it.
    """
    git = data.get("git") or data.get("baseline", {}).get("git") or {}
    stamp = data.get("timestamp") or data.get("baseline", {}).get("timestamp")
    commit = data.get("git_commit") or git.get("commit")
    dirty = bool(data.get("git_dirty", git.get("dirty", False)))
    if name in UNSTAMPED:
        date, stated = UNSTAMPED[name]
        stamp, commit = stamp or date, commit or stated
    if not stamp:
        raise RenderError(f"{RESULTS}/{name}: no date in the file and none in UNSTAMPED")
    return Source(f"{RESULTS}/{name}", str(stamp)[:10], commit, dirty)


def file_link(src: Source) -> str:
    """The result file's name in code style (the pages link nothing outside ``docs/``)."""
    return f"`{src.path}`"


def round_values(data: dict[str, Any], config: str, key: str = "samples_per_s") -> Stat:
    """``key`` of ``config`` in every round of a ``benchmarks.runner`` result."""
    return stat(r[config][key] for r in data["rounds"] if config in r)


def round_ratios(data: dict[str, Any], top: str, bottom: str, key: str = "samples_per_s") -> Stat:
    """``top / bottom`` of ``key`` round by round (the runner interleaves them per round)."""
    return stat(r[top][key] / r[bottom][key] for r in data["rounds"] if top in r and bottom in r)


def runner_ratio(
    data: dict[str, Any], top: str, bottom: str, key: str = "samples_per_s", note: str = ""
) -> str:
    """``ratio`` of two configurations of a ``benchmarks.runner`` result."""
    return ratio(
        round_values(data, top, key),
        round_values(data, bottom, key),
        round_ratios(data, top, bottom, key),
        note=note,
    )


def table(header: Sequence[str], rows: Iterable[Sequence[str]], right: int = 0) -> str:
    """A Markdown table; the last ``right`` columns are right-aligned."""
    cells = [list(header), *[list(r) for r in rows]]
    align = ["---"] * (len(header) - right) + ["---:"] * right
    lines = ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
    lines.insert(1, "| " + " | ".join(align) + " |")
    return "\n".join(lines)


def paragraph(text: str) -> str:
    """``text`` wrapped like the hand-written paragraphs."""
    return textwrap.fill(" ".join(text.split()), WIDTH, break_on_hyphens=False)


def block(*parts: str) -> str:
    """A region body of paragraphs and tables, with the blank lines Markdown needs around it."""
    return "\n\n" + "\n\n".join(parts) + "\n\n"


def code_value(root: Path, module: str, name: str, argument: str | None = None) -> Any:
    """A module-level constant, or a function's argument default, read from the source.

    Read with ``ast`` rather than imported: importing ``lightning_maxtp`` loads torch and
    Lightning, seconds this script and its test have no use for.

    Raises:
        RenderError: When the module has no such constant or argument.
    """
    tree = ast.parse((root / module).read_text())
    for node in tree.body:
        if argument is None and isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value:
                return ast.literal_eval(node.value)
        if argument is not None and isinstance(node, ast.FunctionDef) and node.name == name:
            args = [*node.args.posonlyargs, *node.args.args]
            # Positional defaults belong to the last arguments: pair them from the end.
            names = [a.arg for a in args][::-1]
            defaults = dict(zip(names, node.args.defaults[::-1], strict=False))
            kwonly = zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
            kw = {a.arg: d for a, d in kwonly if d is not None}
            default = {**defaults, **kw}.get(argument)
            if default is not None:
                return ast.literal_eval(default)
    what = f"{name}({argument}=...)" if argument else name
    raise RenderError(f"{module}: no {what}")


# The regions. Each takes the repository root and returns the Markdown between its markers.


def _demo(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]], Stat]:
    data = load(root, "demo_runs_cpu-2core.json")
    runs = sorted(data["runs"], key=lambda r: r["date"])
    speedup = stat(r["final_samples_per_s"] / r["baseline_samples_per_s"] for r in runs)
    return data, runs, speedup


def _demo_span(runs: list[dict[str, Any]], dated: bool) -> str:
    commits = f"commits {runs[0]['commit'][:7]} to {runs[-1]['commit'][:7]}"
    return f"{runs[0]['date']} to {runs[-1]['date']}, {commits}" if dated else commits


def _demo_cost(runs: list[dict[str, Any]]) -> tuple[Stat, Stat]:
    costed = [r for r in runs if r["cost_s"] is not None]
    return stat(r["cost_s"] for r in costed), stat(r["budget_s"] for r in costed)


def _scoreboard_row(data: dict[str, Any], case: str) -> dict[str, Any]:
    row: dict[str, Any] = next(r for r in data["rows"] if r["case"] == case)
    return row


def _rounds_text(data: dict[str, Any]) -> str:
    """A scoreboard run's rounds: "2 rounds, short_epochs 3, ..." (cases with their own)."""
    # Older result files name the per-case rounds ``least_rounds``.
    own = data.get("case_rounds", data.get("least_rounds")) or {}
    return ", ".join([f"{data['rounds']} rounds", *(f"{c} {n}" for c, n in own.items())])


def _per_round(detail: str) -> Stat | None:
    found = re.match(r"rounds ([\d., ]+);", detail)
    return stat(float(v) for v in found.group(1).split(",")) if found else None


_WHOLE_RUN = re.compile(r"scoreboard_cpu-2core(_at_[0-9a-f]{7,40})?\.json")
"""The canonical full scoreboard run and the earlier ones kept beside it."""


@dataclass(frozen=True)
class DemoFit:
    """The demo's whole fit with the callback over its fit at defaults, every full run's rounds."""

    rounds: Stat
    runs: int
    first: Source
    last: Source

    def text(self) -> str:
        """The median, range and count of the rounds, in how many runs, at which commits."""
        if self.runs == 1:
            return spread(self.rounds, ".2f", "x", note=f"commit {self.last.commit_text}")
        commits = f"commits {self.first.commit_text} to {self.last.commit_text}"
        return spread(self.rounds, ".2f", "x", note=f"in {self.runs} full runs, {commits}")


def _demo_fit(root: Path) -> DemoFit:
    """Every committed whole full scoreboard run's demo rounds (one round a run reads as little).

    The canonical file and the earlier runs kept as ``_at_<commit>``: not a run of chosen cases
    (``only``) nor a named experiment beside them.

    Raises:
        RenderError: When no such run has a demo row, or one has a demo row without rounds.
    """
    found = []
    for path in (root / RESULTS).glob("scoreboard_cpu-2core*.json"):
        if not _WHOLE_RUN.fullmatch(path.name):
            continue
        data = load(root, path.name)
        rows = [r for r in data.get("rows", []) if r["case"] == "demo"]
        if data.get("profile") != "full" or data.get("only") or not rows:
            continue
        per = _per_round(rows[0]["detail"])
        if per is None:
            raise RenderError(f"{RESULTS}/{path.name}: the demo row lost its rounds")
        at = datetime.strptime(str(data.get("timestamp")), "%Y-%m-%dT%H:%M:%S%z")
        found.append((at, source(root, path.name, data), per))
    if not found:
        raise RenderError(f"{RESULTS}/scoreboard_cpu-2core*.json: no full run has a demo row")
    found.sort(key=lambda item: item[0])
    return DemoFit(
        stat(v for *_, per in found for v in per.values), len(found), found[0][1], found[-1][1]
    )


def headline(root: Path) -> str:
    """The README's opening claim: the demo's speed-up, its cost, and where it loses."""
    _, runs, speedup = _demo(root)
    cost, _ = _demo_cost(runs)
    fit = _demo_fit(root)
    jpeg = load(root, "callback_jpeg_cpu-2core.json")
    ci = load(root, "bench_ci_100steps_cpu-2core.json")
    jpeg_commit = source(root, "callback_jpeg_cpu-2core.json", jpeg).commit_text
    ci_commit = source(root, "bench_ci_100steps_cpu-2core.json", ci).commit_text
    return block(
        paragraph(
            f"On the demo below, the callback's final rate over its baseline window's: "
            f"{spread(speedup, '.2f', 'x', 'runs', _demo_span(runs, False))}; its tuning cost: "
            f"{spread(cost, '.1f', 's', 'runs')}. The demo's whole fit with the callback, "
            f"tuning included, over its time at Lightning's defaults: "
            f"{fit.text()}. It does not always "
            f"win. On the demo's own workload a hand sweep's best runs faster: the callback's "
            f"rate over the sweep's best is "
            f"{runner_ratio(jpeg, 'callback', 'sweep-best', note=f'commit {jpeg_commit}')}. On "
            f"the CI example job's {ci['params']['steps']} steps it costs more than it saves: "
            f"its rate over the defaults' is {_bench_ratio(ci, f'commit {ci_commit}')}. "
            f"[Measured](#measured) has every result, met or missed, with its date."
        )
    )


def _bench_runs(data: dict[str, Any], config: str, key: str = "steady_samples_per_s") -> Stat:
    return stat(r[key] for r in data["runs"] if r["config"] == config)


def _bench_ratio(data: dict[str, Any], note: str = "") -> str:
    # maxtp bench alternates the two configurations round by round.
    by_round: dict[int, dict[str, float]] = {}
    for run in data["runs"]:
        by_round.setdefault(run["round"], {})[run["config"]] = run["steady_samples_per_s"]
    per_round = stat(r["maxtp"] / r["defaults"] for r in by_round.values() if len(r) == 2)
    return ratio(_bench_runs(data, "maxtp"), _bench_runs(data, "defaults"), per_round, note=note)


def readme_measured(root: Path) -> str:
    """The README's table: the headline results, favourable and unfavourable, with sources."""
    _, runs, speedup = _demo(root)
    cost, _ = _demo_cost(runs)
    board = load(root, "scoreboard_cpu-2core.json")
    board_src = source(root, "scoreboard_cpu-2core.json", board)
    rows: list[list[str]] = [
        [
            "demo (`bash examples/demo.sh`): rate under the final settings / the baseline window",
            spread(speedup, ".2f", "x", "runs"),
            f"{runs[0]['date']} to {runs[-1]['date']}",
            f"{runs[0]['commit'][:7]} to {runs[-1]['commit'][:7]}",
        ],
        [
            "demo: tuning cost",
            spread(cost, ".1f", "s", "runs"),
            f"{runs[0]['date']} to {runs[-1]['date']}",
            f"{runs[0]['commit'][:7]} to {runs[-1]['commit'][:7]}",
        ],
    ]
    fit = _demo_fit(root)
    rows.append(
        [
            "demo: whole fit's wall-clock with the callback / at defaults, under 1 is faster "
            "(`python -m benchmarks.scoreboard`, every committed full run)",
            spread(fit.rounds, ".2f", "x", note=f"in {fit.runs} full runs"),
            fit.first.date
            if fit.first.date == fit.last.date
            else f"{fit.first.date} to {fit.last.date}",
            f"{fit.first.commit_text} to {fit.last.commit_text}",
        ]
    )
    rows.append(
        [
            "every case of the loop at once (`python -m benchmarks.scoreboard`)",
            f"{board['met']} of {board['judged']} rows met ({_rounds_text(board)})",
            board_src.date,
            board_src.commit_text,
        ]
    )
    for name, what, top, bottom in (
        (
            "callback_jpeg_cpu-2core.json",
            "the demo's workload: callback / a hand sweep's best (`python -m "
            "benchmarks.callback_jpeg`)",
            "callback",
            "sweep-best",
        ),
        (
            "callback_jpeg_cpu-2core.json",
            "the demo's workload: callback / Lightning's defaults",
            "callback",
            "lightning-defaults",
        ),
        (
            "callback_jpeg_decode_cpu-2core.json",
            "JPEG decode feeding a cheap model: callback / a 0-4 worker sweep's best",
            "callback",
            "sweep-best",
        ),
        (
            "callback_jpeg_local_cpu-2core.json",
            "the demo's workload from the local disk: callback / the sweep's best",
            "callback",
            "sweep-best",
        ),
    ):
        data = load(root, name)
        src = source(root, name, data)
        rows.append([what, runner_ratio(data, top, bottom), src.date, src.commit_text])
    for name, steps in (("bench_ci_100steps_cpu-2core.json", 100), ("bench_ci_cpu-2core.json", 60)):
        data = load(root, name)
        src = source(root, name, data)
        what = f"the CI example job, {steps} steps: callback / defaults (`maxtp bench`)"
        rows.append([what, _bench_ratio(data), src.date, src.commit_text])
    wall = load(root, "net_wallclock_cpu-2core.json")
    wall_src = source(root, "net_wallclock_cpu-2core.json", wall)
    for job, what in (
        ("long_data_bound", "an 800-step data-bound fit"),
        ("short_data_bound", "a 60-step data-bound fit"),
        ("already_tuned", "a fit whose loader is already tuned"),
    ):
        rows.append(
            [
                f"whole fit's wall-clock, tuning included, callback / defaults, under 1 is "
                f"faster: {what} (`python -m benchmarks.net_wallclock`)",
                _wall_ratio(wall["jobs"][job], "callback", "defaults"),
                wall_src.date,
                wall_src.commit_text,
            ]
        )
    allow = load(root, "allow_cpu_cpu-2core.json")
    allow_src = source(root, "allow_cpu_cpu-2core.json", allow)
    for job, what in (("long", "800-step"), ("short", "80-step")):
        rows.append(
            [
                f'whole {what} fit\'s wall-clock of a small conv net, `allow="all"` / '
                f"defaults, under 1 is faster (`python -m benchmarks.allow_cpu`)",
                _wall_ratio(allow["jobs"][job], "all", "defaults"),
                allow_src.date,
                allow_src.commit_text,
            ]
        )
    mfu = load(root, "mfu_cpu_cpu-2core.json")
    mfu_src = source(root, "mfu_cpu_cpu-2core.json", mfu)
    for job, what in (("large-mlp", "4 x 4096 MLP"), ("transformer", "transformer encoder")):
        row = next(r for r in mfu["rows"] if r["job"] == job)
        rows.append(
            [
                f"MFU of the {what} against the measured fp32 peak (`python -m "
                f"benchmarks.mfu_cpu`)",
                spread(stat(100 * r["mfu"] for r in row["rounds"]), ".0f", "%"),
                mfu_src.date,
                mfu_src.commit_text,
            ]
        )
    pack = load(root, "pack_cpu_ray_cpu-2core.json")
    pack_src = source(root, "pack_cpu_ray_cpu-2core.json", pack)
    for config, what in (
        ("one-after-another", "one after another"),
        ("packed", "`maxtp pack`"),
        ("ray", "as Ray tasks on a running Ray"),
        ("ray-cli", "`maxtp pack --backend ray` starting its own Ray"),
    ):
        rows.append(
            [
                f"four small torch jobs, {what} (`python -m benchmarks.pack_cpu --ray`)",
                spread(round_values(pack, config, "seconds"), ".1f", "s"),
                pack_src.date,
                pack_src.commit_text,
            ]
        )
    return block(table(["what (command)", "result", "date", "commit"], rows))


def _wall_ratio(job: dict[str, Any], top: str, bottom: str) -> str:
    # Whole-fit benchmarks keep each round's seconds per configuration, in round order.
    a = [r["seconds"] for r in job["runs"][top]]
    b = [r["seconds"] for r in job["runs"][bottom]]
    return ratio(stat(a), stat(b), stat(x / y for x, y in zip(a, b, strict=True)))


def gpu_reference(root: Path) -> str:
    """The reference job's GPU figures: targets, with their source, until a GPU run exists."""
    ref = code_value(root, "benchmarks/targets.py", "REFERENCE_JOB")
    why = code_value(root, "benchmarks/targets.py", "SOURCE")
    return block(
        paragraph(
            f"The reference job is JPEG ResNet-50 training on one H200. {_gpu_status(root)}: "
            f"Lightning's defaults {fmt(ref['defaults'], '.0f')} img/s, an expert's hand-tuned "
            f"configuration {fmt(ref['expert'], '.0f')} img/s, the machine's limit about "
            f"{fmt(ref['machine'], '.0f')} img/s. They are {why}, kept in "
            f"`benchmarks/targets.py`, which the GPU checks compare against; they are not "
            f"measurements of this repository."
        )
    )


def _gpu_status(root: Path) -> str:
    runs = sorted(p.name for p in (root / RESULTS / "gpu").glob("*") if p.is_dir())
    if not runs:
        return (
            "Its figures are targets (not yet measured: no GPU run is in `benchmarks/results/gpu/`)"
        )
    return f"Its figures are targets; a GPU run is committed (`benchmarks/results/gpu/{runs[-1]}`)"


def gpu_targets(root: Path) -> str:
    """Every GPU figure the documentation names, each labelled a target until measured."""
    path = "benchmarks/targets.py"
    ref = code_value(root, path, "REFERENCE_JOB")
    cb = code_value(root, path, "CALLBACK")
    infer = code_value(root, path, "INFERENCE")
    status = "target (not yet measured)"
    rows = [
        ["reference job, Lightning's defaults", fmt(ref["defaults"], ".0f"), status, "-"],
        ["reference job, an expert's configuration", fmt(ref["expert"], ".0f"), status, "-"],
        ["reference job, the machine's limit (about)", fmt(ref["machine"], ".0f"), status, "-"],
        [
            'the callback, `allow="all"` from the defaults',
            fmt(cb["callback-all"], ".0f"),
            status,
            "`gpu_check_callback.py`",
        ],
        [
            'the callback, `allow="safe"` from the defaults',
            fmt(cb["callback"], ".0f"),
            status,
            "`gpu_check_callback.py`",
        ],
        [
            "the best data path",
            fmt(code_value(root, path, "DATA_PATH"), ".0f"),
            status,
            "`gpu_check_data.py`",
        ],
        ["inference, a naive loop", fmt(infer["naive"], ".0f"), status, "`gpu_check_inference.py`"],
        [
            "inference, the expert's loop",
            fmt(infer["expert"], ".0f"),
            status,
            "`gpu_check_inference.py`",
        ],
    ]
    return block(
        paragraph(f"{_gpu_status(root)}. Source: {code_value(root, path, 'SOURCE')}."),
        table(["figure (img/s, one H200)", "img/s", "status", "checked by"], rows),
    )


def peak_time(root: Path) -> str:
    """The one statement of how long measuring the peak takes: the code's constants."""
    module = "lightning_maxtp/resources/peak.py"
    per_size = code_value(root, module, "measure_peak", "seconds_per_size")
    cpu = len(code_value(root, module, "CPU_SIZES"))
    cuda = len(code_value(root, module, "CUDA_SIZES"))
    mfu = load(root, "mfu_cpu_cpu-2core.json")
    src = source(root, "mfu_cpu_cpu-2core.json", mfu)
    return block(
        paragraph(
            f"How long it takes: each size is timed for `seconds_per_size` ({per_size} s, "
            f"`measure_peak`'s default) after one warm-up matmul, {cpu} sizes per dtype on a CPU "
            f"and {cuda} on a GPU: about {per_size * cpu:.1f} s on a CPU (fp32 alone) and "
            f"{per_size * cuda * 4:.1f} s on a GPU with its (up to) four dtypes, plus the "
            f"warm-ups. The "
            f"peak `benchmarks.mfu_cpu` divided by took {mfu['peak']['measured_s']:.2f} s to "
            f"measure on {mfu['threads']} CPU threads; that run's commit: {src.commit_text}."
        )
    )


def mfu_quote(root: Path) -> str:
    """The diagnosis of a data-bound job, quoted from the MFU benchmark's median round."""
    mfu = load(root, "mfu_cpu_cpu-2core.json")
    src = source(root, "mfu_cpu_cpu-2core.json", mfu)
    row = next(r for r in mfu["rows"] if r["job"] == "jpeg-mobilenet")
    middle = sorted(row["rounds"], key=lambda r: r["samples_per_s"])[len(row["rounds"]) // 2]
    limit = middle["limit"].split(" (the device at")[0]
    return block(
        paragraph(
            f"A data-bound job's headline reads like this one, from mobilenet_v3_small on JPEGs "
            f"loaded in the main process, the median round of `python -m benchmarks.mfu_cpu` at "
            f"commit {src.commit_text}: `limit: {limit}`."
        )
    )


def scoreboard(root: Path) -> str:
    """Every row of the scoreboard, met or missed."""
    data = load(root, "scoreboard_cpu-2core.json")
    src = source(root, "scoreboard_cpu-2core.json", data)
    rows = []
    for row in data["rows"]:
        per = _per_round(row["detail"])
        detail = re.sub(r"^rounds [\d., ]+; ?", "", row["detail"])
        rounds = ", ".join(f"{v:.2f}x" for v in per.values) if per else "-"
        rows.append(
            [
                f"{row['case']}: {row['check']}",
                row["target"],
                row["shown"],
                rounds,
                "yes" if row["met"] else "**no**",
                detail,
            ]
        )
    rounds = _rounds_text(data)
    return block(
        paragraph(
            f"`python -m benchmarks.scoreboard` (profile {data['profile']}, {rounds}, "
            f"{data['seconds']:.0f} s), {src.date}, commit {src.commit_text}: "
            f"{data['met']} of {data['judged']} rows met ({file_link(src)}, the `.txt` beside "
            f"it)."
        ),
        table(["case: check", "target", "measured", "per round", "met", "detail"], rows),
    )


def _runner_table(
    root: Path, name: str, configs: Sequence[tuple[str, str]], base: str, unit: str
) -> list[str]:
    data = load(root, name)
    src = source(root, name, data)
    cells = []
    for config, label in configs:
        rate = spread(round_values(data, config), ",.1f", unit)
        versus = "-" if config == base else runner_ratio(data, config, base)
        cells.append([label, rate, versus, src.date, src.commit_text])
    return [table([f"`{name}`", "rate", f"/ {base}", "date", "commit"], cells)]


def baseline_jpeg(root: Path) -> str:
    """Lightning's defaults against the hand-tuned loader, resnet18 and mobilenet_v3_small."""
    configs = (("lightning-defaults", "Lightning's defaults"), ("hand-tuned", "hand-tuned"))
    return block(
        *_runner_table(
            root, "baseline_jpeg_cpu-2core.json", configs, "lightning-defaults", "img/s"
        ),
        *_runner_table(
            root,
            "baseline_jpeg_mobilenet_v3_small_cpu-2core.json",
            configs,
            "lightning-defaults",
            "img/s",
        ),
    )


def callback_jpeg(root: Path) -> str:
    """The callback against Lightning's defaults and a hand sweep's best, three workloads."""
    configs = (
        ("lightning-defaults", "Lightning's defaults"),
        ("callback", "defaults + callback"),
        ("sweep-best", "the sweep's best"),
    )
    parts = []
    for name in (
        "callback_jpeg_cpu-2core.json",
        "callback_jpeg_local_cpu-2core.json",
        "callback_jpeg_decode_cpu-2core.json",
    ):
        parts += _runner_table(root, name, configs, "sweep-best", "img/s")
    return block(*parts)


def loader_cpu(root: Path) -> str:
    """The loader alone: each worker count, the plan's pick marked."""
    parts = []
    for name in ("loader_cpu_numpy_cpu-2core.json", "loader_cpu_memory_cpu-2core.json"):
        data = load(root, name)
        plan = data["params"]["plan"]
        # Older runner versions kept the parameters as their repr.
        plan = (ast.literal_eval(plan) if isinstance(plan, str) else plan)["num_workers"]
        configs = [
            (
                c["name"],
                c["name"] + (" (the plan)" if c["settings"].get("num_workers") == plan else ""),
            )
            for c in data["configs"]
        ]
        parts += _runner_table(root, name, configs, data["configs"][0]["name"], "samples/s")
    return block(*parts)


def both_directions(root: Path) -> str:
    """A compute-bound job started with 4 workers and with none, each with and without."""
    configs = (
        ("start-4", "4 workers"),
        ("start-4+callback", "4 workers + callback"),
        ("start-0", "no worker"),
        ("start-0+callback", "no worker + callback"),
    )
    return block(
        *_runner_table(root, "both_directions_cpu-2core.json", configs, "start-4", "img/s")
    )


def inference(root: Path) -> str:
    """The inference pool against a plain loop, in-memory tensors and JPEGs."""
    tensors = (
        ("plain", "plain loop"),
        ("pool", "the pool"),
        ("pool-processes", "the pool, processes"),
    )
    jpeg = (("naive", "naive loop"), ("dataloader", "DataLoader loop"), ("pool", "the pool"))
    return block(
        *_runner_table(root, "inference_cpu_cpu-2core.json", tensors, "plain", "items/s"),
        *_runner_table(root, "inference_cpu_320_cpu-2core.json", tensors, "plain", "items/s"),
        *_runner_table(root, "inference_jpeg_cpu-2core.json", jpeg, "naive", "img/s"),
    )


def _wall_table(
    root: Path, name: str, jobs: Sequence[tuple[str, str]], top: str, bottom: str
) -> str:
    data = load(root, name)
    src = source(root, name, data)
    rows = []
    for job, label in jobs:
        entry = data["jobs"][job]
        rows.append(
            [
                label,
                spread(stat(r["seconds"] for r in entry["runs"][bottom]), ".2f", "s"),
                spread(stat(r["seconds"] for r in entry["runs"][top]), ".2f", "s"),
                _wall_ratio(entry, top, bottom),
                src.date,
                src.commit_text,
            ]
        )
    return table([f"`{name}`", bottom, top, f"{top} / {bottom}", "date", "commit"], rows)


def allow_cpu(root: Path) -> str:
    """Whole fits of a small conv net: Lightning's defaults, ``allow="safe"``, ``allow="all"``."""
    jobs = (("long", "800 steps"), ("short", "80 steps"))
    return block(
        _wall_table(root, "allow_cpu_cpu-2core.json", jobs, "safe", "defaults"),
        _wall_table(root, "allow_cpu_cpu-2core.json", jobs, "all", "defaults"),
    )


def net_wallclock(root: Path) -> str:
    """Whole fits, tuning included, with and without the callback."""
    data = load(root, "net_wallclock_cpu-2core.json")
    jobs = [(job, f"{job} ({data['jobs'][job]['steps']} steps)") for job in data["jobs"]]
    return block(_wall_table(root, "net_wallclock_cpu-2core.json", jobs, "callback", "defaults"))


def demo_runs(root: Path) -> str:
    """Every recorded run of the demo, and their median and range."""
    data, runs, speedup = _demo(root)
    cost, budget = _demo_cost(runs)
    rows = []
    for r in runs:
        rows.append(
            [
                r["date"],
                r["commit"][:7],
                r["tree"],
                f"{r['baseline_samples_per_s']:.1f} -> {r['final_samples_per_s']:.1f}",
                f"{r['final_samples_per_s'] / r['baseline_samples_per_s']:.2f}x",
                "-" if r["tuning_steps"] is None else str(r["tuning_steps"]),
                "-" if r["cost_s"] is None else f"{r['cost_s']:.1f} s of {r['budget_s']:.1f} s",
                "-" if r["fit_s"] is None else f"{r['fit_s']:.0f} s",
                r["recorded_in"],
            ]
        )
    return block(
        paragraph(
            f"`{data['command']}` ({data['workload']}), {len(runs)} recorded runs "
            f"({_demo_span(runs, True)}): the rate under the final settings over the baseline "
            f"window's, {spread(speedup, '.2f', 'x', 'runs')}; tuning cost "
            f"{spread(cost, '.1f', 's', 'runs')} against a budget of "
            f"{spread(budget, '.1f', 's', 'runs')} (`benchmarks/results/demo_runs_cpu-2core.json`"
            f", transcribed from the records each row names: the demo writes no result file)."
        ),
        table(
            [
                "date",
                "commit",
                "tree",
                "img/s, baseline -> final",
                "ratio",
                "tuning steps",
                "cost (budget)",
                "fit",
                "recorded in",
            ],
            rows,
        ),
    )


def mfu_cpu(root: Path) -> str:
    """How far the reference CPU jobs run from the measured fp32 peak."""
    name = "mfu_cpu_cpu-2core.json"
    data = load(root, name)
    src = source(root, name, data)
    peak = data["peak"]["rates"][0]
    rows = []
    for row in data["rows"]:
        rows.append(
            [
                row["job"],
                spread(stat(r["samples_per_s"] for r in row["rounds"]), ",.1f", "samples/s"),
                spread(stat(100 * r["mfu"] for r in row["rounds"]), ".1f", "%"),
                ", ".join(sorted({r["bottleneck"] for r in row["rounds"]})),
            ]
        )
    return block(
        paragraph(
            f"`python -m benchmarks.mfu_cpu`, {file_link(src)}, {src.date}, commit "
            f"{src.commit_text}; {data['threads']} CPU threads, the measured {peak['dtype']} "
            f"peak {peak['flops_per_s'] / 1e12:.3f} TFLOP/s ({peak['size']} wide"
            f"{', read from the cache' if data['peak'].get('cached') else ''})."
        ),
        table(["job", "rate", "MFU", "bottleneck"], rows),
    )


def data_paths(root: Path) -> str:
    """The loader alone over each data path."""
    name = "data_paths_cpu_cpu-2core.json"
    data = load(root, name)
    src = source(root, name, data)
    base = "float32"
    rows = []
    for path, rounds in data["rounds"].items():
        rates = [r["samples_per_s"] for r in rounds]
        base_rates = [r["samples_per_s"] for r in data["rounds"][base]]
        versus = (
            "-"
            if path == base
            else ratio(
                stat(rates),
                stat(base_rates),
                stat(a / b for a, b in zip(rates, base_rates, strict=True)),
            )
        )
        rows.append([path, spread(stat(rates), ",.0f", "img/s"), versus, src.date, src.commit_text])
    return block(table([f"`{name}`", "rate", f"/ {base}", "date", "commit"], rows))


def pack(root: Path) -> str:
    """Independent jobs one after another, packed, and on Ray."""
    parts = []
    for name in (
        "pack_cpu_cpu-2core.json",
        "pack_cpu_python_cpu-2core.json",
        "pack_cpu_ray_cpu-2core.json",
    ):
        data = load(root, name)
        src = source(root, name, data)
        rows = []
        for config in (c["name"] for c in data["configs"]):
            seconds = round_values(data, config, "seconds")
            base = "one-after-another"
            versus = "-" if config == base else runner_ratio(data, base, config, "seconds")
            rows.append([config, spread(seconds, ".1f", "s"), versus, src.date, src.commit_text])
        parts.append(table([f"`{name}`", "wall-clock", "speed-up", "date", "commit"], rows))
        if "ray_start_s" in data["params"]:
            parts.append(
                paragraph(
                    f"Ray's own start took {data['params']['ray_start_s']:.1f} s and its shutdown "
                    f"{data['params']['ray_stop_s']:.1f} s in this run (once each)."
                )
            )
    return block(*parts)


def bench(root: Path) -> str:
    """``maxtp bench`` on the CI example job, the fork server, and the gate's false alarms."""
    rows = []
    for name in ("bench_ci_cpu-2core.json", "bench_ci_100steps_cpu-2core.json"):
        data = load(root, name)
        src = source(root, name, data)
        rows.append(
            [
                f"`{name}`: {data['params']['steps']} steps after {data['params']['warmup']}",
                spread(_bench_runs(data, "defaults"), ",.1f", "samples/s"),
                spread(_bench_runs(data, "maxtp"), ",.1f", "samples/s"),
                _bench_ratio(data),
                src.date,
                src.commit_text,
            ]
        )
    ci = table(["job", "defaults", "callback", "callback / defaults", "date", "commit"], rows)
    fork_name = "bench_fork_cpu_cpu-2core.json"
    fork = load(root, fork_name)
    fork_src = source(root, fork_name, fork)
    forked = stat(r["wall_s"] for r in fork["runs"]["forked"])
    fresh = stat(r["wall_s"] for r in fork["runs"]["fresh"])
    pairs = stat(
        a["wall_s"] / b["wall_s"]
        for a, b in zip(fork["runs"]["forked"], fork["runs"]["fresh"], strict=True)
    )
    return block(
        ci,
        paragraph(
            f"The gate's bench with its runs forked from one server, `python -m "
            f"benchmarks.bench_fork_cpu`, `{fork_name}`, {fork_src.date}, commit "
            f"{fork_src.commit_text}: {spread(forked, '.1f', 's', 'pairs')} against "
            f"{spread(fresh, '.1f', 's', 'pairs')} with a new interpreter per run, "
            f"{ratio(forked, fresh, pairs, 'pairs')}."
        ),
    )


def bench_gate(root: Path) -> str:
    """``bench_gate_cpu``: each gate's false alarms on the unchanged job and catches of -10 %."""
    name = "bench_gate_cpu_cpu-2core.json"
    gate = load(root, name)
    src = source(root, name, gate)
    first = gate["limits"]["paired"][0]
    verdict = (
        f"Paired at -{100 * first:.0f} %: false alarms {100 * gate['false_alarms']:.0f} % of "
        f"{gate['repeats']['paired']} unchanged repeats (target under 5 %), the 10 % slowdown "
        f"caught in {100 * gate['caught']:.0f} % (target at least 95 %): "
        f"{'met' if gate['met'] else 'not met'}; {gate['steps']} timed steps a run, "
        f"{gate['seconds'] / 60:.0f} minutes in all."
    )
    return block(
        table(
            [f"`{name}`: gate", "job", "steady change", "failed", "date", "commit"],
            gate_table_rows(gate, src),
        ),
        paragraph(verdict),
    )


def gate_table_rows(gate: dict[str, Any], src: Source) -> list[list[str]]:
    """One row per gate and job of ``bench_gate_cpu``: its change and how often it failed."""
    how = {"paired": "paired (`--against`, {r} rounds)", "stored": "stored baseline ({r} rounds)"}
    rows = []
    for mode, variants in gate["outcomes"].items():
        for variant, outcomes in variants.items():
            change = stat(100 * o["steady_change"] for o in outcomes)
            fails = ", ".join(
                f"{sum(not o['passed'][str(limit)] for o in outcomes)} of {len(outcomes)} at "
                f"-{100 * limit:.0f} %"
                for limit in gate["limits"][mode]
            )
            rows.append(
                [
                    how[mode].format(r=gate["rounds"][mode]),
                    variant,
                    spread(change, "+.1f", "%", "repeats"),
                    fails,
                    src.date,
                    src.commit_text,
                ]
            )
    return rows


def ci_suite(root: Path) -> str:
    """The test command's wall-clock, one test at a time and on pytest-xdist."""
    text = (root / RESULTS / "ci_suite_cpu-2core.md").read_text()
    # The table's rows: | run | commit | set-up | pytest | .ci/run set-up excluded | tests |.
    runs: dict[str, list[tuple[str, float]]] = {"before": [], "after": []}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[1] and cells[0].split()[0] in runs and cells[4].endswith(" s"):
            runs[cells[0].split()[0]].append((cells[1], float(cells[4][:-2].replace(",", ""))))
    date = re.search(r"\b(20\d\d-\d\d-\d\d)\b", text)
    if not runs["before"] or not runs["after"] or not date:
        raise RenderError(f"{RESULTS}/ci_suite_cpu-2core.md: its table or date moved")
    before = stat(s for _, s in runs["before"])
    after = stat(s for _, s in runs["after"])
    return block(
        paragraph(
            f"`.ci/run` from a fresh clone, set-up excluded (`{RESULTS}/ci_suite_cpu-2core.md`, "
            f"from {date.group(1)}): one test at a time {spread(before, ',.0f', 's', 'runs')}, "
            f"commit {runs['before'][0][0]}; with pytest-xdist "
            f"{spread(after, ',.0f', 's', 'runs')}, commits {runs['after'][0][0]} to "
            f"{runs['after'][-1][0]}, the suite growing between them."
        )
    )


def _console_lines(root: Path) -> list[str]:
    """The demo's console output as ``benchmarks/demo_record.py`` recorded it, line by line."""
    path = root / RESULTS / "demo_console_cpu-2core.txt"
    if not path.is_file():
        raise RenderError(f"{path.relative_to(root)} is missing: run benchmarks/demo_record.py")
    return path.read_text().splitlines()


def console(root: Path) -> str:
    """The demo's whole console output, as a user sees it (a sample, not a measurement)."""
    return "\n```text\n" + "\n".join(_console_lines(root)) + "\n```\n"


def console_limit(root: Path) -> str:
    """The demo's closing lines: the result, and what holds the run now with its distance."""
    kept = [x for x in _console_lines(root) if x.startswith(("maxtp: result", "maxtp: now"))]
    return "\n```text\n" + "\n".join(kept) + "\n```\n"


REGIONS: dict[str, Callable[[Path], str]] = {
    "console": console,
    "console-limit": console_limit,
    "headline": headline,
    "readme-measured": readme_measured,
    "gpu-reference": gpu_reference,
    "gpu-targets": gpu_targets,
    "peak-time": peak_time,
    "mfu-quote": mfu_quote,
    "scoreboard": scoreboard,
    "baseline-jpeg": baseline_jpeg,
    "callback-jpeg": callback_jpeg,
    "loader-cpu": loader_cpu,
    "allow-cpu": allow_cpu,
    "net-wallclock": net_wallclock,
    "both-directions": both_directions,
    "demo-runs": demo_runs,
    "mfu-cpu": mfu_cpu,
    "data-paths": data_paths,
    "inference": inference,
    "pack": pack,
    "bench": bench,
    "bench-gate": bench_gate,
    "ci-suite": ci_suite,
}
"""Every generated region, by the name its markers carry."""


def pages(root: Path) -> list[Path]:
    """The files whose regions this script owns: the README and the documentation's pages."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(text: str, root: Path, cache: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """``text`` with every region rendered again, and the names of the regions that changed.

    Raises:
        RenderError: For a region whose name is not in ``REGIONS``.
    """
    cache = {} if cache is None else cache
    changed: list[str] = []

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in REGIONS:
            raise RenderError(f"unknown region {name!r} (known: {', '.join(REGIONS)})")
        if name not in cache:
            cache[name] = REGIONS[name](root)
        if match.group(2) != cache[name]:
            changed.append(name)
        return f"<!-- numbers:{name} -->{cache[name]}<!-- /numbers -->"

    return REGION.sub(fill, text), changed


def stale(root: Path, write: bool) -> list[str]:
    """``file: region`` for every stale region; with ``write``, each is rewritten.

    Raises:
        RenderError: For an unknown region or a missing result file.
    """
    found: list[str] = []
    cache: dict[str, str] = {}
    for page in pages(root):
        text = page.read_text()
        new, changed = render(text, root, cache)
        found += [f"{page.relative_to(root)}: {name}" for name in changed]
        if write and new != text:
            page.write_text(new)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the generated regions, or with ``--check`` report the stale ones (exit 1).

    Returns 2, with the reason, when a region cannot be rendered.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any region is stale"
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the repository (default: this checkout)"
    )
    args = parser.parse_args(argv)
    try:
        found = stale(args.root, write=not args.check)
    except RenderError as err:
        print(f"render_docs: {err}", file=sys.stderr)
        return 2
    for entry in found:
        print(f"{'stale' if args.check else 'rewrote'}: {entry}")
    if args.check and found:
        print("run `python -m benchmarks.render_docs` and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
