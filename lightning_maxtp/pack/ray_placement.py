"""Where ``maxtp pack --backend ray`` may run each job: Ray task resources, planned from data.

Pure: plain data in (each node's resources as ``ray.nodes()`` reports them under
``"Resources"``, the same keys as ``ray.cluster_resources()``), plain data out. ``cluster_nodes``
reads that data; ``ray_demands`` turns each job spec into the resources its Ray task asks for;
``plan_ray`` fills in the defaults and gives the whole ``RayPlan``;
a job that no node could ever hold is refused before anything starts, with what it asked for
and the largest node. Ray's scheduler then places the tasks; this module only decides what each
asks for, the way the local planner does:

- a job on a cluster with GPUs gets a whole GPU (``num_gpus=1``) unless it declares its GPU
  memory; then it asks for the share of one GPU that memory is (``num_gpus=0.25`` for 20 GiB of
  an 80 GiB GPU, rounded up to the next 1/100), so several such jobs share a GPU;
- ``num_cpus`` is the job's ``cpu_threads``, else a fair share: the CPUs of a node per GPU on a
  GPU cluster, else one; the job's thread variables are set from it;
- ``memory`` is the job's ``memory_gib`` (Ray counts it against the node's ``memory``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_maxtp._units import GIB, format_bytes
from lightning_maxtp.pack.results import text_table
from lightning_maxtp.pack.spec import JobSpec, check_jobs

__all__ = ["RayDemand", "RayNode", "RayPlan", "cluster_nodes", "plan_ray", "ray_demands"]


@dataclass(frozen=True)
class RayNode:
    """One alive node of the cluster and what it offers Ray tasks."""

    node_id: str
    cpus: float
    gpus: float
    memory_bytes: int | None
    """Ray's ``memory`` resource of the node (``None``: not reported)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RayDemand:
    """What one job's Ray task asks for."""

    job: int
    """Position in the job list."""
    name: str
    num_gpus: float
    num_cpus: float
    memory_bytes: int | None

    @property
    def threads(self) -> int:
        """The job's thread variables (``OMP_NUM_THREADS``...): its whole CPUs, at least one."""
        return max(1, math.floor(self.num_cpus))

    def options(self) -> dict[str, Any]:
        """The keywords of the task's ``.options(...)``."""
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory_bytes:
            opts["memory"] = self.memory_bytes
        return opts

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return dataclasses.asdict(self)


def cluster_nodes(nodes: Sequence[Mapping[str, Any]]) -> tuple[RayNode, ...]:
    """The alive nodes of ``ray.nodes()``-shaped data (``Alive``, ``NodeID``, ``Resources``).

    Raises:
        ValueError: When no node is alive, or none offers a CPU.
    """
    out = []
    for i, node in enumerate(nodes):
        if not node.get("Alive", True):
            continue
        res = node.get("Resources", {})
        memory = res.get("memory")
        out.append(
            RayNode(
                node_id=str(node.get("NodeID", f"node{i}")),
                cpus=float(res.get("CPU", 0.0)),
                gpus=float(res.get("GPU", 0.0)),
                memory_bytes=None if memory is None else int(memory),
            )
        )
    if not out or not any(n.cpus > 0 for n in out):
        raise ValueError(
            f"the Ray cluster has no alive node with a CPU ({len(nodes)} node(s) listed); "
            "start it (`ray start --head`) or pass --address of a running one"
        )
    return tuple(out)


def _gpu_share(declared_bytes: int, gpu_bytes: int) -> float:
    """The share of one GPU ``declared_bytes`` is, rounded up to 1/100, at most 1."""
    return min(1.0, math.ceil(100 * declared_bytes / gpu_bytes) / 100)


def ray_demands(
    jobs: Sequence[JobSpec],
    nodes: Sequence[RayNode],
    *,
    gpu_bytes: int | None = None,
) -> tuple[RayDemand, ...]:
    """Each job's Ray task resources (see the module docstring).

    Args:
        jobs: The job specs, in order.
        nodes: The cluster's alive nodes (``cluster_nodes``).
        gpu_bytes: Memory of one GPU, for jobs that declare ``gpu_memory_gib`` (Ray does not
            report it); ``None``: such jobs get a whole GPU.

    Raises:
        ValueError: For a job no node could ever hold, naming the job, what it asked for and
            the largest node; or a ``gpu_bytes`` that is not positive.
    """
    if gpu_bytes is not None and gpu_bytes <= 0:
        raise ValueError(f"`gpu_bytes` must be > 0 or None, got {gpu_bytes!r}")
    has_gpus = any(n.gpus > 0 for n in nodes)
    per_gpu_cpus = min(
        (n.cpus / n.gpus for n in nodes if n.gpus > 0), default=1.0
    )  # the smallest node's share, so every GPU can get a job
    out = []
    for i, job in enumerate(jobs):
        name = job.name or f"job{i + 1}"
        if not has_gpus:
            gpus = 0.0
        elif job.gpu_memory_gib is not None and gpu_bytes is not None:
            gpus = _gpu_share(int(job.gpu_memory_gib * GIB), gpu_bytes)
        else:
            gpus = 1.0
        cpus = float(job.cpu_threads) if job.cpu_threads else max(1.0, math.floor(per_gpu_cpus))
        if has_gpus and job.cpu_threads is None and gpus < 1:  # a GPU's CPUs, shared alike
            cpus = max(1.0, math.floor(per_gpu_cpus * gpus))
        memory = int(job.memory_gib * GIB) if job.memory_gib else None
        demand = RayDemand(i, name, gpus, cpus, memory)
        _must_fit(job, demand, nodes)
        out.append(demand)
    return tuple(out)


def _must_fit(job: JobSpec, demand: RayDemand, nodes: Sequence[RayNode]) -> None:
    """Refuse a job that no single node could hold, before anything starts."""

    def fits(n: RayNode) -> bool:
        memory_ok = demand.memory_bytes is None or (
            n.memory_bytes is None or demand.memory_bytes <= n.memory_bytes
        )
        return demand.num_gpus <= n.gpus and demand.num_cpus <= n.cpus and memory_ok

    if any(fits(n) for n in nodes):
        return
    asked = f"{demand.num_gpus:g} GPU(s), {demand.num_cpus:g} CPU(s)"
    if demand.memory_bytes:
        asked += f", {format_bytes(demand.memory_bytes)} of memory"
    largest = max(nodes, key=lambda n: (n.gpus, n.cpus, n.memory_bytes or 0))
    offers = f"{largest.gpus:g} GPU(s), {largest.cpus:g} CPU(s)"
    if largest.memory_bytes is not None:
        offers += f", {format_bytes(largest.memory_bytes)} of memory"
    where = job.where or f"job {demand.name!r}"
    raise ValueError(
        f"{where} asks for {asked}, more than any node of the Ray cluster offers (the largest: "
        f"{offers}); lower its cpu_threads or memory_gib, or add a larger node"
    )


@dataclass(frozen=True)
class RayPlan:
    """What each job's Ray task asks for on this cluster (``maxtp pack --backend ray --dry-run``).

    Ray's scheduler decides where and when each task starts; this is what it is given.
    """

    jobs: tuple[JobSpec, ...]
    """The jobs with the defaults filled in (``default_cpu_threads``...)."""
    nodes: tuple[RayNode, ...]
    demands: tuple[RayDemand, ...]
    gpu_bytes: int | None
    """Memory of one GPU used for fractional shares; ``None``: not known (whole GPUs)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "backend": "ray",
            "nodes": [n.to_dict() for n in self.nodes],
            "gpu_bytes": self.gpu_bytes,
            "jobs": [
                {**d.to_dict(), "threads": d.threads, "command": j.command_text}
                for j, d in zip(self.jobs, self.demands, strict=True)
            ],
        }

    def __str__(self) -> str:
        """The cluster's nodes, then each job's task resources."""
        cpus = sum(n.cpus for n in self.nodes)
        gpus = sum(n.gpus for n in self.nodes)
        lines = [
            f"pack plan: {len(self.jobs)} jobs as Ray tasks on {len(self.nodes)} node(s), "
            f"{cpus:g} CPUs, {gpus:g} GPUs"
        ]
        if self.gpu_bytes is not None:
            lines.append(f"GPU size for shares: {format_bytes(self.gpu_bytes)}")
        rows = [
            [
                d.name,
                f"{d.num_gpus:g}",
                f"{d.num_cpus:g}",
                str(d.threads),
                format_bytes(d.memory_bytes, unit="GiB", missing="-", suffix=False),
                j.command_text[:60],
            ]
            for j, d in zip(self.jobs, self.demands, strict=True)
        ]
        header = ["job", "num_gpus", "num_cpus", "threads", "memory GiB", "command"]
        return "\n".join([*lines, *text_table(header, rows)])


def plan_ray(
    jobs: Sequence[JobSpec],
    nodes: Sequence[RayNode],
    *,
    gpu_bytes: int | None = None,
    default_gpu_memory_gib: float | None = None,
    default_cpu_threads: int | None = None,
) -> RayPlan:
    """Each job's task resources on ``nodes``, the defaults filled in; starts nothing.

    Args:
        jobs: The jobs, in order.
        nodes: The cluster's alive nodes (``cluster_nodes``).
        gpu_bytes: Memory of one GPU (see ``ray_demands``).
        default_gpu_memory_gib: GPU memory of a job that declares none (default: a whole GPU).
        default_cpu_threads: Threads of a job that declares none (default: a fair share).

    Raises:
        ValueError: No jobs, names used twice, a default out of range, or a job no node can
            hold (``ray_demands``).
    """
    jobs = check_jobs(jobs, default_gpu_memory_gib, default_cpu_threads)
    filled = tuple(
        dataclasses.replace(
            job,
            gpu_memory_gib=job.gpu_memory_gib or default_gpu_memory_gib,
            cpu_threads=job.cpu_threads or default_cpu_threads,
        )
        for job in jobs
    )
    demands = ray_demands(filled, nodes, gpu_bytes=gpu_bytes)
    return RayPlan(filled, tuple(nodes), demands, gpu_bytes)
