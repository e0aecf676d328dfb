"""The scoreboard: every case the closed loop must hold, in one command, one table.

Each change to the loop (``tuning/``, ``callbacks/``, ``knobs/``, ``observe/diagnosis.py``)
runs it: a change that wins one row and loses another is not done. Every case times whole
``Trainer.fit`` calls in this one process, the hand settings and the callback in turn within
each round, the order reversed every other round (A/B interleaved, so a machine that drifts
moves both, and over an even number of rounds favours neither), and compares medians:

================  =====================================================================
case              what it holds
================  =====================================================================
jpeg_defaults     a data-bound JPEG job at Lightning's defaults: the callback's whole fit
                  against the best of a hand sweep of workers run in every round (by
                  median), and its steady rate against the sweep's best
waiting_loader    items that wait 3 ms on reads: workers scale past the cores; the whole
                  fit against the best hand setting, and the tuning cost against its budget
short_epochs      12-step epochs, each followed by a 2-batch validation pass, from 0 and
                  from 4 workers that restart every epoch: against the best hand setting
both_directions   a compute-bound ResNet-18 from 4 and from 0 workers: the better hand
                  setting either way
never_slower      tiny steps, a short data-bound fit, an already tuned loader, a compute-
                  bound conv net: at most 1.05x (or +0.5 s under 5 s); the fixed cost
                  before the first step
allow_all         ``allow="all"`` on a CPU conv net, short and long: never below 0.97x
batch_knee        ``find_batch_size``'s knee trains as fast as Lightning's largest batch
monitor_cost      the monitor's own cost per step
demo              ``examples/demo.py``'s job: defaults, then with the callback
================  =====================================================================

The full profile runs two rounds of each case, three of those whose single rounds land
further apart than their margin and one of the demo, whose margin dwarfs its spread
(``ROUNDS``). ``--quick`` runs a subset in about six minutes, ``--smoke`` every case at toy
sizes in about a minute with no targets (CI runs it). Each row is printed the moment it is
measured; the table follows, then one JSON line (also written to ``--out``).

Usage: ``python -m benchmarks.scoreboard [--quick | --smoke] [--rounds N] [--only CASE,...]
[--out FILE] [--table FILE]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["CASES", "PROFILES", "ROUNDS", "Profile", "Row", "main"]


@dataclass(frozen=True)
class Profile:
    """How much of each case runs."""

    name: str
    rounds: int
    scale: float
    """Job lengths are multiplied by this (the full profile: 1)."""
    cases: tuple[str, ...]
    case_rounds: tuple[tuple[str, int], ...] = ()
    """``(case, rounds)``: cases that run this many rounds in place of ``rounds``."""

    @property
    def smoke(self) -> bool:
        """Toy sizes, no targets."""
        return self.name == "smoke"

    def rounds_of(self, case: str) -> int:
        """Rounds of ``case``: its own (``case_rounds``), else the profile's.

        A smoke run keeps its one round everywhere.
        """
        if self.smoke:
            return self.rounds
        return dict(self.case_rounds).get(case, self.rounds)

    def steps(self, full: int, least: int = 8) -> int:
        """``full`` steps scaled to this profile, at least ``least``."""
        return max(least, round(full * self.scale))


@dataclass(frozen=True)
class Row:
    """One measured check: its target, what was measured, whether it was met."""

    case: str
    check: str
    target: str
    measured: float
    shown: str
    """``measured`` as the table prints it."""
    met: bool | None
    """``None``: no target (smoke)."""
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)


Emit = Callable[[Row], None]


def ratio_row(
    case: str,
    check: str,
    ours: list[float],
    theirs: list[float],
    *,
    most: float,
    smoke: bool,
    slack_s: float | None = None,
    detail: str = "",
) -> Row:
    """A row comparing two series of whole-fit seconds (lower is better), as a median ratio.

    Met when the median ratio is at most ``most``, or, with ``slack_s``, when the callback's
    median fit is at most that many seconds longer on a fit under 5 s.
    """
    ratios = [a / b for a, b in zip(ours, theirs, strict=True) if b > 0]
    ratio = statistics.median(ratios) if ratios else float("nan")
    extra = statistics.median(ours) - statistics.median(theirs)
    target = f"<= {most:.2f}x"
    met = ratio <= most
    if slack_s is not None:
        target += f" (or +{slack_s:g} s under 5 s)"
        met = met or (statistics.median(theirs) < 5 and extra <= slack_s)
    shown = f"{ratio:.2f}x ({statistics.median(ours):.1f} vs {statistics.median(theirs):.1f} s)"
    spread = ", ".join(f"{r:.2f}" for r in ratios)
    text = f"rounds {spread}" + (f"; {detail}" if detail else "")
    return Row(case, check, target, ratio, shown, None if smoke else met, text)


def run(profile: Profile, emit: Emit, only: set[str] | None = None) -> list[Row]:
    """Every case of ``profile`` (or ``only`` those), rows emitted as measured."""
    from benchmarks import scoreboard_cases as cases

    rows: list[Row] = []

    def keep(row: Row) -> None:
        rows.append(row)
        emit(row)

    for name in profile.cases:
        if only and name not in only:
            continue
        started = time.perf_counter()
        try:
            getattr(cases, name)(profile, keep)
        except Exception as err:  # one broken case must not hide the others' rows
            keep(Row(name, "ran", "no error", 0.0, f"failed: {err!r}"[:80], False, repr(err)))
        print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
    return rows


CASES = (
    "jpeg_defaults",
    "waiting_loader",
    "short_epochs",
    "both_directions",
    "never_slower",
    "allow_all",
    "batch_knee",
    "monitor_cost",
    "demo",
)
"""Every case, the most valuable first (a cut-short run keeps those)."""

ROUNDS = (("short_epochs", 3), ("never_slower", 3), ("demo", 1))
"""Cases that run other than the full profile's two rounds, and how many.

More where single rounds land further apart than the margin: ``never_slower``'s ratios are
the callback's cost against the machine's noise (the same 9.6 s conv fit without the callback
took 9.6 to 15.3 s in four rounds by hand); ``short_epochs`` from 4 workers pays one epoch at
the user's setting while it is measured (some 6 % of the fit), and its single rounds at one
commit read 0.95x to 1.27x against the 1.10x target. With three rounds the median outlasts one
such round. Fewer where the margin dwarfs the spread: every ``demo`` round of the fourteen
committed full runs before this table read 0.46x to 0.60x against its 0.80x target, and a
round costs a minute. The quick profile keeps one round of ``short_epochs``."""

PROFILES = {
    "full": Profile("full", 2, 1.0, CASES, ROUNDS),
    "quick": Profile(
        "quick",
        1,
        0.8,
        ("jpeg_defaults", "waiting_loader", "short_epochs", "never_slower"),
        (("never_slower", 3),),
    ),
    "smoke": Profile("smoke", 1, 0.1, CASES),
}


def format_table(rows: list[Row], profile: Profile, seconds: float) -> str:
    """The table people read: one line per row, then how many were met."""
    width = max([len("case / check"), *(len(f"{r.case} / {r.check}") for r in rows)])
    target_width = max([len("target"), *(len(r.target) for r in rows)])
    rounds = f"{profile.rounds} round(s)"
    for case in dict.fromkeys(r.case for r in rows):
        if profile.rounds_of(case) != profile.rounds:
            rounds += f", {case} {profile.rounds_of(case)}"
    lines = [
        f"scoreboard ({profile.name}, {rounds}, {seconds:.0f} s)",
        "",
        f"{'case / check':<{width}}  {'target':<{target_width}}  {'measured':<34}  met",
    ]
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        label = f"{r.case} / {r.check}"
        lines.append(f"{label:<{width}}  {r.target:<{target_width}}  {r.shown:<34}  {met}")
    judged = [r for r in rows if r.met is not None]
    missed = [f"{r.case} / {r.check}" for r in judged if not r.met]
    lines += ["", f"met {len(judged) - len(missed)} of {len(judged)} rows"]
    if missed:
        lines.append("missed: " + "; ".join(missed))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the scoreboard; print each row as measured, the table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a subset, about six minutes")
    mode.add_argument("--smoke", action="store_true", help="toy sizes, no targets (CI)")
    parser.add_argument(
        "--rounds", type=int, help="rounds of every case (default: the profile's own per case)"
    )
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--out", type=Path, help="also write the JSON line here")
    parser.add_argument("--table", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    profile = PROFILES["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error(f"--rounds must be at least 1, got {args.rounds}")
        profile = dataclasses.replace(profile, rounds=args.rounds, case_rounds=())
    only = None if not args.only else set(args.only.split(","))
    if only and not only <= set(CASES):
        parser.error(f"--only names unknown cases {sorted(only - set(CASES))}; known: {CASES}")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_maxtp"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    from benchmarks.runner import describe_machine, git_state
    from lightning_maxtp.resources import inspect_resources

    machine = inspect_resources().to_dict()
    print(describe_machine(machine), flush=True)

    def emit(row: Row) -> None:
        met = "-" if row.met is None else ("met" if row.met else "MISSED")
        print(f"{row.case} / {row.check}: {row.shown} (target {row.target}) {met}", flush=True)

    started = time.perf_counter()
    rows = run(profile, emit, only)
    seconds = time.perf_counter() - started
    table = format_table(rows, profile, seconds)
    commit, dirty = git_state()
    record = {
        "benchmark": "scoreboard",
        "profile": profile.name,
        "rounds": profile.rounds,
        "case_rounds": dict(profile.case_rounds),
        "only": sorted(only) if only else None,
        "seconds": seconds,
        "git_commit": commit,
        "git_dirty": dirty,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "rows": [r.to_dict() for r in rows],
        "met": sum(1 for r in rows if r.met),
        "judged": sum(1 for r in rows if r.met is not None),
    }
    line = json.dumps(record)
    for path, text in ((args.out, line), (args.table, table)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
    print(table)
    print(line, flush=True)
    return record


if __name__ == "__main__":
    sys.exit(0 if all(r["met"] is not False for r in main()["rows"]) else 1)
