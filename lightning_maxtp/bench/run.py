"""``run_bench`` and ``run_against``: a job's configurations in fresh processes, rounds alternating.

Round r runs every configuration once, in the given order (A, B, A, B, ...), so a machine that
drifts over minutes drifts for all of them alike. Each run is a fresh process running
``lightning_maxtp.bench.child``: nothing warmed by one configuration helps the next. Where it
can, it is forked from one server that imported torch and Lightning once
(``lightning_maxtp.bench.forkserver``); otherwise it is a new interpreter. This module starts
processes only; it imports neither torch nor lightning.

``run_against`` times a second job (the code to hold the first to) in the same rounds, the two
runs of a round back to back.

Long because both share one rounds loop, one child runner and one fork server, which would
otherwise cross modules as private names.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from lightning_maxtp._checks import COUNT, SECONDS, refuse_bool
from lightning_maxtp.bench.forkserver import ForkServer, fork_allowed
from lightning_maxtp.bench.gate import MIN_PAIRED_ROUNDS, PAIRED_ROUNDS
from lightning_maxtp.bench.reference import REFERENCE
from lightning_maxtp.bench.result import BenchResult
from lightning_maxtp.bench.target import BenchTargetError, check_function, parse_target

__all__ = ["BenchRunError", "run_against", "run_bench"]

logger = logging.getLogger(__name__)

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class BenchRunError(RuntimeError):
    """The job built but its fit failed, crashed or ran out of time (one line)."""


def _target_text(target: str | Callable[..., Any]) -> str:
    if isinstance(target, str):
        return target
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if module is None or not name.isidentifier():
        raise BenchTargetError(
            f"target {target!r} must be a module-level function (or a 'FILE.py:FUNCTION' string)"
        )
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is not None and spec.name and spec.name != "__main__":  # python -m pkg.script
            return f"{spec.name}:{name}"
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if main_file is None:
            raise BenchTargetError(
                f"target {name}() is defined in an interactive session; put it in a file and "
                "pass 'FILE.py:FUNCTION'"
            )
        return f"{main_file}:{name}"
    return f"{module}:{name}"


def _check(configs: Sequence[str], steps: int, warmup: int, rounds: int) -> None:
    for name, value, example in (
        ("steps", steps, 100),
        ("warmup", warmup, 10),
        ("rounds", rounds, 3),
    ):
        refuse_bool(name, value, f"{COUNT} >= 1", example)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if not configs:
        raise ValueError("configs (--configs) is empty; give at least one, e.g. defaults,maxtp")
    bad = [c for c in configs if not re.fullmatch(r"[A-Za-z0-9_.-]+", c)]
    if bad:
        raise ValueError(f"configs (--configs) {bad}: a name is letters, digits, '_', '.', '-'")
    if len(set(configs)) != len(configs):
        raise ValueError(f"configs (--configs) {list(configs)} name one configuration twice")


def _git() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _child_env(env: Mapping[str, str] | None, with_sys_path: bool) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    # The child must import this same copy of the package, installed or not; and a function
    # passed as an object, from wherever this process found its module.
    paths = [str(_PACKAGE_ROOT), *(sys.path if with_sys_path else []), out.get("PYTHONPATH", "")]
    out["PYTHONPATH"] = os.pathsep.join(p for p in dict.fromkeys(paths) if p)
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


def _stderr() -> Any:
    """This process's stderr for a child to write to (the table keeps stdout to itself)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # a captured stream without a file: the child inherits stdout
    return sys.stderr


def _run_child(
    argv: list[str],
    out: Path,
    env: dict[str, str],
    server: ForkServer | None,
    *,
    timeout_s: float,
    verbose: bool,
    what: str,
) -> dict[str, Any]:
    log = out.with_suffix(".log")
    code: int | None
    if server is not None:
        try:
            code = server.run(argv, None if verbose else log, timeout_s)
        except RuntimeError as err:  # the server died: the run is lost, say so in one line
            raise BenchRunError(f"{what}: {err}") from None
    else:
        with log.open("w") as sink:
            try:
                code = subprocess.run(
                    [sys.executable, "-m", "lightning_maxtp.bench.child", *argv],
                    env=env,
                    timeout=timeout_s,
                    check=False,
                    text=True,
                    stdout=_stderr() if verbose else sink,
                    stderr=subprocess.STDOUT,
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
    if code is None:
        raise BenchRunError(f"{what} did not finish in {timeout_s:.0f} s (--timeout)")
    if out.is_file():
        record: dict[str, Any] = json.loads(out.read_text())
        if "error" not in record:
            return record
        message = f"{what}: {record['error']}"
        if record.get("stage") == "target":
            raise BenchTargetError(message)
        raise BenchRunError(message)
    text = log.read_text(errors="replace") if log.is_file() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "no output"
    raise BenchRunError(f"{what} exited with code {code} before writing a result: {last}")


def _server(env: dict[str, str], verbose: bool, tmp: Path) -> ForkServer | None:
    """A fork server for the children, or None where each must be a fresh interpreter."""
    if not fork_allowed(env):
        return None
    stderr = _stderr() if verbose else (tmp / "forkserver.log").open("w")
    try:
        server = ForkServer(env, stderr)
    except OSError as err:
        logger.debug("bench: no fork server (%s); each run is a new interpreter", err)
        return None
    finally:
        if not verbose:
            stderr.close()
    if not server.ready:
        logger.debug("bench: no fork server (%s); each run is a new interpreter", server.why)
        server.close()
        return None
    return server


@dataclass(frozen=True)
class _Side:
    """One job a bench times: its target text and what its children put first on ``sys.path``."""

    text: str
    sys_path: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    """What this side's result records beside the bench's own parameters."""


def _run_rounds(
    sides: Sequence[_Side],
    configs: Sequence[str],
    *,
    steps: int,
    warmup: int,
    rounds: int,
    accelerator: str | None,
    timeout_s: float,
    child_env: dict[str, str],
    reference: bool,
    progress: TextIO | None,
    verbose: bool,
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """Every side's runs (one list per side, in run order) and the machine the first probed.

    Round r runs each configuration of each side once. With two sides the order flips every
    round (A B, B A, A B, ...), so neither side always runs first after the other warmed the
    machine's caches or caught its slow minute.
    """
    runs: list[list[dict[str, Any]]] = [[] for _ in sides]
    machine: dict[str, Any] = {}
    labels = [
        "" if len(sides) == 1 else f"{'target' if i == 0 else 'against'} "
        for i in range(len(sides))
    ]
    with tempfile.TemporaryDirectory(prefix="maxtp-bench-") as tmp:
        server = _server(child_env, verbose, Path(tmp))
        with server if server is not None else contextlib.nullcontext():
            for r in range(1, rounds + 1):
                order = list(range(len(sides)))
                if r % 2 == 0:
                    order.reverse()
                for config in configs:
                    for i in order:
                        side = sides[i]
                        out = Path(tmp) / f"r{r}-s{i}-{config}.json"
                        argv = [
                            "--target",
                            side.text,
                            "--config",
                            config,
                            "--steps",
                            str(steps),
                            "--warmup",
                            str(warmup),
                            "--out",
                            str(out),
                        ]
                        for path in side.sys_path:
                            argv += ["--sys-path", path]
                        if accelerator is not None:
                            argv += ["--accelerator", accelerator]
                        if not reference:
                            argv.append("--no-reference")
                        if not any(runs):
                            argv.append("--probe")
                        what = f"{side.text} (config {config}, round {r})"
                        record = _run_child(
                            argv,
                            out,
                            child_env,
                            server,
                            timeout_s=timeout_s,
                            verbose=verbose,
                            what=what,
                        )
                        record["round"] = r
                        machine = record.pop("machine", machine)
                        runs[i].append(record)
                        if progress is not None:
                            ref = record["reference_samples_per_s"]
                            print(
                                f"maxtp bench: round {r}/{rounds} {labels[i]}{config}: "
                                f"{record['steady_samples_per_s']:.1f} samples/s steady, fit "
                                f"{record['fit_seconds']:.1f} s"
                                + ("" if ref is None else f", reference {ref:.0f}/s"),
                                file=progress,
                                flush=True,
                            )
    return runs, machine


def _start(
    target: str | Callable[..., Any],
    *,
    configs: Sequence[str],
    steps: int,
    warmup: int,
    rounds: int,
    timeout_s: float,
) -> str:
    text = _target_text(target)
    _check(configs, steps, warmup, rounds)
    check_function(parse_target(text), tuple(configs))
    refuse_bool("timeout_s", timeout_s, SECONDS, 1800)
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    return text


def _bench(
    sides: Sequence[_Side],
    configs: tuple[str, ...],
    *,
    steps: int,
    warmup: int,
    rounds: int,
    accelerator: str | None,
    timeout_s: float,
    child_env: dict[str, str],
    reference: bool,
    progress: TextIO | None,
    verbose: bool,
) -> list[BenchResult]:
    """Time every side (``_run_rounds``) and make each one's result, in the order given.

    With ``reference`` each run times the reference workload; without, the bench is paired
    (the other side is the reference).
    """
    load_before = _load_avg()
    runs, machine = _run_rounds(
        sides,
        configs,
        steps=steps,
        warmup=warmup,
        rounds=rounds,
        accelerator=accelerator,
        timeout_s=timeout_s,
        child_env=child_env,
        reference=reference,
        progress=progress,
        verbose=verbose,
    )
    params: dict[str, Any] = {
        "steps": steps,
        "warmup": warmup,
        "rounds": rounds,
        "accelerator": accelerator or "auto",
        "reference": REFERENCE if reference else None,
    }
    if not reference:
        params["paired"] = True
    git, stamp = _git(), datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_avg = {"before": load_before, "after": _load_avg()}
    return [
        BenchResult(
            target=side.text,
            configs=configs,
            params={**params, **side.params, "device": mine[-1]["device"]},
            runs=tuple(mine),
            machine=machine,
            versions=dict(mine[-1].get("versions") or {}),
            git=git,
            timestamp=stamp,
            load_avg=load_avg,
        )
        for side, mine in zip(sides, runs, strict=True)
    ]


def run_bench(
    target: str | Callable[..., Any],
    *,
    configs: Sequence[str] = ("defaults", "maxtp"),
    steps: int = 100,
    warmup: int = 10,
    rounds: int = 3,
    accelerator: str | None = None,
    timeout_s: float = 1800.0,
    env: Mapping[str, str] | None = None,
    progress: TextIO | None = None,
    quiet: bool = False,
    verbose: bool = False,
) -> BenchResult:
    """Time ``target``'s job under each configuration, ``rounds`` times, alternating.

    Args:
        target: ``"FILE.py:FUNCTION"``, ``"package.module:FUNCTION"``, or such a function.
        configs: ``defaults`` (the job as written), ``maxtp`` (with ``MaxThroughputCallback()``
            added unless the job has one), or names the job function builds itself from its
            ``config`` argument.
        steps: Timed training steps per fit, after ``warmup``.
        warmup: Untimed steps first (start-up, autotuning, allocator growth).
        rounds: Times each configuration runs.
        accelerator: The Trainer's ``accelerator``; ``None`` keeps the job's (default ``auto``).
        timeout_s: Longest one fit may take.
        env: Environment of the children (default: this process's).
        progress: Where a line per run goes (default: ``sys.stderr``).
        quiet: No line per run.
        verbose: Let the children's own output through, to stderr (else it is kept back).

    Returns:
        Every run's record, the machine (probed in the first child), versions and git state.

    Raises:
        ValueError: Bad arguments.
        BenchTargetError: A target that cannot be found, built or called (a ``ValueError``).
        BenchRunError: A fit that failed, crashed or timed out.
    """
    configs = tuple(configs)
    text = _start(
        target, configs=configs, steps=steps, warmup=warmup, rounds=rounds, timeout_s=timeout_s
    )
    (result,) = _bench(
        [_Side(text)],
        configs,
        steps=steps,
        warmup=warmup,
        rounds=rounds,
        accelerator=accelerator,
        timeout_s=timeout_s,
        child_env=_child_env(env, with_sys_path=not isinstance(target, str)),
        reference=True,
        progress=None if quiet else (progress or sys.stderr),
        verbose=verbose,
    )
    return result


def run_against(
    target: str | Callable[..., Any],
    against: str,
    *,
    against_path: Sequence[str | Path] = (),
    configs: Sequence[str] = ("defaults",),
    steps: int = 100,
    warmup: int = 10,
    rounds: int = PAIRED_ROUNDS,
    accelerator: str | None = None,
    timeout_s: float = 1800.0,
    env: Mapping[str, str] | None = None,
    progress: TextIO | None = None,
    quiet: bool = False,
    verbose: bool = False,
) -> tuple[BenchResult, BenchResult]:
    """Time ``target`` and ``against`` (the code to hold it to) in one bench, rounds paired.

    Each round runs both jobs back to back, the order flipping every round, so the two runs
    of a round share the machine's state of that minute; ``compare(..., gate="paired")`` then
    judges the per-round ratios instead of two sets of runs minutes or days apart. No reference
    workload is timed: the other side is the reference.

    Args:
        target: The job as it is now (``"FILE.py:FUNCTION"``, ``"module:FUNCTION"`` or such a
            function).
        against: The job to hold it to, e.g. the same file in a checkout of the main branch
            (``"../base/train_job.py:job"``).
        against_path: Folders put first on ``sys.path`` in ``against``'s runs only, so that its
            ``import mypkg`` finds that checkout's package (e.g. ``["../base/src"]``).
        configs: As for ``run_bench``; each round runs every configuration on both sides.
        steps: Timed training steps per fit, after ``warmup``.
        warmup: Untimed steps first.
        rounds: Pairs of runs per configuration (the gate needs at least 5; see
            ``PAIRED_ROUNDS`` for why 20).
        accelerator: The Trainer's ``accelerator``; ``None`` keeps each job's.
        timeout_s: Longest one fit may take.
        env: Environment of the children (default: this process's).
        progress: Where a line per run goes (default: ``sys.stderr``).
        quiet: No line per run.
        verbose: Let the children's own output through, to stderr.

    Returns:
        ``(against's result, target's result)``: a baseline and a run, in the order
        ``compare`` takes them reversed.

    Raises:
        ValueError: Bad arguments (``against_path`` that is not a folder, fewer than 5 rounds).
        BenchTargetError: A target that cannot be found, built or called.
        BenchRunError: A fit that failed, crashed or timed out.
    """
    configs = tuple(configs)
    text = _start(
        target, configs=configs, steps=steps, warmup=warmup, rounds=rounds, timeout_s=timeout_s
    )
    base = _start(
        against, configs=configs, steps=steps, warmup=warmup, rounds=rounds, timeout_s=timeout_s
    )
    if rounds < MIN_PAIRED_ROUNDS:
        raise ValueError(
            f"rounds (--rounds) must be >= {MIN_PAIRED_ROUNDS} with against (--against), got "
            f"{rounds}: the paired gate needs that many pairs to tell a slowdown from noise"
        )
    paths = []
    for folder in against_path:
        if not Path(folder).is_dir():
            raise ValueError(
                f"against_path (--against-path) {str(folder)!r} is not a folder; give the "
                "checkout (or its src/ folder) whose package the against job imports"
            )
        paths.append(str(Path(folder).resolve()))
    mine, theirs = _bench(
        [_Side(text, params={"against": base}), _Side(base, tuple(paths), {"against_path": paths})],
        configs,
        steps=steps,
        warmup=warmup,
        rounds=rounds,
        accelerator=accelerator,
        timeout_s=timeout_s,
        child_env=_child_env(env, with_sys_path=not isinstance(target, str)),
        reference=False,
        progress=None if quiet else (progress or sys.stderr),
        verbose=verbose,
    )
    return theirs, mine
