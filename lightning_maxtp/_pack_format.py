"""Text tables and the live status line of ``maxtp pack`` (no logic, just layout)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_maxtp._placement import Placement
    from lightning_maxtp.pack import JobResult, PackPlan, PackResult

GIB = 2**30


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [header, *rows]]  # fmt: skip


def _gib(value: int | None) -> str:
    return "-" if not value else f"{value / GIB:.1f}"


def _mib(value: int | None) -> str:
    return "-" if not value else f"{value / 2**20:.0f}"


def format_plan(plan: PackPlan) -> str:
    """Each job, where it starts (or why it waits), its threads and declared memory."""
    cap = plan.capacity
    if cap.gpus:
        where = ", ".join(f"GPU {g.index} ({_gib(g.usable_bytes)} GiB usable)" for g in cap.gpus)
    else:
        where = f"CPU only, {cap.cpu_threads} threads"
    lines = [f"pack plan: {len(plan.jobs)} jobs on {where}"]
    lines += [f"skipped GPU {b.index}: {b.reason}" for b in cap.skipped_gpus]
    starts = {p.demand.job: p for p in plan.first.starts}
    waits = {w.job: w.reason for w in plan.first.waits}
    rows = []
    for job, demand in zip(plan.jobs, plan.demands, strict=True):
        placement = starts.get(demand.job)
        if placement is None:
            state = f"waits: {waits.get(demand.job, '?')}"
        else:
            state = f"starts on GPU {placement.gpu.index}" if placement.gpu else "starts on CPU"
        gpu_mem = _gib(demand.gpu_bytes) if demand.gpu_bytes or not cap.gpus else "whole"
        rows.append([demand.name, state, str(demand.threads), gpu_mem,
                     _gib(demand.ram_bytes), job.command_text[:60]])  # fmt: skip
    lines += _table(["job", "first round", "threads", "gpu GiB", "ram GiB", "command"], rows)
    return "\n".join(lines)


def format_result(result: PackResult) -> str:
    """The summary table: one row per job, then the totals."""
    rows = [
        [j.name, j.status, "-" if j.exit_code is None else str(j.exit_code),
         "-" if j.wall_s is None else f"{j.wall_s:.1f}",
         "-" if j.gpu is None else str(j.gpu), _mib(j.peak_rss_bytes), str(j.attempts),
         j.log_path or "-"]
        for j in result.jobs
    ]  # fmt: skip
    lines = _table(["job", "status", "exit", "wall s", "gpu", "peak MiB", "tries", "log"], rows)
    ok = sum(j.status == "ok" for j in result.jobs)
    tail = f"{ok}/{len(result.jobs)} ok, {result.num_failed} failed, {result.wall_s:.1f} s"
    if result.interrupted:
        tail += f", interrupted by {result.interrupted}"
    return "\n".join([*lines, tail])


def status_text(
    plan: PackPlan,
    running: Sequence[Placement],
    queued: int,
    done: Iterable[JobResult],
    elapsed_s: float,
) -> str:
    """One line: running/queued/done counts and each GPU's jobs and declared memory."""
    finished = list(done)
    failed = sum(j.failed for j in finished)
    text = (
        f"[maxtp pack {elapsed_s:.0f}s] {len(running)} running, {queued} queued, "
        f"{len(finished)} done ({failed} failed)"
    )
    cap = plan.capacity
    if not cap.gpus:
        used = sum(p.demand.threads for p in running)
        return f"{text} | CPU {used}/{cap.cpu_threads} threads"
    parts = []
    for gpu in cap.gpus:
        here = [p.demand for p in running if p.gpu is not None and p.gpu.index == gpu.index]
        mem = sum(d.gpu_bytes or gpu.usable_bytes for d in here)
        parts.append(f"GPU {gpu.index}: {len(here)} jobs {_gib(mem)}/{_gib(gpu.usable_bytes)} GiB")
    return f"{text} | " + " | ".join(parts)
