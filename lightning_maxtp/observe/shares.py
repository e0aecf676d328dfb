"""What the loader and the host take, read from a window: workers, their cores, the rates.

Measurements only, shared by the diagnosis (its evidence), the job's limit and the knobs'
advice (``knobs.advice``): none of them names a change.
"""

from __future__ import annotations

from lightning_maxtp.observe import thresholds as th
from lightning_maxtp.observe.window import Window

__all__ = ["host_cpu", "loader_rates", "step_takes_cores", "worker_cpu", "workers_of"]


def workers_of(window: Window) -> int:
    """The window's DataLoader workers (its settings, else the worker processes counted)."""
    if window.context.num_workers is not None:
        return window.context.num_workers
    return window.sampler.num_worker_processes


def worker_cpu(window: Window) -> tuple[float, float | None] | None:
    """``(cores, machine CPU %)`` when the loader's workers take CPU a compute-bound step could use.

    On a CPU device: the workers use a quarter of a core or more (``WORKERS_TAKE_CORES``), or
    the machine's CPUs are saturated. On a GPU host: they use that much and the host's CPUs
    are over ``HOST_CPU_BUSY`` (the step's kernel launches wait for a core). ``None``
    otherwise, and without workers or their CPU measured.
    """
    workers, mean = workers_of(window), window.sampler.mean_worker_cpu
    if workers == 0 or mean is None:
        return None
    busy, system = mean / 100 * workers, window.sampler.mean_system_cpu
    if window.context.device_type == "cpu":
        saturated = system is not None and system >= th.SYSTEM_CPU_SATURATED
        return (busy, system) if busy >= th.WORKERS_TAKE_CORES or saturated else None
    host_busy = system is not None and system >= th.HOST_CPU_BUSY
    return (busy, system) if busy >= th.WORKERS_TAKE_CORES and host_busy else None


def host_cpu(window: Window) -> tuple[float, float, float] | None:
    """A GPU host's CPUs in use: ``(machine %, cores this process and its workers use, others)``.

    Others include the other ranks of a DDP job on this node.

    ``None`` off CUDA, or without the machine's CPU or its core count measured.
    """
    ctx, s = window.context, window.sampler
    system, cores = s.mean_system_cpu, ctx.host_cpus
    if ctx.device_type != "cuda" or system is None or not cores:
        return None
    busy = system / 100 * cores
    workers = s.worker_cpu_percent
    own = ((s.mean_main_cpu or 0.0) + (sum(workers) / len(workers) if workers else 0.0)) / 100
    return system, own, max(0.0, busy - own)


def loader_rates(window: Window) -> tuple[float, float]:
    """(rate the device could consume, rate the loader delivers), samples/s.

    With 0 workers the loader runs only while the step waits, so its own rate is samples over
    the waiting time; with workers it runs alongside and delivers what the job gets.
    """
    device = window.device_samples_per_s
    wait = sum(window.data_wait_s)
    if workers_of(window) == 0 and wait > 0:
        return device, sum(window.samples) / wait
    return device, window.samples_per_s


def step_takes_cores(window: Window) -> bool:
    """On a CPU device: whether the step computes on every core most of the time.

    Its intra-op threads cover the cores this rank has, and it computes for more than
    ``1 - DATA_WAIT_SHARE_STRONG`` of the window. Then a worker that loads with CPU work has
    no core of its own: it takes the step's (measured on 2 CPUs: a ResNet-18 step waiting 13 %
    for JPEG decoding in the main process, one worker changed the rate by -3 % to +4 %).
    """
    ctx = window.context
    cpus, threads = ctx.cpus_per_rank, ctx.intra_op_threads
    if ctx.device_type != "cpu" or cpus is None or threads is None:
        return False
    return threads >= cpus and window.data_wait_share < th.DATA_WAIT_SHARE_STRONG
