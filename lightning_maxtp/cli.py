"""The ``maxtp`` command line.

Kept free of torch and lightning imports (``import lightning`` costs about 8 s on a small
machine): each subcommand imports only what it needs, inside its handler.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lightning_maxtp import __version__
from lightning_maxtp._units import GIB
from lightning_maxtp.bench.gate import GATES

if TYPE_CHECKING:
    from lightning_maxtp.pack import JobSpec, PackPlan
    from lightning_maxtp.pack.ray_placement import RayPlan


def _positive(what: str) -> Callable[[str], float]:
    """An argparse type for a number > 0; ``what`` names the expected unit in the error."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value

    return parse


_positive_float = _positive("a number of GiB")
_positive_seconds = _positive("seconds")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from lightning_maxtp.resources.probe import format_resources, inspect_resources

    res = inspect_resources(args.path)
    workers = None
    if args.model_gib is not None:
        workers = res.workers_per_gpu(
            int(args.model_gib * GIB), headroom_bytes=int(args.headroom_gib * GIB)
        )
    peak = None
    if args.peak or args.refresh_peak:
        from lightning_maxtp.resources.peak import measure_peak

        peak = measure_peak("cuda" if res.gpus and _cuda_ready() else "cpu",
                            refresh=args.refresh_peak)  # fmt: skip
    if args.json:
        data = res.to_dict()
        if peak is not None:
            data["peak"] = peak.to_dict()
        if workers is not None:
            data["advice"]["model_gib"] = args.model_gib
            data["advice"]["headroom_gib"] = args.headroom_gib
            data["advice"]["workers_per_gpu"] = [
                {"gpu": i, "workers": n} for i, n in workers.items()
            ]
        print(json.dumps(data, indent=2))
    else:
        print(format_resources(res, workers))
        if peak is not None:
            print(peak)
    return 0


def _cuda_ready() -> bool:
    import torch

    return torch.cuda.is_available()


def _cmd_triage(args: argparse.Namespace) -> int:
    import psutil

    from lightning_maxtp.triage import triage

    try:
        result = triage(args.duration, args.pid, interval_s=args.interval)
    except psutil.NoSuchProcess:
        print(f"maxtp: error: --pid {args.pid}: no such process", file=sys.stderr)
        return 2
    except psutil.AccessDenied:
        print(
            f"maxtp: error: --pid {args.pid}: cannot read the process (access denied); run "
            "maxtp as the same user or as root",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else result)
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _pack_jobs(args: argparse.Namespace) -> tuple[JobSpec, ...]:
    from lightning_maxtp.pack import JobSpec, load_jobs

    if args.jobs is not None and args.commands:
        raise ValueError(
            "give the jobs either with --jobs FILE or after --, not both; "
            "add the commands to the file"
        )
    if args.jobs is not None:
        return load_jobs(args.jobs)
    if args.commands:
        return tuple(
            JobSpec(cmd, name=f"job{i}", where=f"command {i} after --")
            for i, cmd in enumerate(args.commands, start=1)
        )
    raise ValueError(
        "no jobs given; pass --jobs FILE (one command per line, or JSON), or the "
        "commands after --, e.g. maxtp pack -- 'python train.py --seed 1' "
        "'python train.py --seed 2'"
    )


def _cmd_pack(args: argparse.Namespace) -> int:
    from lightning_maxtp.pack import plan_pack, run_jobs

    ray = args.backend == "ray"
    try:
        if not ray and (args.address is not None or args.gpu_size_gib is not None):
            flag = "--address" if args.address is not None else "--gpu-size-gib"
            raise ValueError(f"{flag} is for a Ray cluster; add --backend ray")
        jobs = _pack_jobs(args)
        defaults = {
            "max_parallel": args.max_parallel,
            "default_gpu_memory_gib": args.gpu_memory_gib,
            "default_cpu_threads": args.cpu_threads,
        }
        local: PackPlan | None = None
        plan: PackPlan | RayPlan | None = None
        if not ray:
            plan = local = plan_pack(jobs, headroom_bytes=int(args.headroom_gib * GIB), **defaults)
        elif args.dry_run:
            from lightning_maxtp.pack.ray_cluster import plan_ray_pack

            plan = plan_ray_pack(
                jobs,
                address=args.address,
                gpu_size_gib=args.gpu_size_gib,
                default_gpu_memory_gib=args.gpu_memory_gib,
                default_cpu_threads=args.cpu_threads,
            )
    except (ValueError, ImportError) as err:
        print(f"maxtp: error: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        assert plan is not None
        print(json.dumps(plan.to_dict(), indent=2) if args.json else plan)
        return 0
    progress = {
        "log_dir": args.log_dir,
        "fail_fast": args.fail_fast,
        "retry_oom": args.retry_oom,
        "progress": None if args.quiet else sys.stderr,
        "status_line": args.status or (not args.quiet and sys.stderr.isatty()),
    }
    try:
        if ray:
            result = run_jobs(
                jobs,
                backend="ray",
                address=args.address,
                gpu_size_gib=args.gpu_size_gib,
                **defaults,
                **progress,
            )
        else:
            assert local is not None
            result = run_jobs(local, **progress)
    except (ValueError, ImportError) as err:
        print(f"maxtp: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else result)
    return result.exit_code


def _add_pack(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pack = sub.add_parser(
        "pack",
        help="run independent jobs concurrently, one or more per free GPU (or CPU share)",
        description="Run independent jobs (seeds, sweeps, evals) concurrently: each gets a free "
        "GPU (CUDA_VISIBLE_DEVICES), several share a GPU when their declared memory fits with "
        "headroom, and without GPUs they share the CPUs (OMP_NUM_THREADS and friends). Each "
        "job's output goes to its own log; the summary counts the failed jobs.",
        epilog="Jobs file: one shell command per line (# comments), or JSON (YAML with PyYAML): "
        'a list of commands or of objects {"command", "name", "gpu_memory_gib", "cpu_threads", '
        '"memory_gib", "cwd", "env"}. Or: maxtp pack -- "python a.py" "python b.py". '
        "Exit codes: 0 every job ok (or --dry-run), 1 one or more jobs failed, 2 bad arguments "
        "or jobs (nothing started), 128+N stopped by signal N (130: Ctrl-C).",
    )
    pack.add_argument("commands", nargs="*", help="job command lines (after --), one per job")
    pack.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="local: this machine (default); ray: a Ray task per job on a Ray cluster "
        "(needs the [ray] extra)",
    )
    pack.add_argument(
        "--address",
        default=None,
        help="with --backend ray: the cluster (auto, ray://head:10001; default: RAY_ADDRESS, "
        "else a local Ray instance)",
    )
    pack.add_argument(
        "--gpu-size-gib",
        type=_positive_float,
        default=None,
        help="with --backend ray: memory of one GPU, for jobs that declare gpu_memory_gib "
        "(default: read by NVML on the GPU nodes)",
    )
    pack.add_argument("--jobs", default=None, help="jobs file (text, .json, .yaml)")
    pack.add_argument("--json", action="store_true", help="print the summary as JSON")
    pack.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    pack.add_argument("--fail-fast", action="store_true", help="stop all jobs at the first failure")
    pack.add_argument(
        "--retry-oom", action="store_true", help="rerun a job that ran out of GPU memory, alone"
    )
    pack.add_argument(
        "--log-dir", default=None, help="folder for the logs (default: ./maxtp-pack-logs/<time>)"
    )
    pack.add_argument("--max-parallel", type=_positive_int, default=None, help="most jobs at once")
    pack.add_argument(
        "--gpu-memory-gib",
        type=_positive_float,
        default=None,
        help="GPU memory of a job that declares none (default: a whole GPU per job)",
    )
    pack.add_argument(
        "--cpu-threads",
        type=_positive_int,
        default=None,
        help="threads of a job that declares none (default: a fair share of the CPUs)",
    )
    pack.add_argument(
        "--headroom-gib",
        type=float,
        default=2.5,
        help="local backend: GPU memory kept free on each GPU (default: 2.5)",
    )
    pack.add_argument("--status", action="store_true", help="status line even when not a TTY")
    pack.add_argument("--quiet", action="store_true", help="no progress on stderr")
    pack.set_defaults(handler=_cmd_pack)


def _share(text: str) -> float:
    """An argparse type for a share in (0, 1), such as ``--max-regression 0.10``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share such as 0.10, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), e.g. 0.10 for 10 %, got {text!r}")
    return value


def _cmd_bench(args: argparse.Namespace) -> int:
    from lightning_maxtp.bench.command import cmd_bench

    return cmd_bench(args)


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser(
        "bench",
        help="time your training job (defaults vs MaxThroughputCallback) and gate on a baseline",
        description="Time the training job TARGET returns, once per configuration per round, "
        "each run in a fresh process (forked from one that imported torch and Lightning once; "
        "MAXTP_BENCH_FORK=0 for a new interpreter per run), rounds alternating. Records steady "
        "samples/s after warm-up, the whole fit's wall-clock and their spread, next to a small "
        "reference workload timed in the same process. With --baseline it exits 1 when a metric "
        "fell by more than --max-regression and beyond the measured spread.",
        epilog="TARGET: FILE.py:FUNCTION or package.module:FUNCTION; the function returns a dict "
        "(or lightning_maxtp.bench.BenchJob) with 'model' (a LightningModule), 'datamodule' or "
        "'train_dataloaders', and optionally 'trainer_kwargs'. Exit codes: 0 passed, 1 "
        "regression, 2 bad arguments or a broken job.",
    )
    bench.add_argument("target", metavar="TARGET", help="FILE.py:FUNCTION or module:FUNCTION")
    bench.add_argument("--steps", type=_positive_int, default=100, help="timed steps per fit (100)")
    bench.add_argument("--warmup", type=_positive_int, default=10, help="untimed steps first (10)")
    bench.add_argument(
        "--rounds",
        type=_positive_int,
        default=None,
        help="runs of each config (3; 20 pairs with --against, at least 5)",
    )
    bench.add_argument(
        "--configs",
        default="defaults,maxtp",
        help="comma-separated: defaults (the job as written), maxtp (with "
        "MaxThroughputCallback()), or names your job function takes as `config` "
        "(default: defaults,maxtp)",
    )
    bench.add_argument(
        "--accelerator", default=None, help="Trainer accelerator (default: the job's, or auto)"
    )
    bench.add_argument("--json", type=Path, default=None, help="write the result (a baseline)")
    bench.add_argument("--markdown", type=Path, default=None, help="write a Markdown report")
    bench.add_argument("--baseline", type=Path, default=None, help="a result to gate against")
    bench.add_argument(
        "--against",
        metavar="TARGET",
        default=None,
        help="the job to hold TARGET to, timed in the same bench round by round (e.g. the same "
        "file in a checkout of main); the paired gate then needs no stored baseline",
    )
    bench.add_argument(
        "--against-path",
        metavar="DIR",
        action="append",
        default=[],
        help="put DIR first on sys.path in --against's runs only (that checkout's package); "
        "repeatable",
    )
    bench.add_argument(
        "--max-regression", type=_share, default=0.10, help="tolerated fall (default: 0.10)"
    )
    bench.add_argument(
        "--gate",
        choices=GATES,
        default="ratio",
        help="ratio: per reference workload, travels between machines (default); absolute: "
        "raw samples/s, same machine only",
    )
    bench.add_argument(
        "--timeout", type=_positive_seconds, default=1800.0, help="seconds one fit may take (1800)"
    )
    bench.add_argument("--verbose", action="store_true", help="show the job's own output")
    bench.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    bench.set_defaults(handler=_cmd_bench)


def _cmd_report(args: argparse.Namespace) -> int:
    from lightning_maxtp.observe.report_write import rerender

    try:
        rendered = rerender(args.dir)
    except ValueError as err:
        print(f"maxtp: error: DIR {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(
            f"maxtp: error: DIR {str(args.dir)!r}: the report files cannot be written there "
            f"({type(err).__name__}: {err}); pass a folder you can write to (copy it first)",
            file=sys.stderr,
        )
        return 2
    if rendered.note is not None:
        print(f"maxtp: {rendered.note}", file=sys.stderr)
    names = ", ".join(sorted(rendered.written))
    print(f"maxtp: wrote {names} in {args.dir} (from its report.json)")
    return 0


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = sub.add_parser(
        "report",
        help="render report.md and timeline.png again from a report folder's report.json",
        description="Render report.md and timeline.png again from DIR/report.json, the folder "
        "a fit's report_dir wrote (after an upgrade, or where the fit had no matplotlib). "
        "report.json is left as it is; each file is replaced atomically.",
        epilog="Exit codes: 0 written, 2 DIR holds no report.json the library wrote (or cannot "
        "be written).",
    )
    report.add_argument("dir", metavar="DIR", type=Path, help="a report_dir (holds report.json)")
    report.set_defaults(handler=_cmd_report)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="maxtp",
        description="Probe the machine and run PyTorch Lightning jobs at its limit.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = sub.add_parser(
        "inspect",
        help="probe CPUs, memory, /dev/shm, disk and GPUs; print what a job can use",
        description="Probe CPUs, memory, /dev/shm, disk and GPUs as this process sees them.",
    )
    inspect.add_argument("--json", action="store_true", help="print machine-readable JSON")
    inspect.add_argument(
        "--path", default=".", help="where the job writes; its free disk is reported (default: .)"
    )
    inspect.add_argument(
        "--model-gib",
        type=_positive_float,
        default=None,
        help="GPU memory one model copy needs; adds how many copies fit on each free GPU",
    )
    inspect.add_argument(
        "--headroom-gib",
        type=float,
        default=2.5,
        help="GPU memory kept free when counting model copies (default: 2.5)",
    )
    inspect.add_argument(
        "--peak",
        action="store_true",
        help="add the device's measured matmul peak per dtype (cached; a few seconds the first "
        "time, with the datasheet value beside it where known)",
    )
    inspect.add_argument(
        "--refresh-peak", action="store_true", help="measure the peak again (implies --peak)"
    )
    inspect.set_defaults(handler=_cmd_inspect)
    tri = sub.add_parser(
        "triage",
        help="sample a running job (or the machine) and name its bottleneck",
        description="Sample a process tree (GPU, CPU of the process and its children, I/O "
        "wait, disk) for a few seconds and print the bottleneck class with evidence and the "
        "first knobs. Without --pid the whole machine is sampled.",
    )
    tri.add_argument(
        "--duration", type=_positive_seconds, default=10.0, help="seconds to sample (default: 10)"
    )
    tri.add_argument("--pid", type=int, default=None, help="root of the process tree to sample")
    tri.add_argument(
        "--interval", type=_positive_seconds, default=0.2, help="seconds between readings"
    )
    tri.add_argument("--json", action="store_true", help="print machine-readable JSON")
    tri.set_defaults(handler=_cmd_triage)
    _add_pack(sub)
    _add_bench(sub)
    _add_report(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``maxtp`` console script."""
    args = build_parser().parse_args(argv)
    if getattr(args, "headroom_gib", 0) < 0:
        print(
            f"maxtp: error: --headroom-gib must be >= 0, got {args.headroom_gib}", file=sys.stderr
        )
        return 2
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
