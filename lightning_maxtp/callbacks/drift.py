"""Why a window after tuning runs slower than its reference window: ``explain_drift``.

Once tuning is over every monitoring window runs under the settings in force; one much slower
than the reference window those settings were judged by is a drift. Noting it does not tell
the loop whether to act, so the causes that the windows and the process already show are
checked, in this order:

* ``settings``: a setting in the drifted window's context differs from the reference's (a
  loader knob, the intra-op threads, a math knob the diagnosis reads): something changed the
  fit after tuning.
* ``state``: the fit or the process differs from the snapshot taken with the reference
  (``snapshot``): a knob the context does not carry (``channels_last``, ``fused_optimizer``),
  torch's thread pools, a backend flag, the garbage collector, the CPUs the process may use.
  A trial reverted inexactly shows here.
* ``load``: other processes kept CPUs busy that were free in the reference window (the
  machine-wide CPU less this job's own): the machine, not the settings. With an intra-op pool
  larger than the CPUs left, torch's threads wait on each other at every parallel region (on
  2 cores with a neighbour busy on one, a small conv net's step went from 18 to 425 ms at two
  threads, against 28 ms at one), so the cause names the pool size that fits (``threads``).
* ``stalls``: the median step is as fast as the reference's; a few long steps (a collection,
  a checkpoint, a compile) make the difference.

When none of them shows, ``explain_drift`` returns ``None``: the drift is unexplained.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from lightning_maxtp.knobs.registry import KNOBS
from lightning_maxtp.knobs.registry import SETTINGS as SETTING_KNOBS  # drift has its SETTINGS
from lightning_maxtp.observe.window import JobContext

if TYPE_CHECKING:
    from lightning_maxtp.callbacks.math_knobs import MathKnobs
    from lightning_maxtp.observe.window import Window

__all__ = [
    "LOAD_CPUS",
    "SETTINGS",
    "STALL_SHARE",
    "DriftCause",
    "explain_drift",
    "other_cpus",
    "process_state",
    "snapshot",
]

LOAD_CPUS = 0.5
"""Least rise in the CPUs other processes keep busy, from the reference window to the drifted
one, for their load to explain a drift."""
STALL_SHARE = 0.1
"""A drifted window whose median step is at most this share slower than the reference's is
slowed by a few long steps, not by slower steps."""
_CONTEXT_FIELDS = frozenset(f.name for f in fields(JobContext))
SETTINGS: tuple[str, ...] = tuple(
    name
    for name in (
        *(k.context_field for k in SETTING_KNOBS if k.context_field is not None),
        *(k.context_field for k in KNOBS if k.context_field is not None),
    )
    if name in _CONTEXT_FIELDS
)
"""The ``JobContext`` fields that are settings of the fit (compared first)."""

DriftKind = Literal["settings", "state", "load", "stalls"]


@dataclass(frozen=True)
class DriftCause:
    """What explains a drift, in a sentence for the report (``str``) and as data for the loop."""

    kind: DriftKind
    """Which check found it (see the module docstring)."""
    why: str
    """The sentence for the report."""
    changed: tuple[tuple[str, Any, Any], ...] = ()
    """``settings`` and ``state``: ``(name, value with the reference, value now)``."""
    threads: int | None = None
    """``load``: the intra-op pool size that fits the CPUs left, when the pool in force is
    larger (``None``: it fits, or the CPUs are unknown)."""

    def __str__(self) -> str:
        return self.why

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "kind": self.kind,
            "why": self.why,
            "changed": [[name, repr(old), repr(new)] for name, old, new in self.changed],
            "threads": self.threads,
        }


def other_cpus(window: Window) -> float | None:
    """CPUs other processes kept busy during the window (``Window.other_cpus``)."""
    return window.other_cpus


def explain_drift(
    reference: Window,
    drifted: Window,
    reference_state: Mapping[str, Any],
    state: Mapping[str, Any],
) -> DriftCause | None:
    """What explains ``drifted`` running slower than ``reference`` (``None``: nothing shown).

    Args:
        reference: The window the settings in force were judged by (the loop's reference).
        drifted: A window measured after tuning, found slower.
        reference_state: ``snapshot()`` taken when the reference window was measured.
        state: ``snapshot()`` taken now.
    """
    ref_context, context = reference.context, drifted.context
    # A field one window has not read (``None``: tf32 and gc_tuned are read once the math knobs
    # are bound) is not a change: "tf32 None -> False" named a cause where nothing changed. A
    # loader setting that is ``None`` beside workers (prefetch_factor) moves with num_workers,
    # which is shown.
    changed = tuple(
        c
        for c in _changed(
            {f: getattr(ref_context, f) for f in SETTINGS},
            {f: getattr(context, f) for f in SETTINGS},
        )
        if c[1] is not None and c[2] is not None
    )
    if changed:
        why = f"settings differ from the reference window's: {_fmt(changed)}"
        return DriftCause("settings", why, changed)
    changed = _changed(reference_state, state)
    if changed:
        why = f"the fit or the process differs from the reference window's: {_fmt(changed)}"
        return DriftCause("state", why, changed)
    cause = _load(reference, drifted)
    if cause is not None:
        return cause
    ref_median, median = reference.median_step_s, drifted.median_step_s
    if ref_median > 0 and median <= (1 + STALL_SHARE) * ref_median:
        longest = max(drifted.step_time_s)
        slow = sum(1 for s in drifted.step_time_s if s > 2 * ref_median)
        why = (
            f"the median step is as fast as the reference's ({median * 1e3:.1f} vs "
            f"{ref_median * 1e3:.1f} ms); {slow} long step(s), the longest "
            f"{longest * 1e3:.0f} ms, make the difference"
        )
        if drifted.gc is not None and drifted.gc.gen2:
            gc = drifted.gc
            why += f" ({gc.gen2} full garbage collection(s), {gc.total_s * 1e3:.0f} ms)"
        return DriftCause("stalls", why)
    return None


def _load(reference: Window, drifted: Window) -> DriftCause | None:
    """The ``load`` cause, when other processes took CPUs the reference window had."""
    before, now = other_cpus(reference), other_cpus(drifted)
    cpus = drifted.context.host_cpus
    if before is None or now is None or not cpus or now - before < LOAD_CPUS:
        return None
    free = max(1, math.floor(cpus - now + 0.25))  # a quarter CPU's slack: the sampler's noise
    pool = drifted.context.intra_op_threads
    threads = free if pool is not None and pool > free else None
    why = (
        f"other processes kept {now:.1f} of {cpus} CPUs busy ({before:.1f} in the reference "
        "window): the machine, not the settings"
    )
    if threads is not None:
        why += f"; {pool} intra-op threads on the {free} CPU(s) left wait on each other"
    return DriftCause("load", why, threads=threads)


def _changed(before: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[tuple[str, Any, Any], ...]:
    """``(name, before, now)`` for every key whose value differs (a missing key is ``None``)."""
    names = sorted(set(before) | set(now))
    return tuple((n, before.get(n), now.get(n)) for n in names if before.get(n) != now.get(n))


def _fmt(changed: tuple[tuple[str, Any, Any], ...]) -> str:
    return ", ".join(f"{name} {old!r} -> {new!r}" for name, old, new in changed)


def process_state() -> dict[str, Any]:
    """The process-wide settings a step's speed or numbers depend on, as plain values.

    Torch's thread pools and the BLAS ones, the backend flags, the default dtype, the garbage
    collector and the CPUs the process may run on. Cheap enough to read once per window.
    """
    import gc
    import os

    import torch

    state: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "mkldnn": torch.backends.mkldnn.enabled,
        "gc_enabled": gc.isenabled(),
        "gc_threshold": gc.get_threshold(),
        "gc_frozen": gc.get_freeze_count() > 0,
    }
    if hasattr(os, "sched_getaffinity"):  # Linux: a launcher or a neighbour may pin the process
        state["cpu_affinity"] = len(os.sched_getaffinity(0))
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return state
    for pool in threadpool_info():
        state[f"pool:{pool['internal_api']}:{pool['prefix']}"] = pool["num_threads"]
    return state


def snapshot(math_knobs: MathKnobs | None = None) -> dict[str, Any]:
    """``process_state()`` and, with the fit's knobs, each mid-fit knob's value (``knob:name``).

    Taken with the reference window and again with a drifted one, for ``explain_drift``.
    """
    state = process_state()
    if math_knobs is not None and math_knobs.trainer is not None:
        for knob in KNOBS:
            if not knob.before_fit:
                state[f"knob:{knob.name}"] = math_knobs.current(knob.name)
    return state
