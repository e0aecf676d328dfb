"""Every threshold the library decides with, in one place, each with where it comes from.

Shares are fractions (0.05 = 5 %). They compare parts of the same step or the same sampling
period, never absolute times, so a noisy or shared machine moves them little.
"""

from __future__ import annotations

DATA_WAIT_SHARE = 0.05
"""Data wait above this share of step time points at the input pipeline.
Source: torch-tb-profiler's performance recommendation ("DataLoader time > 5 % of step")."""
DATA_WAIT_SHARE_STRONG = 0.30
"""A data wait share at which the input pipeline is named with full confidence."""

GPU_UTIL_LOW = 50.0
"""NVML utilization (percent of the sample period with a kernel running) below this is low.
Source: torch-tb-profiler ("GPU utilization < 50 %") and the seeds' triage table."""
GPU_UTIL_BUSY = 90.0
"""NVML utilization at or above this counts as "busy ~100 %" (compute-bound)."""

MEMORY_PEAK_SHARE = 0.90
"""Reserved/used device memory above this share of total is near the ceiling.
Source: torch-tb-profiler memory view and HTA ("peak memory > 90 % of total")."""
MEMORY_HEADROOM_SHARE = 0.50
"""Below this share of memory in use a larger batch is recommended (it would fit)."""
BATCH_GROWTH_MAX = 4
"""Largest batch multiplier recommended at once; one knob at a time, re-measured after."""

WORKER_BUSY = 0.60
"""Mean CPU of a loader worker (or of the main process while it waits for data, with 0 workers)
above this share of one core: the loader is CPU-bound (data_pipeline)."""
WORKER_IDLE = 0.30
"""Below this share of one core the loader waits on something else: storage."""
SYSTEM_CPU_SATURATED = 90.0
"""System CPU above this percent: idle-looking workers may be starved, not waiting on I/O."""
IOWAIT_HIGH = 10.0
"""System I/O wait above this percent supports a storage diagnosis (``top``'s ``wa``)."""

CPU_COMPUTE_BUSY = 0.60
"""CPU device: the main process uses at least this share of its intra-op threads while
computing (torch's ops run in parallel), so the step is bound by CPU compute."""
WORKERS_TAKE_CORES = 0.25
"""A compute-bound step whose DataLoader workers together use at least this share of a core
has CPU to win back from them: fewer workers are tried (judged on real steps)."""
HOST_CPU_BUSY = 40.0
"""Machine CPU above this percent on a GPU host leaves kernel launches waiting for a core.
Source: SPDL's guidance for GPU hosts (keep total CPU use under ~40 %)."""
GC_SHARE = 0.05
"""Garbage collection above this share of step time is host overhead worth a knob (the same 5 %
a data wait must pass to name the input pipeline)."""
GC_SHARE_STRONG = 0.25
"""A collection share at which ``host_overhead`` is named with full confidence."""
MAIN_THREAD_WAITING = 0.40
"""``maxtp triage``: a main thread running in fewer than this share of readings mostly waits
(for its loader's workers or reads), whatever its thread pools' CPU use says."""
MAIN_THREAD_BUSY = 0.80
"""The main process uses at least this share of one core: its Python thread is CPU-bound
(per-step framework overhead, launches). Source: the seeds' triage ("main thread at 100 %")."""
HOST_RAM_LOW_BYTES = 2 * 2**30
"""Host RAM available below this (bytes) during a window: persistent workers' memory matters."""

KERNEL_SHORT_US = 10.0
"""Median kernel shorter than this (about one launch on current GPUs) is launch-bound.
Source: HTA ("kernels shorter than their launch" / CPU-bound kernel launches)."""
GPU_IDLE_SHARE = 0.20
"""Capture: the device idles between kernels for more than this share of the captured time.
Source: HTA temporal breakdown ("idle time" between kernels)."""
SYNCS_PER_STEP = 1.0
"""Capture: more than this many synchronizing calls per step (``.item()``, ``.cpu()``)."""

MIN_STEPS = 3
"""Fewer measured steps than this give no diagnosis beyond "not enough data"."""
HEALTHY_BELOW = 0.50
"""``healthy`` is listed when no finding reaches this confidence."""
MIN_GAIN = 0.05
"""A change is kept only when it makes the job at least this share faster (5 %): the closed
loop's default ``min_gain`` and each step of ``tune_dataloader``'s worker search."""
MODEL_GAIN = 0.15
"""A worker count the job model predicts this much faster than the one in force is a finding
of its own, whatever the data wait says (three times ``MIN_GAIN``: the least gain two pairs of
windows keep)."""
IO_WORKER_FACTOR = 4
"""Most DataLoader workers per CPU-budget worker when loading waits on reads (a waiting worker
uses little CPU): the ``storage`` recommendation and ``tune_dataloader``'s raised cap."""
