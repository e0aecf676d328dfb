"""Out-of-memory recognition, allocator clean-up and peak-memory readings between trials.

``torch.OutOfMemoryError`` is checked first (the CUDA caching allocator and recent backends
raise it); message matching is only the fallback, for backends and allocators that raise a plain
``RuntimeError``. The exception's whole cause chain is checked, since user code sometimes
re-raises an OOM wrapped in its own error.
"""

from __future__ import annotations

import contextlib
import gc
import re
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "OOM_MESSAGES",
    "current_rss_bytes",
    "describe_oom",
    "free_memory",
    "frozen_heap",
    "is_oom_error",
    "read_peak_memory",
    "release_exception",
    "reset_peak_memory",
]

OOM_MESSAGES: tuple[tuple[str, str], ...] = (
    ("cuda", "CUDA out of memory"),
    ("cuda", "CUDA error: out of memory"),
    # cuDNN rejects inputs too large for its kernels with this status (pytorch#4107).
    ("cudnn", "CUDNN_STATUS_NOT_SUPPORTED"),
    ("cudnn", "CUDNN_STATUS_ALLOC_FAILED"),
    ("cublas", "CUBLAS_STATUS_ALLOC_FAILED"),
    ("mps", "MPS backend out of memory"),
    ("hip", "HIP out of memory"),
    ("xpu", "XPU out of memory"),
    ("npu", "NPU out of memory"),
    ("hpu", "PT_DEVMEM Allocation failed"),
    ("cpu", "DefaultCPUAllocator: can't allocate memory"),
)
"""``(backend, substring)`` of out-of-memory messages that arrive as a plain ``RuntimeError``."""

_MAX_CHAIN = 8
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
_HWM = re.compile(r"^VmHWM:\s+(\d+)\s+kB", re.MULTILINE)


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < _MAX_CHAIN and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def is_oom_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) means "out of memory"."""
    import torch

    for err in _chain(exc):
        if isinstance(err, torch.OutOfMemoryError | MemoryError):
            return True
        if isinstance(err, RuntimeError):
            text = " ".join(str(a) for a in err.args if isinstance(a, str))
            if any(pattern in text for _, pattern in OOM_MESSAGES):
                return True
    return False


def describe_oom(exc: BaseException, limit: int = 160) -> str:
    """One line for the trial table: the exception type and its message's first line."""
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else ""
    text = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def release_exception(exc: BaseException) -> None:
    """Drop what an exception keeps alive: its frames' locals (activations, the batch, the loss).

    A traceback references every frame between the raise and the handler; those frames hold the
    tensors of the failed step, which would stay allocated and make the next trial fail too.
    """
    for err in _chain(exc):
        if err.__traceback__ is not None:
            traceback.clear_frames(err.__traceback__)
        err.__traceback__ = None


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Hide the objects that exist now from the garbage collector while the search runs.

    A full collection scans every object; with torch and lightning loaded that is ~0.3 s, paid
    after every out-of-memory trial. Frozen, the heap that existed before the search is skipped
    and a collection only sees what the trials created. A caller's own freeze is left alone.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def free_memory(device: torch.device, *, collect: bool = True) -> None:
    """Collect garbage and return cached blocks to the device, so the next trial starts clean.

    Args:
        device: Whose cache to empty.
        collect: Run the garbage collector first (needed after a failed step).
    """
    import torch

    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def reset_peak_memory(device: torch.device) -> bool:
    """Start a fresh peak-memory reading (the device allocator's, or this process's peak RSS).

    Returns:
        Whether ``read_peak_memory`` will measure from now (False: no reading is possible).
    """
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    if device.type == "cpu":
        try:
            _CLEAR_REFS.write_text("5")  # Linux: "5" resets VmHWM, the peak resident set size
        except OSError:
            return False
        return True
    return False


def read_peak_memory(device: torch.device) -> int | None:
    """Peak memory since ``reset_peak_memory``, in bytes; ``None`` where it cannot be read."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "cpu":
        try:
            match = _HWM.search(_STATUS.read_text())
        except OSError:
            return None
        return int(match.group(1)) * 1024 if match else None
    return None


def current_rss_bytes() -> int | None:
    """This process's resident set size now (the baseline a CPU trial's peak is compared to)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return None
    return int(psutil.Process().memory_info().rss)
