"""Model copies per GPU from measured memory: the first copy reports, the pool adds the rest.

The rule is the one ``plan_workers`` applies to a ``model_bytes`` the caller gives:
``(free - headroom) // per-copy memory``, capped. Here the per-copy memory is measured: the
first worker on each GPU builds its model, runs one batch and reports what it holds, so nobody
has to know the model's footprint in advance.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_maxtp.resources.probe import DEFAULT_HEADROOM_BYTES, workers_for_memory

CONTEXT_BYTES = 512 * 1024**2
"""A CUDA context's own memory (kernels, cuBLAS/cuDNN workspaces), outside torch's allocator:
every extra process on the GPU pays it again."""


def used_bytes(device: Any) -> int:
    """Device memory in use on ``device`` by every process (creates this one's context)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def copy_bytes(device: Any, used_before: int | None = None) -> int:
    """Device memory one model copy holds after a batch: what the next copy will need too.

    The allocator's peak reservation plus a CUDA context, or what the device's use grew by
    since ``used_before`` (read when this copy's context existed and its model did not; the
    growth outside the allocator is cuBLAS/cuDNN workspaces) plus a context, whichever is
    larger. Not the device's whole use: the parent's models or another copy are on it too.
    """
    import torch

    reserved = int(torch.cuda.max_memory_reserved(device))
    grown = used_bytes(device) - used_before if used_before is not None else 0
    return max(reserved, grown) + CONTEXT_BYTES


def extra_copies(
    free_bytes: Mapping[int, int | None],
    per_copy_bytes: int,
    running: Mapping[int, int],
    *,
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
    max_copies: int,
) -> dict[int, int]:
    """Copies to add per GPU once one copy's memory is known (pure).

    Args:
        free_bytes: Free memory per GPU ordinal as probed before the pool started (``None``:
            unknown, nothing is added there).
        per_copy_bytes: What one copy measured.
        running: Copies already running per GPU.
        headroom_bytes: Memory left free per GPU.
        max_copies: Cap per GPU.

    Returns:
        ``{ordinal: copies to add}`` for every GPU in ``running`` (0 where none fits).
    """
    extra: dict[int, int] = {}
    for index, count in running.items():
        free = free_bytes.get(index)
        fit = workers_for_memory(
            free, max(1, per_copy_bytes), headroom_bytes=headroom_bytes, max_workers=max_copies
        )
        extra[index] = max(0, max(1, fit) - count)
    return extra
