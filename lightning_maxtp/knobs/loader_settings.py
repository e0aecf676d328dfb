"""The train loader's four settings, each a ``SettingKnob``.

One idea: the DataLoader's own arguments, switched mid-epoch through ``SwitchableLoader``
without skipping or repeating a sample (in-flight batches drain first), and taken by the
validation loaders built alike. None changes the batches, so all are same math. The loop
switches a copy of the user's loader (``SwitchableLoader``), never the user's object.
"""

from __future__ import annotations

from typing import ClassVar

from lightning_maxtp.knobs.setting import SettingKnob

__all__ = ["NumWorkers", "PersistentWorkers", "PinMemory", "PrefetchFactor"]


class NumWorkers(SettingKnob):
    """``num_workers``: processes that load batches beside the step."""

    name = "num_workers"
    reason = "the loader keeps up with the step, without taking the step's cores"
    counts_workers = True


class PrefetchFactor(SettingKnob):
    """``prefetch_factor``: batches each worker keeps ready."""

    name = "prefetch_factor"
    reason = "deeper queues absorb uneven batches"
    needs_workers = True
    queue_depth = True


class PinMemory(SettingKnob):
    """``pin_memory``: batches copied to page-locked memory for faster copies to a GPU."""

    name = "pin_memory"
    reason = "copies to the GPU from page-locked memory run asynchronously"
    devices: ClassVar[frozenset[str] | None] = frozenset({"cuda"})


class PersistentWorkers(SettingKnob):
    """``persistent_workers``: workers kept alive between epochs."""

    name = "persistent_workers"
    reason = "workers stay up between epochs instead of starting again"
    needs_workers = True
    epoch_start_only = True
