"""Reading a Ray streaming task's output without ever waiting on it.

* ``ObjectRefGenerator._next_sync(timeout_s=0)``: the next ref of a streaming task if it can be
  had now, Ray's nil ref if not, ``StopIteration`` at the end, and the task's own return ref
  (which raises its error) when it failed.

The public ways wait: ``next(generator)`` without a limit for an item a cancelled or failed task
never sends, and ``generator.next_ready()`` (said to return at once) calls ``ray.get`` on the
task's return without a limit once the stream has ended. A task cancelled while it runs ends
its stream at once but sets that return only when its code has finished stopping, or never if
its worker is stuck, so the submitting side hung there. With a timeout of 0 the private call
bounds both waits.

Importing this module does not import Ray.
"""

from __future__ import annotations

from typing import Any

__all__ = ["next_ready_ref"]


def next_ready_ref(generator: Any) -> Any | None:
    """The next ref ``generator`` (a Ray ``ObjectRefGenerator``) has now, else ``None``.

    Returns at once. The ref's object is in Ray's store (``ray.get`` of it may still fetch it
    from another node). The last ref of a task that raised is its return ref, which raises
    the task's error.

    Raises:
        StopIteration: The task has ended and every ref has been taken.
    """
    ref = generator._next_sync(timeout_s=0)
    return None if ref.is_nil() else ref
