"""The end of ``.ci/run``: the suite's wall-clock per pass and its slowest tests.

Reads the JUnit XML files the passes wrote (a test's time there is its setup, call and teardown
together) so that the next change that makes the suite slower is seen in CI's output.

Usage: ``python .ci/slowest.py --pass NAME START END XML [--pass ...]`` (START and END: the pass's
clock readings in seconds, as bash's ``$EPOCHREALTIME`` gives them).
"""

from __future__ import annotations

import argparse
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SHOWN = 10


def read_cases(path: Path) -> list[tuple[float, str]]:
    """``(seconds, test id)`` of every test case in one JUnit XML file (none if it is absent)."""
    if not path.is_file() or path.stat().st_size == 0:
        return []
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        cases.append((float(case.get("time") or 0.0), f"{module}.py::{case.get('name')}"))
    return cases


def main(argv: list[str] | None = None) -> int:
    """Print the passes' wall-clock, the slowest tests and, with ``--run``, the whole run's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pass",
        dest="passes",
        nargs=4,
        action="append",
        metavar=("NAME", "START", "END", "XML"),
        required=True,
        help="one pass: its name, when it started and ended (seconds) and its JUnit XML file",
    )
    parser.add_argument(
        "--run",
        nargs=2,
        metavar=("SETUP_START", "CHECKS_START"),
        help="when .ci/run started its set-up and its checks: prints both times up to now",
    )
    args = parser.parse_args(argv)
    total, parts, cases = 0.0, [], []
    for name, start, end, xml in args.passes:
        found = read_cases(Path(xml))
        wall_s = float(end) - float(start)
        total += wall_s
        parts.append(f"{name} {wall_s:.0f} s ({len(found)} tests)")
        cases += [(seconds, f"{test}  [{name}]") for seconds, test in found]
    print(f"pytest wall-clock: {total:.0f} s = " + " + ".join(parts))
    print(f"the {min(SHOWN, len(cases))} slowest tests (setup + call + teardown):")
    for seconds, test in sorted(cases, reverse=True)[:SHOWN]:
        print(f"  {seconds:7.1f} s  {test}")
    if args.run:
        setup_start, checks_start = (float(t) for t in args.run)
        now = time.time()
        print(
            f".ci/run: {now - checks_start:.0f} s of lint, type checks, benchmark gate and tests"
            f" (set-up before them: {checks_start - setup_start:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
