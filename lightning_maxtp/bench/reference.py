"""A small fixed training workload that measures how fast this machine is right now.

A ratio between two configurations of one job cannot see the job itself getting slower, and raw
samples/s cannot travel between CI runners of different speed. Dividing the job's rate by this
workload's rate, timed in the same process just before the fit, gives a number that does both:
it falls when the job gets slower and stays put when the whole machine does.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["REFERENCE", "reference_rate"]

REFERENCE = "conv2-mlp/2"
"""Name and version of the workload; a baseline timed with another one is not comparable."""


def _shape(device_type: str) -> tuple[int, int, int]:
    """Batch, image side and width: bigger on an accelerator, so it measures compute there too."""
    return (256, 64, 64) if device_type == "cuda" else (32, 32, 16)


def reference_rate(device: Any, *, chunks: int = 5, chunk_s: float = 0.2) -> float:
    """Samples/s of the reference training step on ``device``: the median of short chunks.

    A chunk runs whole steps until ``chunk_s`` has passed; the median ignores a chunk that
    another process disturbed. One chunk of warm-up comes first and is not counted. On a CPU it
    runs on one thread (the process's setting is put back after): on a shared 2-core machine a
    compute-bound job's rate per reference then varied 15 % over four runs, against 32 % with
    the reference on two threads, and one thread still measures how fast the machine's cores
    are, which is what differs between runners.

    Args:
        device: A ``torch.device`` (or its name).
        chunks: Timed chunks.
        chunk_s: Seconds per chunk.
    """
    import torch
    from torch import nn

    device = torch.device(device)
    batch, side, width = _shape(device.type)
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(32 * width, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 3, side, side, generator=generator).to(device)
    y = torch.randint(0, 10, (batch,), generator=generator).to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def chunk() -> float:
        steps, start = 0, time.perf_counter()
        while True:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            steps += 1
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= chunk_s:
                return steps * batch / elapsed

    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        chunk()
        return statistics.median(chunk() for _ in range(chunks))
    finally:
        torch.set_num_threads(threads)
