"""``RunIf``: one marker that builds its own skip reason, as in Lightning's test suite."""

from __future__ import annotations

import sys

import pytest


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


def RunIf(
    *,
    min_cuda_gpus: int = 0,
    linux_only: bool = False,
) -> pytest.MarkDecorator:
    """Skip unless the machine meets every condition; the reason lists the unmet ones.

    Args:
        min_cuda_gpus: Minimum number of CUDA GPUs visible to torch.
        linux_only: Require Linux (cgroup, /proc and /dev/shm paths).

    Example:
        ``@RunIf(min_cuda_gpus=1)`` skips with ``Requires: [GPUs>=1]`` on a CPU-only machine.
    """
    reasons = []
    if min_cuda_gpus and _cuda_device_count() < min_cuda_gpus:
        reasons.append(f"GPUs>={min_cuda_gpus}")
    if linux_only and not sys.platform.startswith("linux"):
        reasons.append("Linux")
    return pytest.mark.skipif(condition=bool(reasons), reason=f"Requires: [{' + '.join(reasons)}]")
