"""``run_bench``: every configuration of a job in fresh processes, rounds alternating.

Round r runs every configuration once, in the given order (A, B, A, B, ...), so a machine that
drifts over minutes drifts for all of them alike. Each run is a fresh process running
``lightning_maxtp.bench.child``: nothing warmed by one configuration helps the next. Where it
can, it is forked from one server that imported torch and Lightning once
(``lightning_maxtp.bench.forkserver``); otherwise it is a new interpreter. This module starts
processes only; it imports neither torch nor lightning.
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from lightning_maxtp._checks import COUNT, SECONDS, refuse_bool
from lightning_maxtp.bench.forkserver import ForkServer, fork_allowed
from lightning_maxtp.bench.reference import REFERENCE
from lightning_maxtp.bench.result import BenchResult
from lightning_maxtp.bench.target import BenchTargetError, check_function, parse_target

__all__ = ["BenchRunError", "run_bench"]

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
    text = _target_text(target)
    configs = tuple(configs)
    _check(configs, steps, warmup, rounds)
    check_function(parse_target(text), configs)
    refuse_bool("timeout_s", timeout_s, SECONDS, 1800)
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if progress is None and not quiet:
        progress = sys.stderr
    child_env = _child_env(env, with_sys_path=not isinstance(target, str))
    load_before = _load_avg()
    runs: list[dict[str, Any]] = []
    machine: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="maxtp-bench-") as tmp:
        server = _server(child_env, verbose, Path(tmp))
        with server if server is not None else contextlib.nullcontext():
            for r in range(1, rounds + 1):
                for config in configs:
                    out = Path(tmp) / f"r{r}-{config}.json"
                    argv = [
                        "--target",
                        text,
                        "--config",
                        config,
                        "--steps",
                        str(steps),
                        "--warmup",
                        str(warmup),
                        "--out",
                        str(out),
                    ]
                    if accelerator is not None:
                        argv += ["--accelerator", accelerator]
                    if not runs:
                        argv.append("--probe")
                    what = f"{text} (config {config}, round {r})"
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
                    runs.append(record)
                    if progress is not None and not quiet:
                        print(
                            f"maxtp bench: round {r}/{rounds} {config}: "
                            f"{record['steady_samples_per_s']:.1f} samples/s steady, fit "
                            f"{record['fit_seconds']:.1f} s, reference "
                            f"{record['reference_samples_per_s']:.0f}/s",
                            file=progress,
                            flush=True,
                        )
    versions = dict(runs[-1].get("versions") or {})
    return BenchResult(
        target=text,
        configs=configs,
        params={
            "steps": steps,
            "warmup": warmup,
            "rounds": rounds,
            "accelerator": accelerator or "auto",
            "reference": REFERENCE,
            "device": runs[-1]["device"],
        },
        runs=tuple(runs),
        machine=machine,
        versions=versions,
        git=_git(),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        load_avg={"before": load_before, "after": _load_avg()},
    )
