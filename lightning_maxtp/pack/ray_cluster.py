"""The Ray cluster behind ``maxtp pack --backend ray``: connect, read its nodes, plan the tasks.

``plan_ray_pack`` connects (or uses the connection this process has), reads the alive nodes,
finds the GPUs' size when a job declares its GPU memory (NVML on each GPU node: Ray reports GPUs
as counts only), and gives the pure ``ray_placement.plan_ray``'s plan. Importing it does not
import Ray.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from lightning_maxtp._log import prefixed
from lightning_maxtp._units import GIB
from lightning_maxtp.pack.ray_placement import RayNode, RayPlan, cluster_nodes, plan_ray
from lightning_maxtp.pack.ray_task import gpu_memory_bytes
from lightning_maxtp.pack.spec import JobSpec
from lightning_maxtp.resources.ray_address import check_ray_address

__all__ = ["NEEDS_RAY", "connect", "import_ray", "plan_ray_pack"]

NEEDS_RAY = (
    "maxtp pack --backend ray needs Ray: pip install 'lightning-maxtp[ray]' "
    "(or pip install 'ray>=2.9')"
)
_GPU_PROBE_TIMEOUT_S = 60.0

log = logging.getLogger(__name__)


def import_ray() -> Any:
    """``ray``, or an ImportError that names the extra."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(NEEDS_RAY) from error
    return ray


def connect(address: str | None) -> bool:
    """``ray.init(address)`` unless Ray is initialised; whether this call started it.

    Raises:
        ValueError: Where nothing answers at ``address``.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    check_ray_address(address)
    try:
        # The jobs' output comes back through the tasks; the workers' prints would repeat it.
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as err:
        raise ValueError(
            f"`address` {address!r}: no Ray cluster answered ({err}); start one with "
            "`ray start --head`, or leave --address out for a local instance"
        ) from err
    return True


def _gpu_bytes(nodes: Sequence[RayNode]) -> int | None:
    """The smallest GPU of the cluster, read by NVML on each GPU node (``None``: unknown).

    A node that cannot tell (no NVML there, no answer in time, a failed probe) leaves the size
    unknown, and jobs that declare their GPU memory get whole GPUs: one warning names each such
    node and why.
    """
    ray = import_ray()
    affinity = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    probe = ray.remote(gpu_memory_bytes)
    gpu_nodes = [node for node in nodes if node.gpus > 0]
    refs = [
        probe.options(num_cpus=0, scheduling_strategy=affinity(node.node_id, soft=False)).remote()
        for node in gpu_nodes
    ]
    deadline = time.monotonic() + _GPU_PROBE_TIMEOUT_S
    sizes: list[int] = []
    unknown: list[str] = []
    for node, ref in zip(gpu_nodes, refs, strict=True):
        try:
            size, why = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            size, why = None, f"no answer within {_GPU_PROBE_TIMEOUT_S:.0f} s"
        except ray.exceptions.RayError as err:  # the probe raised, or its worker or node died
            size, why = None, f"the probe failed ({_first_line(err)})"
        if size:
            sizes.append(int(size))
        else:
            unknown.append(f"node {node.node_id}: {why or 'NVML gave no size'}")
    if unknown:
        log.warning(
            prefixed(
                "GPU size unknown (%s): jobs that declare gpu_memory_gib get whole GPUs; "
                "give the size (--gpu-size-gib, gpu_size_gib=) to share GPUs"
            ),
            "; ".join(unknown),
        )
        return None
    return min(sizes, default=None)


def _first_line(err: BaseException) -> str:
    """``RayTaskError: <the first line of its message>`` (Ray's carry the remote traceback)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def plan_ray_pack(
    jobs: Sequence[JobSpec],
    *,
    address: str | None = None,
    gpu_size_gib: float | None = None,
    default_gpu_memory_gib: float | None = None,
    default_cpu_threads: int | None = None,
) -> RayPlan:
    """Each job's Ray task resources on the cluster; starts no job.

    Args:
        jobs: The jobs, in order.
        address: The cluster, when Ray is not initialised yet (see ``run_ray_jobs``); a local
            instance started for this is shut down before returning.
        gpu_size_gib: Memory of one of the cluster's GPUs, for jobs that declare
            ``gpu_memory_gib`` (default: read by NVML on each GPU node, the smallest).
        default_gpu_memory_gib: GPU memory of a job that declares none (default: a whole GPU).
        default_cpu_threads: Threads of a job that declares none (default: a fair share).

    Raises:
        ImportError: Without Ray installed (the ``[ray]`` extra).
        ValueError: See ``plan_ray``; or when no node is alive.
    """
    if gpu_size_gib is not None and not gpu_size_gib > 0:
        raise ValueError(f"`gpu_size_gib` must be > 0 or None, got {gpu_size_gib!r}")
    owned = connect(address)
    try:
        nodes = cluster_nodes(import_ray().nodes())
        gpu_bytes = _gpu_size(jobs, nodes, gpu_size_gib, default_gpu_memory_gib)
    finally:
        if owned:
            import_ray().shutdown()
    return plan_ray(
        jobs,
        nodes,
        gpu_bytes=gpu_bytes,
        default_gpu_memory_gib=default_gpu_memory_gib,
        default_cpu_threads=default_cpu_threads,
    )


def _gpu_size(
    jobs: Sequence[JobSpec],
    nodes: Sequence[RayNode],
    gpu_size_gib: float | None,
    default_gpu_memory_gib: float | None,
) -> int | None:
    """The GPU size for shares: given, else probed when a job declares its GPU memory."""
    declares = default_gpu_memory_gib is not None or any(j.gpu_memory_gib for j in jobs)
    if gpu_size_gib is not None:
        return int(gpu_size_gib * GIB)
    if declares and any(n.gpus > 0 for n in nodes):
        return _gpu_bytes(nodes)
    return None
