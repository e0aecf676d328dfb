"""The Ray cluster behind ``maxtp pack --backend ray``: connect, read its nodes, plan the tasks.

``plan_ray_pack`` connects (or uses the connection this process has), reads the alive nodes,
finds the GPUs' size when a job declares its GPU memory (NVML on each GPU node: Ray reports GPUs
as counts only), and gives the pure ``ray_placement.plan_ray``'s plan. Importing it does not
import Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from lightning_maxtp._log import prefixed
from lightning_maxtp._units import GIB
from lightning_maxtp.pack.ray_placement import RayNode, RayPlan, cluster_nodes, plan_ray
from lightning_maxtp.pack.spec import JobSpec
from lightning_maxtp.resources.ray_address import check_ray_address

__all__ = ["NEEDS_RAY", "connect", "gpu_memory_bytes", "import_ray", "plan_ray_pack"]

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


GROUP_CLEANUP = "RAY_process_group_cleanup_enabled"
"""Ray's setting, read by each raylet at its start (Ray >= 2.50; later releases may have it on):
each worker runs in a process group of its own, which the raylet ends when the worker exits,
however it ends. A local instance started here sets it, so no job outlives its worker."""


def connect(address: str | None, *, log_to_driver: bool = False) -> bool:
    """``ray.init(address)`` unless Ray is initialised; whether this call started it.

    Args:
        address: See ``run_jobs``.
        log_to_driver: Show the workers' output here (Ray's driver logging).

    Raises:
        ValueError: Where nothing answers at ``address``.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    check_ray_address(address)
    saved = os.environ.get(GROUP_CLEANUP)
    os.environ.setdefault(GROUP_CLEANUP, "true")  # the raylet a local ray.init starts inherits it
    try:
        ray.init(address=address, log_to_driver=log_to_driver)
    except ConnectionError as err:
        raise ValueError(
            f"`address` {address!r}: no Ray cluster answered ({err}); start one with "
            "`ray start --head`, or leave --address out for a local instance"
        ) from err
    finally:
        if saved is None:
            os.environ.pop(GROUP_CLEANUP, None)
    return True


def gpu_memory_bytes() -> tuple[int | None, str | None]:
    """The smallest GPU's total memory on this node, read by NVML, or ``None`` and why not.

    Ray reports GPUs as counts only; jobs that declare their GPU memory need the GPU's size to
    ask for the right share of one. This runs on the node, whose log the submitting machine
    does not show, so the reason comes back with the answer. An error NVML does not raise (a
    bug) is raised: the submitting machine reports the failed task.
    """
    try:
        import pynvml
    except ImportError as err:
        return None, f"nvidia-ml-py is not installed there ({err})"
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as err:
        return None, f"NVML did not start ({type(err).__name__}: {err})"
    try:
        sizes = [
            int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    except pynvml.NVMLError as err:
        return None, f"NVML could not read a GPU's memory ({type(err).__name__}: {err})"
    finally:
        with contextlib.suppress(pynvml.NVMLError):  # a failed shutdown changes no answer
            pynvml.nvmlShutdown()
    if not sizes:
        return None, "NVML lists no GPU there"
    return min(sizes), None


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
        address: The cluster, when Ray is not initialised yet (see ``run_jobs``); a local
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
        declares = default_gpu_memory_gib is not None or any(j.gpu_memory_gib for j in jobs)
        gpu_bytes = None  # whole GPUs: given no size, probed only when a job needs shares
        if gpu_size_gib is not None:
            gpu_bytes = int(gpu_size_gib * GIB)
        elif declares and any(n.gpus > 0 for n in nodes):
            gpu_bytes = _gpu_bytes(nodes)
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
