"""Every GPU check in one run that fits one 8-minute GPU slot, each in its own process.

Runs each ``benchmarks/gpu_check_*.py`` (found by glob, so a new check is not forgotten) one
after another in a fixed order: the resource probe first (cheap, and when it is wrong every
check after it is suspect), then by increasing expected cost (the loader before the callback,
which builds on its tuning), so running short of time late in the run costs the fewest checks.
Each script runs in a fresh interpreter (``sys.executable``, the repository root as working
directory and first on ``PYTHONPATH``) in its own process group, with a time budget from
``BUDGETS`` (seconds on one H200 with 16 CPUs, start-up included; they add up to less than the
480 s deadline; the two JPEG training checks run with ``--quick``, see ``GPU_ARGS``, to fit).
A script may also use what the scripts before it left unused of their budgets,
never what the later ones are owed. One that runs out of time is killed with its children and
recorded as ``timeout``, one that ends without a JSON last line as ``crashed``, and the others
still run; a script that could not finish before the deadline is not started (``not run``, out
of time).

Why one process per script: each check leaves state behind (CUDA contexts, allocator caches,
Lightning's launcher variables, a memory-fraction cap), and a crash or hang in one must not
take the others with it. Why a GPU run describes the machine only after the checks, in a
short-lived process: a CUDA context held by this process while they run would be a foreign
process on the GPU to the probe, the packer and the strategy planner.

Per script it records the exit code, the status (``ok``, ``failed``, ``timeout``, ``crashed``,
``not run``), the seconds, the script's own JSON last line (null when its last line is not
JSON) and the names of its failed checks: its ``failed`` list, or else the entries of its
``rows`` or ``checks`` with ``ok`` false (``gpu_check_diagnosis`` and ``gpu_check_inference``
print their own JSON, without a ``failed`` list). A script is ``ok`` only with exit code 0, a
JSON last line and no failed check. Prints one table, then one JSON line (``check``, ``smoke``,
``machine``, ``total_s``, ``scripts``, ``failed``: the scripts not ok); exits 1 when a script
is not ok.

``--smoke`` passes ``--smoke`` to every script (CPU plumbing, tiny sizes). Each of them pays
the torch and Lightning imports (~75 s one after another on 2 CPUs), so smoke mode runs
``SMOKE_JOBS`` at a time, longest first, each with one intra-op thread, and reports them in
the same fixed order. A GPU run is always one script at a time: each check measures the whole
machine. ``--results-dir DIR`` keeps each script's full output (stdout, then stderr) as
``DIR/gpu_check_<name>.txt``, for a person to commit; ``--only inspect,loader`` runs a subset;
``--deadline-s`` gives the whole run more (or less) than 480 s.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_all.py [--smoke] [--out FILE]
[--results-dir DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PREFIX = "gpu_check_"


@dataclass(frozen=True)
class Budget:
    """One script's seconds: its budget on the GPU host, what it is estimated to need, why.

    ``smoke_s`` is its ``--smoke`` time measured alone on the 2-CPU development VM; smoke mode
    starts the longest first.
    """

    gpu_s: float
    need_s: float
    smoke_s: float
    why: str


# None of the checks has run on a GPU yet, so need_s is read off each script for one H200 with
# 16 CPUs (~5 s to import Lightning, JPEGs generated at ~9 ms and decoded at ~4 ms each on one
# core, the 201 img/s of Lightning's defaults on the JPEG ResNet-50 workload). Run in full, the
# two JPEG training checks alone need ~350 s, so here they run with --quick (half the images,
# one round, a shorter sweep), which brings the whole run within the 480 s slot. Rebalance
# these from the first real run's seconds (benchmarks/results/gpu_check_all_*.txt).
BUDGETS: dict[str, Budget] = {
    "inspect": Budget(20, 20, 0.2, "5 CLI probes, a CUDA allocator process, 1 pytest"),
    "pack": Budget(50, 55, 17, "8 torch jobs x 3000 steps in turn, packed, on Ray if any; OOM x2"),
    "inference": Budget(60, 75, 12, "1024 JPEGs made, 2 pools started, 3 rounds of 8192 images"),
    "strategy": Budget(60, 80, 4.4, "4 fresh fits of a 200 M MLP (1 FSDP + CPU offload), 1 pytest"),
    "diagnosis": Budget(70, 85, 4.8, "5 planted fits (512 JPEGs made), 6 x 200 steps, 8192^2 MLP"),
    "batch_size": Budget(80, 100, 8.7, "2 searches of 20 s (+25 %), Lightning's power, 1 pytest"),
    "loader": Budget(60, 70, 7.3, "--quick: 1024 JPEGs made; 3 configs x 1 round of 25 steps"),
    "callback": Budget(60, 90, 25, "--quick: 1024 JPEGs made; sweep 0/8/15, 3 fits of 120 steps"),
    # Last: past the 480 s slot when every check uses its whole budget (then "not run";
    # `--only data` runs it alone).
    "data": Budget(60, 80, 17, "--quick: 1024 JPEGs, pre-encoded once; 4 fits of 20 steps"),
}
GPU_ARGS = {"loader": ["--quick"], "callback": ["--quick"], "data": ["--quick"]}
"""Arguments of the full (GPU) run; ``--smoke`` replaces them in smoke mode."""
NEW_SCRIPT = Budget(30, 30, 30, "not in BUDGETS: a default, started last")
DEADLINE_S = 480.0
MACHINE_S = 20.0  # kept for describing the machine at the end (torch import, CUDA init)
KILL_GRACE_S = 5.0  # SIGTERM first: Lightning and DataLoader shut their worker processes down
SMOKE_TIMEOUT_S = 120.0  # smoke runs take 0.2-25 s alone here; a loaded CI runner, 3x that
SMOKE_JOBS = 3  # 2 CPUs: a third process fills the cores while the others import or sleep
# Several torch processes with 2 intra-op threads each on 2 cores stall at their barriers
# (measured here: resnet18 at batch 2 trained ~900x slower); one thread each shares fairly.
SMOKE_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
DESCRIBE = (
    "import json, torch; ok = torch.cuda.is_available(); "
    "print(json.dumps([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]"
    " if ok else []))"
)


@dataclass
class Outcome:
    """What one script did."""

    name: str
    status: str
    seconds: float
    budget_s: float
    timeout_s: float
    exit_code: int | None = None
    result: dict[str, Any] | None = None
    failed_checks: list[str] | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "status": self.status, "exit_code": self.exit_code,
            "seconds": round(self.seconds, 1), "budget_s": self.budget_s,
            "timeout_s": round(self.timeout_s, 1),
            "failed_checks": self.failed_checks, "detail": self.detail, "result": self.result,
        }  # fmt: skip


def discover(scripts_dir: Path) -> dict[str, Path]:
    """The check scripts in ``scripts_dir`` by short name, in run order (unknown ones last).

    Args:
        scripts_dir: Folder holding ``gpu_check_*.py``.

    Returns:
        ``{"inspect": path, ...}``: ``BUDGETS`` order first, then new scripts by name.
    """
    paths = sorted(scripts_dir.glob(f"{PREFIX}*.py"))
    found = {p.stem[len(PREFIX) :]: p for p in paths if p.stem != f"{PREFIX}all"}
    order = [n for n in BUDGETS if n in found] + [n for n in found if n not in BUDGETS]
    return {name: found[name] for name in order}


def last_json(stdout: str) -> dict[str, Any] | None:
    """The last non-empty line of ``stdout`` as a JSON object, or None when it is not one."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = data.get("rows") if isinstance(data.get("rows"), list) else data.get("checks")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def failed_checks(data: dict[str, Any]) -> list[str]:
    """The names of a script's failed checks: its ``failed`` list, else its rows with ok false.

    Args:
        data: The script's JSON last line.

    Returns:
        The names, in the script's order.
    """
    if isinstance(data.get("failed"), list):
        return [str(name) for name in data["failed"]]
    return [
        str(r.get("check") or r.get("case") or "?") for r in _rows(data) if r.get("ok") is False
    ]


def classify(
    exit_code: int | None, timed_out: bool, data: dict[str, Any] | None
) -> tuple[str, list[str] | None]:
    """Status and failed-check names from what a finished (or killed) script left.

    Args:
        exit_code: Its exit code (negative: the signal that ended it).
        timed_out: Whether it was killed for running out of time.
        data: Its JSON last line, or None.

    Returns:
        ``(status, failed check names or None when there is no JSON)``.
    """
    names = None if data is None else failed_checks(data)
    if timed_out:
        return "timeout", names
    if data is None:
        return "crashed", None
    return ("failed" if exit_code != 0 or names else "ok"), names


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:100] if lines else ""


def _detail(status: str, code: int | None, data: dict[str, Any] | None, stderr: str) -> str:
    if status == "ok":
        rows = _rows(data or {})
        passed = sum(r.get("ok") is True for r in rows)
        return f"{passed} ok, {len(rows) - passed} skipped/info" if rows else "no check rows"
    if status == "failed":
        names = failed_checks(data or {})
        return ", ".join(names)[:100] if names else f"exit code {code}"
    return f"exit code {code}: {_last_line(stderr) or 'no output on stderr'}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The script's children (DataLoader workers, pack jobs, a GPU allocator) share its group;
    # one left behind would hold GPU memory or CPUs while the next check measures.
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        grace = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < grace:
            proc.poll()  # reap the leader, or the group never looks empty
            os.killpg(proc.pid, 0)
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is empty
    proc.wait()


def run_script(
    name: str,
    path: Path,
    args: list[str],
    budget_s: float,
    timeout_s: float,
    results_dir: Path | None,
) -> Outcome:
    """Run one check script in a fresh interpreter and its own process group.

    Args:
        name: Its short name (``inspect``).
        path: The script.
        args: Its arguments (``["--smoke"]``, or its ``GPU_ARGS``).
        budget_s: Its own budget (recorded).
        timeout_s: Seconds before it is killed (with everything in its process group): its
            budget and what the scripts before it left unused.
        results_dir: Where to keep its stdout and stderr as ``gpu_check_<name>.txt``, or None.

    Returns:
        What it did.
    """
    path_var = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    threads = SMOKE_THREADS if "--smoke" in args else {}
    threads = {k: v for k, v in threads.items() if k not in os.environ}  # a user's choice wins
    env = {**os.environ, **threads, "PYTHONPATH": path_var}
    command = [sys.executable, str(path), *args]
    # Files, not pipes: a grandchild that outlives the script cannot block reading its output.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            command, stdout=out, stderr=err, env=env, cwd=ROOT, start_new_session=True
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)  # also what a finished script left running
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    data = last_json(stdout)
    status, names = classify(proc.returncode, timed_out, data)
    detail = _detail(status, proc.returncode, data, stderr)
    if timed_out:
        detail = f"killed after {timeout_s:.0f} s; last output: {_last_line(stdout + stderr)}"
    if results_dir is not None:
        shown = " ".join([*(f"{k}={v}" for k, v in threads.items()), "PYTHONPATH=. python",
                          str(path.relative_to(path.parents[1])), *args])  # fmt: skip
        header = f"$ {shown}\n# {status}, exit code {proc.returncode}, {seconds:.1f} s\n"
        body = stdout + (f"\n--- stderr ---\n{stderr}" if stderr else "")
        (results_dir / f"{path.stem}.txt").write_text(header + body)
    return Outcome(name, status, seconds, budget_s, timeout_s, proc.returncode, data, names, detail)


Runner = Callable[[str, Path, list[str], float, float, Path | None], Outcome]


def run_all(
    scripts: dict[str, Path],
    *,
    smoke: bool,
    budgets: dict[str, float],
    deadline_s: float,
    results_dir: Path | None = None,
    jobs: int = 1,
    runner: Runner = run_script,
) -> list[Outcome]:
    """Run the scripts within their budgets and the deadline; outcomes in ``scripts`` order.

    Args:
        scripts: Short name -> script, in run order.
        smoke: Pass ``--smoke`` to each (else each script's ``GPU_ARGS``).
        budgets: Short name -> seconds.
        deadline_s: No script starts that could not end within this many seconds from now.
        results_dir: Where each script's output is kept, or None.
        jobs: Scripts run at a time; with 1, a script may also use the time the ones before it
            left unused (it cannot with several: they share the clock).
        runner: Runs one script (tests pass a stand-in).

    Returns:
        One outcome per script.
    """
    start = time.monotonic()
    lock = threading.Lock()
    owed = sum(budgets.values())  # budgets of the scripts not yet started (sequential only)
    done: dict[str, Outcome] = {}

    def one(name: str) -> None:
        nonlocal owed
        with lock:
            left = deadline_s - (time.monotonic() - start)
            owed -= budgets[name]
            timeout = budgets[name] if jobs > 1 else max(budgets[name], left - owed)
        if timeout > left:
            done[name] = Outcome(name, "not run", 0.0, budgets[name], 0.0,
                                 detail=f"out of time: {max(left, 0):.0f} s left")  # fmt: skip
        else:
            args = ["--smoke"] if smoke else GPU_ARGS.get(name, [])
            done[name] = runner(name, scripts[name], args, budgets[name], timeout, results_dir)
        with lock:
            o = done[name]
            print(f"[{len(done)}/{len(scripts)}] {name}: {o.status} in {o.seconds:.1f} s",
                  flush=True)  # fmt: skip

    if jobs <= 1:
        for name in scripts:
            one(name)
    else:
        longest_first = sorted(scripts, key=lambda n: -BUDGETS.get(n, NEW_SCRIPT).smoke_s)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for future in [pool.submit(one, name) for name in longest_first]:
                future.result()
    return [done[name] for name in scripts]


def describe_machine() -> dict[str, Any]:
    """GPU names (through torch.cuda, in a short-lived process) and the usable CPU count."""
    from lightning_maxtp.resources.host import probe_cpus

    cpus = probe_cpus().effective  # affinity and the cgroup quota
    try:
        out = subprocess.run(
            [sys.executable, "-c", DESCRIBE], capture_output=True, text=True, check=True,
            timeout=MACHINE_S, cwd=ROOT,
        )  # fmt: skip
        gpus: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as err:
        return {"device": f"unknown ({type(err).__name__})", "gpus": None, "cpus": cpus}
    names = sorted(set(gpus))
    device = ", ".join(f"{gpus.count(n)}x {n}" for n in names) if gpus else "cpu"
    return {"device": device, "gpus": gpus, "cpus": cpus}


def print_table(outcomes: list[Outcome]) -> None:
    print(f"{'script':<12} {'status':<8} {'seconds':>7} {'budget':>6}  failed checks / detail")
    for o in outcomes:
        print(f"{o.name:<12} {o.status:<8} {o.seconds:>7.1f} {o.budget_s:>6.0f}  {o.detail}")


def main(argv: list[str] | None = None) -> int:
    """Run the checks; print the table and one JSON line; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="pass --smoke to every script")
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    parser.add_argument("--only", help="comma-separated short names, e.g. inspect,loader")
    parser.add_argument("--results-dir", type=Path, help="keep each script's output here")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                        help=f"seconds for the whole run (default {DEADLINE_S:g})")  # fmt: skip
    # For the tests and for measuring: stand-in scripts, one budget for all, smoke concurrency.
    parser.add_argument("--scripts-dir", type=Path, default=HERE, help=argparse.SUPPRESS)
    parser.add_argument("--budget-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=SMOKE_JOBS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    scripts = discover(args.scripts_dir)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in scripts]
        if unknown:
            parser.error(f"--only: unknown {unknown}; known: {', '.join(scripts)}")
        scripts = {n: p for n, p in scripts.items() if n in wanted}
    if args.results_dir is not None:
        args.results_dir.mkdir(parents=True, exist_ok=True)
    budgets = {
        n: args.budget_s or (SMOKE_TIMEOUT_S if args.smoke else BUDGETS.get(n, NEW_SCRIPT).gpu_s)
        for n in scripts
    }
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1) as side:
        # Smoke checks leave the GPU alone, so there the machine is described meanwhile.
        described = side.submit(describe_machine) if args.smoke else None
        outcomes = run_all(
            scripts, smoke=args.smoke, budgets=budgets, results_dir=args.results_dir,
            deadline_s=args.deadline_s - MACHINE_S, jobs=args.jobs if args.smoke else 1,
        )  # fmt: skip
        machine = described.result() if described else describe_machine()
    total = time.perf_counter() - start
    print()
    print_table(outcomes)
    failed = [o.name for o in outcomes if o.status != "ok"]
    print(f"machine: {machine['device']}, {machine['cpus']} CPUs; {total:.1f} s in all")
    line = json.dumps({
        "check": "gpu_check_all", "smoke": args.smoke, "machine": machine,
        "total_s": round(total, 1), "scripts": [o.to_dict() for o in outcomes], "failed": failed,
    })  # fmt: skip
    print(line, flush=True)
    if args.out:
        args.out.write_text(line + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
