"""Which GPUs a plan uses, and how much memory each may take (pure; part of ``plan_strategy``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from lightning_maxtp.resources.probe import Resources

__all__ = ["Devices", "choose_gpus", "gpu_budget"]

Devices = int | Sequence[int] | Literal["auto"]
"""A ``devices`` request: ``"auto"``, a count (``-1``: all) or a list of CUDA ordinals."""


def choose_gpus(resources: Resources, devices: Devices) -> tuple[list[int], list[str], list[str]]:
    """The GPUs to use, the busy ones skipped (named, with why) and warnings."""
    visible = [g.index for g in resources.gpus]
    free = list(resources.advice.free_gpus)
    busy = {b.index: b.reason for b in resources.advice.busy_gpus}
    named = [f"GPU {i} (busy: {why})" for i, why in busy.items()]
    fix_share = f"devices=[{next(iter(busy), 0)}] to share a busy GPU on purpose"
    if devices in ("auto", -1):
        if not free:
            raise ValueError(
                f"devices={devices!r} found no free GPU among {visible}: {'; '.join(named)}. "
                f"Fix: wait for the other jobs, pass accelerator='cpu', or {fix_share}"
            )
        return free, named, []
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices < 1:
            raise ValueError(f"`devices` must be 'auto', -1 or an int >= 1, got {devices!r}")
        if devices > len(visible):
            raise ValueError(
                f"devices={devices} asks for {devices} GPUs but only {len(visible)} are visible "
                f"({visible}); pass devices={len(visible)} or devices='auto'"
            )
        if devices > len(free):
            raise ValueError(
                f"devices={devices} asks for {devices} GPUs but only {len(free)} are free "
                f"({free}): {'; '.join(named)}. Fix: devices={len(free) or 1} or 'auto' to use "
                "the free ones, or a list such as devices=[0, 1] to use busy GPUs on purpose"
            )
        chosen = free[:devices]
        instead = [f"GPU {i} (busy: {busy[i]})" for i in visible[:devices] if i in busy]
        return chosen, instead, []
    if isinstance(devices, Sequence) and not isinstance(devices, str) and devices:
        listed = [int(i) for i in devices]
        unknown = [i for i in listed if i not in visible]
        if unknown or len(set(listed)) != len(listed):
            raise ValueError(
                f"devices={listed} must list distinct visible GPUs {visible}; "
                f"{unknown or 'duplicates'} cannot be used"
            )
        warnings = [
            f"maxtp: GPU {i} is busy ({busy[i]}) but devices={listed} lists it: using it as "
            "asked; it may run out of memory or slow the other job down"
            for i in listed
            if i in busy
        ]
        return listed, [], warnings
    raise ValueError(
        f"`devices` must be 'auto', an int or a non-empty list of GPU indices, got {devices!r}"
    )


def gpu_budget(
    resources: Resources, chosen: list[int], basis: str, headroom: int, cap: int | None
) -> int | None:
    """Memory one rank may use on the chosen GPUs (``None`` when a GPU's memory is unknown).

    The least free (or total, by ``basis``) memory among them, minus ``headroom``, at most ``cap``.
    """
    by_index = {g.index: g for g in resources.gpus}
    values = [
        by_index[i].memory_free_bytes if basis == "free" else by_index[i].memory_total_bytes
        for i in chosen
    ]
    if any(v is None for v in values):
        return None
    budget = max(0, min(v for v in values if v is not None) - headroom)
    return budget if cap is None else min(budget, cap)
