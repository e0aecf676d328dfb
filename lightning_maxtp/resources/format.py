"""Readable text for ``Resources`` (the table ``maxtp inspect`` prints)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_maxtp._units import format_bytes as size

if TYPE_CHECKING:
    from lightning_maxtp.resources.probe import Resources


def _or(value: object, unknown: str = "?") -> str:
    return unknown if value is None else str(value)


def format_resources(res: Resources, workers_per_gpu: dict[int, int] | None = None) -> str:
    """Render the probe as aligned sections: machine, CPU, memory, GPUs, advice, notes.

    Args:
        res: The probe's result.
        workers_per_gpu: Optional ``{gpu: workers}`` for a model size, shown under advice.
    """
    cpu, mem, ver = res.cpu, res.memory, res.versions
    quota = "none" if cpu.cgroup_quota is None else f"{cpu.cgroup_quota:g} CPUs"
    cg_mem = "none" if mem.cgroup_limit_bytes is None else size(mem.cgroup_limit_bytes)
    rows = [
        ("machine", f"{res.hostname} | {res.platform}"),
        (
            "versions",
            f"python {ver.python} | torch {_or(ver.torch, '-')} (CUDA "
            f"{_or(ver.torch_cuda, '-')}) | lightning {_or(ver.lightning, '-')} | "
            f"driver {_or(ver.driver, '-')} (CUDA {_or(ver.cuda_driver, '-')})",
        ),
        (
            "cpu",
            f"{_or(cpu.logical)} logical, {_or(cpu.physical)} physical, {_or(cpu.usable)} "
            f"usable (affinity), cgroup quota {quota} -> {cpu.effective} effective",
        ),
        (
            "memory",
            f"{size(mem.total_bytes)} total, {size(mem.available_bytes)} available, "
            f"cgroup limit {cg_mem} -> {size(mem.effective_available_bytes)} usable",
        ),
        ("/dev/shm", f"{size(mem.shm_free_bytes)} free of {size(mem.shm_total_bytes)}"),
        (
            "disk",
            f"{size(mem.disk_free_bytes)} free of {size(mem.disk_total_bytes)} at {mem.disk_path}",
        ),
        (
            "gpus",
            f"{len(res.gpus)} visible via {res.gpu_backend}"
            + (
                f" (CUDA_VISIBLE_DEVICES={res.cuda_visible_devices!r})"
                if res.cuda_visible_devices is not None
                else ""
            ),
        ),
    ]
    lines = [f"{k:<9} {v}" for k, v in rows]
    if res.gpus:
        lines.append("")
        lines.append(
            f"  {'gpu':>3} {'name':<24} {'mem used/total':>20} {'util':>5} {'cc':>4} procs"
        )
        for g in res.gpus:
            util = "?" if g.utilization_percent is None else f"{g.utilization_percent}%"
            procs = (
                "?"
                if g.processes is None
                else (f"{len(g.processes)} ({len(g.foreign_processes)} foreign)")
            )
            used = f"{size(g.memory_used_bytes)}/{size(g.memory_total_bytes)}"
            lines.append(
                f"  {g.index:>3} {_or(g.name)[:24]:<24} {used:>20} {util:>5} "
                f"{_or(g.compute_capability):>4} {procs}"
            )
    adv = res.advice
    lines.append("")
    lines.append(
        f"advice    free GPUs: {list(adv.free_gpus) or 'none'}; "
        f"{adv.cpu_workers_per_process} DataLoader worker(s) per device process "
        f"({adv.device_processes} process(es) on {cpu.effective} CPUs)"
    )
    lines += [f"          GPU {b.index} busy: {b.reason}" for b in adv.busy_gpus]
    if workers_per_gpu is not None:
        per = ", ".join(f"GPU {i}: {n}" for i, n in workers_per_gpu.items()) or "no free GPU"
        lines.append(f"          model copies per free GPU: {per}")
    notes = [*res.notes, *cpu.notes, *mem.notes]
    notes += [f"GPU {g.index}: {n}" for g in res.gpus for n in g.notes]
    if notes:
        lines.append("")
        lines += [f"note      {n}" for n in notes]
    return "\n".join(lines)
