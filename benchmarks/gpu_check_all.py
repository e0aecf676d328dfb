"""Every GPU check in one call on a lent GPU, each in its own process; rows kept as they come.

Two profiles. ``compact`` (the default, the first call on a lent machine: at most 6 minutes
with ``timeout_s`` = 390): the preflight, then ``inspect``, ``callback`` (Lightning's defaults,
``allow="safe"``, ``allow="all"`` and the expert's hand configuration on the JPEG ResNet-50
job), ``data`` (nvJPEG's pixels, the data paths), ``loader``, ``batch_size``, ``strategy`` and
``inference``, most valuable first; ``full`` runs every ``gpu_check_*.py`` (found by glob, so a
new check is not forgotten; one no profile lists yet runs last) in a second call.

Before the scripts: the **preflight** (a short-lived process: CUDA usable, NVML, the versions,
the effective CPUs, ``/dev/shm``, whether NVML lists a process by its own pid, and what the
probe makes of that process's GPU); with no usable GPU the run stops there, exit 2
(``--no-require-gpu`` goes on). Then the JPEG sets the scripts read are generated once on
every CPU into ``$MAXTP_DATA_DIR``, which the scripts share.

Each script runs in a fresh interpreter (``sys.executable``, the repository root first on
``PYTHONPATH``) in its own process group, with a time budget from its profile (seconds on one
H200 with 16 CPUs, start-up included, estimated: nothing has run on a GPU yet). A script may
also use what the scripts before it left unused of their budgets, never what the later ones
are owed. One that runs out of time gets SIGTERM (``benchmarks.checks`` then prints its rows so
far and exits), then SIGKILL with its children, and is recorded as ``timeout``; one that ends
without a JSON last line as ``crashed``; a script that could not finish before the deadline is
not started (``not run``, out of time).

Every row is printed as it is measured and, with ``--out-dir DIR``, appended to
``DIR/rows.jsonl``; ``DIR/log.txt`` gets each script's command, status and whole output as it
ends, and ``DIR/summary.json`` / ``DIR/summary.txt`` are rewritten after each script: four
files, and a run cut short still leaves every finished row. The last line printed is a short
JSON summary (``check``, ``profile``, ``smoke``, ``machine``, ``total_s``, ``scripts`` with
their status and failed checks, ``failed``); exit 1 when a script is not ok.

Why one process per script: each check leaves state behind (CUDA contexts, allocator caches,
Lightning's launcher variables, a memory-fraction cap), and a crash or hang in one must not
take the others with it. This process never creates a CUDA context: it would be a foreign
process on the GPU to the probe, the packer and the strategy planner.

``--smoke`` passes ``--smoke`` to every script of the profile (CPU plumbing, tiny sizes):
``SMOKE_JOBS`` at a time, longest first, each with one intra-op thread, reported in the
profile's order; each is forked off one server process that imported torch and Lightning once
(about half the smoke run's time here), in its own session as above. ``--results-dir DIR``
also keeps each script's output as ``DIR/gpu_check_<name>.txt``; ``--only inspect,loader``
runs a subset; ``--deadline-s`` changes the profile's deadline. The device command is in
``benchmarks/GPU.md``.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_all.py [--profile compact|full] [--smoke]
[--out-dir DIR] [--out FILE]``
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
sys.path.insert(0, str(ROOT))  # run as a script: the repository's packages first

from benchmarks.checks import DATA_DIR_ENV, ROWS_ENV, SCRIPT_ENV, show_row  # noqa: E402

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
# 16 CPUs (~5 s to import Lightning, JPEGs decoded at ~4 ms each on one core, the 201 img/s of
# Lightning's defaults on the JPEG ResNet-50 workload); the JPEG sets are generated before the
# scripts start, on every CPU. Rebalance these from the first real run's seconds
# (benchmarks/results/gpu/).
FULL: dict[str, Budget] = {
    "inspect": Budget(20, 20, 0.2, "5 CLI probes, a CUDA allocator process, 1 pytest"),
    "pack": Budget(50, 55, 17, "8 torch jobs x 3000 steps in turn, packed, on Ray if any; OOM x2"),
    "inference": Budget(60, 75, 12, "1024 JPEGs, 2 pools started, 3 rounds of 8192 images"),
    "strategy": Budget(60, 80, 4.4, "4 fresh fits of a 200 M MLP (1 FSDP + CPU offload), 1 pytest"),
    "diagnosis": Budget(70, 85, 4.8, "5 planted fits (512 JPEGs made), 6 x 200 steps, 8192^2 MLP"),
    "batch_size": Budget(80, 100, 8.7, "2 searches of 20 s (+25 %), Lightning's power, 1 pytest"),
    "loader": Budget(60, 70, 7.3, "--quick: 3 configs x 1 round of 25 steps"),
    "callback": Budget(60, 90, 25, "--quick: sweep 0/8/15, 3 fits of 120 steps"),
    # Last: past the 480 s slot when every check uses its whole budget (then "not run";
    # `--only data` runs it alone).
    "data": Budget(60, 80, 17, "--quick: nvJPEG pixels, pre-encoded once; 4 fits of 20 steps"),
}
COMPACT: dict[str, Budget] = {
    # By value: the probe (every later row depends on it), the callback against the expert
    # (the product's claim), then the data path, the loader plan, the batch search, the
    # strategy, the inference pool.
    "inspect": FULL["inspect"],
    "callback": Budget(110, 110, 28, "--compact: defaults, safe, all, the expert: 4 fits"),
    "data": Budget(50, 80, 17, "--quick: nvJPEG pixels, pre-encoded once; 4 fits of 20 steps"),
    "loader": Budget(40, 60, 7.3, "--quick: 3 configs x 1 round of 25 steps"),
    "batch_size": Budget(40, 40, 8.7, "--quick: 2 searches of 8 s, no Lightning, no pytest"),
    "strategy": Budget(30, 60, 4.4, "--quick: 4 fresh fits of a 200 M MLP, no pytest"),
    "inference": Budget(40, 50, 12, "--quick: 2 pools started, 1 round of 3072 images"),
}
"""The first call on a lent GPU: at most ``DEADLINES["compact"]`` seconds, the most valuable
first. A script may use what the ones before it left; a late one past the deadline is not run."""
PROFILES = {"compact": COMPACT, "full": FULL}
DEADLINES = {"compact": 330.0, "full": 480.0}
"""Seconds for the scripts (the preflight, the data sets and the machine's description come on
top: about 30 s; the compact call is then at most 6 minutes)."""
BUDGETS = FULL  # every script's budget (discovery order, smoke-mode concurrency)
GPU_ARGS = {"loader": ["--quick"], "callback": ["--quick"], "data": ["--quick"]}
"""Arguments of the full (GPU) run; ``--smoke`` replaces them in smoke mode."""
PROFILE_ARGS = {
    "compact": GPU_ARGS
    | {"callback": ["--compact"], "inference": ["--quick"]}
    | {"batch_size": ["--quick"], "strategy": ["--quick"]},
    "full": GPU_ARGS,
}
SMOKE_ARGS = PROFILE_ARGS["compact"]
"""Added to ``--smoke`` in either profile: the compact profile's own arguments (the callback's
expert and ``allow="all"`` runs); the scripts' smoke sizes win over ``--quick``."""
SHARED_SETS = ((1024, 288), (1024, 320))
"""JPEG sets (images, side) the scripts read, generated once before they start."""
NEW_SCRIPT = Budget(30, 30, 30, "not in BUDGETS: a default, started last")
DEADLINE_S = DEADLINES["full"]
PREFLIGHT_S = 60.0  # torch and Lightning imported, a CUDA context, NVML, the probe
KILL_GRACE_S = 5.0  # SIGTERM first: Lightning and DataLoader shut their worker processes down
SMOKE_TIMEOUT_S = 120.0  # smoke runs take 0.2-25 s alone here; a loaded CI runner, 3x that
SMOKE_JOBS = 3  # 2 CPUs: a third process fills the cores while the others import or sleep
# Several torch processes with 2 intra-op threads each on 2 cores stall at their barriers
# (measured here: resnet18 at batch 2 trained ~900x slower); one thread each shares fairly.
SMOKE_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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
    output: str = ""
    """Its command, status, stdout and stderr, as kept in the results (not in ``to_dict``)."""

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


def _kill_group(proc: subprocess.Popen[bytes] | _Forked) -> None:
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


PRELOAD = ("torch", "torchvision", "lightning.pytorch")
"""What the smoke mode's fork server imports once: about 7 s of each script's start here."""


def _forked_main(path: str, args: list[str], env: dict[str, str], out: str, err: str) -> None:
    # In a child of the fork server: the script's own session, environment, files and argv,
    # then the script as ``__main__``; its atexit handlers (Ray's shutdown, logging's flush)
    # run before multiprocessing ends the process with os._exit.
    import atexit
    import multiprocessing
    import runpy

    # A child of the fork server inherits its start method: the script's DataLoader workers
    # would be forked off the server and sent the dataset, ~1 s a worker. A fresh
    # interpreter's default instead.
    multiprocessing.set_start_method(None, force=True)
    os.setsid()
    os.chdir(ROOT)
    os.environ.clear()
    os.environ.update(env)
    for fd, name in ((1, out), (2, err)):
        with open(name, "ab") as file:
            os.dup2(file.fileno(), fd)
    sys.argv = [path, *args]
    sys.path[:0] = [str(Path(path).parent), str(ROOT)]
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        atexit._run_exitfuncs()


class _Forked:
    """A script forked off the smoke mode's fork server, driven like a ``subprocess.Popen``.

    The server (``multiprocessing``'s forkserver, one process that imported ``PRELOAD`` and
    runs no threads) forks every script, so the smoke mode pays the imports once, not once a
    script: about 50 of its ~100 CPU seconds here. The GPU run keeps one fresh interpreter per
    script (a forked CUDA process is unusable, and each check must start clean).
    """

    def __init__(self, path: Path, args: list[str], env: dict[str, str], out: str, err: str):
        self._process = _fork_server().Process(
            target=_forked_main, args=(str(path), args, env, out, err)
        )
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        self._process.join(0)
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(str(self._process), timeout or 0.0)
        return self._process.exitcode


def _fork_server() -> Any:
    import multiprocessing

    # The server starts with this process's environment, and libgomp reads its thread count
    # when torch is imported there: one intra-op thread per script, as a fresh one gets.
    for key, value in SMOKE_THREADS.items():
        os.environ.setdefault(key, value)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def _stop_fork_server() -> None:
    # The server is this process's child until it exits: a caller that runs main() in-process
    # (the tests) would keep it, and count it among its own children. multiprocessing has no
    # public call to stop it; this private one exists from Python 3.8 to 3.14.
    import multiprocessing.forkserver

    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def start_fork_server() -> None:
    """Start the smoke mode's fork server and wait for its imports, before any script's clock."""
    process = _fork_server().Process(target=time.time)
    process.start()
    process.join()


def run_script(
    name: str,
    path: Path,
    args: list[str],
    budget_s: float,
    timeout_s: float,
    results_dir: Path | None,
) -> Outcome:
    """Run one check script in its own process group.

    A fresh interpreter, or with ``--smoke`` a child of the fork server that imported
    ``PRELOAD`` once.

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
    env = {**os.environ, **threads, "PYTHONPATH": path_var, SCRIPT_ENV: name}
    command = [sys.executable, str(path), *args]
    # Files, not pipes: a grandchild that outlives the script cannot block reading its output.
    with tempfile.NamedTemporaryFile() as out, tempfile.NamedTemporaryFile() as err:
        start = time.perf_counter()
        proc: subprocess.Popen[bytes] | _Forked
        if "--smoke" in args:
            proc = _Forked(path, args, env, out.name, err.name)
        else:
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
    shown = " ".join([*(f"{k}={v}" for k, v in threads.items()), "PYTHONPATH=. python",
                      str(path.relative_to(path.parents[1])), *args])  # fmt: skip
    header = f"$ {shown}\n# {status}, exit code {proc.returncode}, {seconds:.1f} s\n"
    output = header + stdout + (f"\n--- stderr ---\n{stderr}" if stderr else "")
    if results_dir is not None:
        (results_dir / f"{path.stem}.txt").write_text(output)
    return Outcome(
        name, status, seconds, budget_s, timeout_s, proc.returncode, data, names, detail, output
    )


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
    extra_args: dict[str, list[str]] | None = None,
    on_done: Callable[[Outcome], None] | None = None,
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
        extra_args: Short name -> its arguments (default: ``GPU_ARGS``, or ``SMOKE_ARGS``
            after ``--smoke``).
        on_done: Called with each outcome as it comes (the results are rewritten then).

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
            extra = (SMOKE_ARGS if smoke else GPU_ARGS) if extra_args is None else extra_args
            args = ["--smoke"] * smoke + extra.get(name, [])
            done[name] = runner(name, scripts[name], args, budgets[name], timeout, results_dir)
        with lock:
            o = done[name]
            print(f"[{len(done)}/{len(scripts)}] {name}: {o.status} in {o.seconds:.1f} s",
                  flush=True)  # fmt: skip
            if on_done is not None:
                on_done(o)

    if jobs <= 1:
        for name in scripts:
            one(name)
    else:
        longest_first = sorted(scripts, key=lambda n: -BUDGETS.get(n, NEW_SCRIPT).smoke_s)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for future in [pool.submit(one, name) for name in longest_first]:
                future.result()
    return [done[name] for name in scripts]


def table(outcomes: list[Outcome]) -> str:
    """The scripts' table, one line each."""
    lines = [f"{'script':<12} {'status':<8} {'seconds':>7} {'budget':>6}  failed checks / detail"]
    lines += [
        f"{o.name:<12} {o.status:<8} {o.seconds:>7.1f} {o.budget_s:>6.0f}  {o.detail}"
        for o in outcomes
    ]
    return "\n".join(lines)


PREFLIGHT = r"""
import importlib.metadata as md, json, os, shutil, sys
out = {"python": sys.version.split()[0], "versions": {}}
for pkg in ("torch", "torchvision", "lightning", "nvidia-ml-py", "psutil", "ray", "litdata"):
    try:
        out["versions"][pkg] = md.version(pkg)
    except md.PackageNotFoundError:
        out["versions"][pkg] = None
import torch
out["cuda"] = torch.cuda.is_available()
out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
out["shm_free_gib"] = round(shutil.disk_usage("/dev/shm").free / 2**30, 1)
out["own_pid_listed"] = None
if out["cuda"]:
    torch.ones(1, device="cuda")  # a context: NVML lists this process now, by some pid
    try:
        import pynvml
        pynvml.nvmlInit()
        pids = [p.pid for i in range(pynvml.nvmlDeviceGetCount())
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(
                    pynvml.nvmlDeviceGetHandleByIndex(i))]
        out["own_pid_listed"] = os.getpid() in pids
        out["nvml_pids"] = pids[:8]
    except Exception as err:
        out["nvml_error"] = f"{type(err).__name__}: {err}"
from lightning_maxtp.resources import inspect_resources
res = inspect_resources()
out["cpus"] = res.cpu.effective
out["free_gpus"] = list(res.advice.free_gpus)
out["busy_gpus"] = [f"{b.index}: {b.reason}" for b in res.advice.busy_gpus]
out["gpu_backend"] = res.gpu_backend
print(json.dumps(out))
"""
"""What the first seconds on a lent machine must show: CUDA usable, NVML, the versions, the
CPUs, ``/dev/shm``, and the PID self-check (whether NVML lists this process under its own pid:
in a container it does not) with what the probe then makes of this process's own GPU."""


def preflight(require_gpu: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``PREFLIGHT`` in a short-lived process; its facts and its rows (failed ones fail)."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", PREFLIGHT], capture_output=True, text=True, check=True,
            timeout=PREFLIGHT_S, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        facts: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as err:
        detail = getattr(err, "stderr", None) or str(err)
        row = {"check": "preflight ran", "ok": False, "detail": _last_line(str(detail))}
        return {"cuda": False, "gpus": None}, [row]
    gpus = facts.get("gpus") or []
    rows = [
        {"check": "CUDA usable", "ok": bool(facts["cuda"]) if require_gpu else None,
         "detail": ", ".join(gpus) or "no GPU"},
        {"check": "versions", "ok": None, "detail": json.dumps(facts["versions"])},
        {"check": "effective CPUs, /dev/shm", "ok": None,
         "detail": f"{facts['cpus']} CPUs, {facts['shm_free_gib']} GiB free in /dev/shm"},
        {"check": "NVML lists this process by its pid", "ok": None,
         "detail": f"{facts.get('own_pid_listed')} (pids {facts.get('nvml_pids')}; "
                   f"{facts.get('nvml_error') or 'NVML ok'}; backend {facts['gpu_backend']})"},
        {"check": "the probe keeps this process's GPU free",
         "ok": bool(facts["free_gpus"]) if gpus else None,
         "detail": f"free {facts['free_gpus']}; busy {facts['busy_gpus']}"},
    ]  # fmt: skip
    return facts, rows


def prepare_data(profile: str, smoke: bool) -> str:
    """Generate the shared JPEG sets once, on every CPU; ``$MAXTP_DATA_DIR`` for the scripts."""
    base = os.environ.setdefault(DATA_DIR_ENV, str(Path(tempfile.gettempdir()) / "maxtp_gpu_data"))
    if smoke:
        return "smoke: each script makes its own tiny set"
    from benchmarks.workloads.jpeg import JpegSpec, default_data_dir, generate_jpeg_dataset
    from lightning_maxtp.resources.host import probe_cpus

    cpus = probe_cpus().effective
    began = time.perf_counter()
    for images, side in SHARED_SETS:
        spec = JpegSpec(images=images, image_size=side)
        generate_jpeg_dataset(default_data_dir(spec), spec, processes=cpus)
    return f"{len(SHARED_SETS)} sets in {base} ({time.perf_counter() - began:.1f} s, {cpus} CPUs)"


class Results:
    """The ``--out-dir`` files, rewritten as each script ends: at most four, whatever happens.

    ``rows.jsonl`` (every row of every script as measured, from ``benchmarks.checks``),
    ``log.txt`` (each script's command, status and whole output), ``summary.json`` and
    ``summary.txt`` (the table so far).
    """

    def __init__(self, folder: Path | None, profile: str, smoke: bool) -> None:
        self.folder, self.profile, self.smoke = folder, profile, smoke
        self.outcomes: list[Outcome] = []
        self.facts: dict[str, Any] = {}
        self.started = time.perf_counter()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            for name in ("rows.jsonl", "log.txt"):
                (folder / name).write_text("")

    def rows(self, script: str, rows: list[dict[str, Any]]) -> None:
        """Rows this runner measured itself (the preflight)."""
        for row in rows:
            show_row(row, script, self.folder and self.folder / "rows.jsonl")

    def add(self, outcome: Outcome) -> None:
        """One script ended: its output to the log, the summary rewritten."""
        self.outcomes.append(outcome)
        if self.folder is not None:
            with (self.folder / "log.txt").open("a") as f:
                f.write(outcome.output + "\n\n")
            self.write()

    def summary(self, whole: bool = False) -> dict[str, Any]:
        """The run so far, short enough for the last lines of a device call's output.

        ``whole``: with each script's exit code, budget and JSON result.
        """
        scripts = [
            o.to_dict() if whole else
            {"name": o.name, "status": o.status, "seconds": round(o.seconds, 1),
             "failed_checks": o.failed_checks, "detail": o.detail[:200]}
            for o in self.outcomes
        ]  # fmt: skip
        return {
            "check": "gpu_check_all", "profile": self.profile, "smoke": self.smoke,
            "machine": self.facts, "total_s": round(time.perf_counter() - self.started, 1),
            "scripts": scripts, "failed": [o.name for o in self.outcomes if o.status != "ok"],
        }  # fmt: skip

    def write(self) -> None:
        if self.folder is None:
            return
        (self.folder / "summary.json").write_text(json.dumps(self.summary(), indent=1) + "\n")
        with (self.folder / "summary.txt").open("w") as f:
            f.write(table(self.outcomes) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run the checks; print the table and one JSON line; return the exit code."""
    saved = {name: os.environ.get(name) for name in (ROWS_ENV, DATA_DIR_ENV, *SMOKE_THREADS)}
    try:
        return _main(argv)
    finally:  # the scripts' shared settings are this run's, not the caller's
        _stop_fork_server()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="pass --smoke to every script")
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="compact",
        help="compact: the first call on a GPU (6 minutes); full: every check",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, help="write the whole record (each script's JSON result) here"
    )
    parser.add_argument(
        "--out-dir", type=Path, help="rows.jsonl, log.txt, summary.json, summary.txt, as they come"
    )
    parser.add_argument("--only", help="comma-separated short names, e.g. inspect,loader")
    parser.add_argument("--results-dir", type=Path, help="keep each script's output here")
    parser.add_argument("--deadline-s", type=float,
                        help="seconds for the scripts (default: the profile's)")  # fmt: skip
    parser.add_argument("--no-require-gpu", action="store_true",
                        help="run a GPU profile even where CUDA is not usable")  # fmt: skip
    # For the tests and for measuring: stand-in scripts, one budget for all, smoke concurrency.
    parser.add_argument("--scripts-dir", type=Path, default=HERE, help=argparse.SUPPRESS)
    parser.add_argument("--budget-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=SMOKE_JOBS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    found = discover(args.scripts_dir)
    # The profile's scripts in its order; a script no profile knows yet runs last.
    scripts = {n: found[n] for n in profile if n in found}
    scripts |= {n: p for n, p in found.items() if n not in FULL}
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in found]
        if unknown:
            parser.error(f"--only: unknown {unknown}; known: {', '.join(found)}")
        scripts = {n: p for n, p in found.items() if n in wanted}
    if args.results_dir is not None:
        args.results_dir.mkdir(parents=True, exist_ok=True)
    budgets = {
        n: args.budget_s
        or (SMOKE_TIMEOUT_S if args.smoke else profile.get(n, FULL.get(n, NEW_SCRIPT)).gpu_s)
        for n in scripts
    }
    results = Results(args.out_dir, args.profile, args.smoke)
    if args.out_dir is not None:
        os.environ[ROWS_ENV] = str(args.out_dir / "rows.jsonl")  # the scripts append to it
    require_gpu = not (args.smoke or args.no_require_gpu)
    facts, rows = preflight(require_gpu)
    results.facts = {**facts, "data": prepare_data(args.profile, args.smoke)}
    results.rows("preflight", rows)
    results.write()
    if require_gpu and any(r["ok"] is False for r in rows):
        line = json.dumps({**results.summary(), "failed": ["preflight"]})
        print(line, flush=True)
        if args.out:
            args.out.write_text(line + "\n")
        return 2  # no usable GPU: the checks would only measure the CPU fallback
    deadline = args.deadline_s or DEADLINES[args.profile]
    if args.smoke:
        start_fork_server()
    extra = SMOKE_ARGS if args.smoke else PROFILE_ARGS[args.profile]
    outcomes = run_all(
        scripts, smoke=args.smoke, budgets=budgets, results_dir=args.results_dir,
        deadline_s=deadline, jobs=args.jobs if args.smoke else 1, extra_args=extra,
        on_done=results.add,
    )  # fmt: skip
    results.outcomes = outcomes  # in the profile's order
    results.write()
    print()
    print(table(outcomes))
    summary = results.summary()
    print(f"machine: {', '.join(facts.get('gpus') or []) or 'no GPU'}, {facts.get('cpus')} CPUs; "
          f"{summary['total_s']:.1f} s in all")  # fmt: skip
    print(json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results.summary(whole=True)) + "\n")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
