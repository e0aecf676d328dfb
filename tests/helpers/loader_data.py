"""Datasets with a known cost shape for DataLoader tuning tests (module level: spawn can pickle).

On a 2-core machine, CPU-bound loading cannot scale past 2 processes, so tests that need a
curve with a knee use time that is not CPU: ``SleepDataset`` waits per sample like storage
latency, and ``limit`` caps how many of those waits run at once (a disk or server that serves
so many reads in parallel), which puts the knee of the curve at that many workers.
``DecodeDataset`` is the genuinely CPU-heavy case: JPEG decode plus random crop in PIL.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import time
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

_HOGS: dict[int, bytes] = {}
"""Memory held by ``MemoryHogDataset`` per process id (a forked worker inherits the parent's
entry without touching it, so it allocates its own)."""


class SleepDataset(Dataset[tuple[torch.Tensor, int]]):
    """``(features, index)`` after sleeping ``sleep_s`` per sample (storage-like latency).

    Args:
        size: Number of samples.
        sleep_s: Wait per sample.
        limit: At most this many samples load at once across all workers (``None``: no limit).
            A fork-inherited semaphore, so use it with the ``fork`` start method.
        dim: Feature size.
    """

    def __init__(
        self, size: int = 256, sleep_s: float = 0.002, limit: int | None = None, dim: int = 16
    ) -> None:
        self.size, self.sleep_s, self.dim = size, sleep_s, dim
        self.gate = multiprocessing.get_context("fork").Semaphore(limit) if limit else None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.gate is not None:
            with self.gate:
                time.sleep(self.sleep_s)
        else:
            time.sleep(self.sleep_s)
        return torch.full((self.dim,), float(index)), index


class MemoryHogDataset(SleepDataset):
    """A ``SleepDataset`` whose every process holds ``hog_bytes`` of its own memory once used."""

    def __init__(self, hog_bytes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hog_bytes = hog_bytes

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if os.getpid() not in _HOGS:
            _HOGS[os.getpid()] = os.urandom(16) * (self.hog_bytes // 16)
        return super().__getitem__(index)


def release_hogs() -> None:
    """Free what ``MemoryHogDataset`` allocated in this process."""
    _HOGS.clear()


def encode_jpegs(count: int, side: int, seed: int = 0) -> list[bytes]:
    """``count`` JPEG-encoded noisy gradients, ``side`` x ``side`` pixels."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    images = []
    for _ in range(count):
        pixels = ramp[None, :, None] * rng.uniform(0.3, 1.0, 3) + rng.normal(0, 25, (side, side, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
        images.append(buffer.getvalue())
    return images


class DecodeDataset(Dataset[tuple[torch.Tensor, int]]):
    """CPU-heavy: decode an in-memory JPEG, random-crop, flip and convert to a float tensor."""

    def __init__(self, count: int = 64, side: int = 192, crop: int = 128) -> None:
        self.images, self.crop = encode_jpegs(count, side), crop

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(io.BytesIO(self.images[index])) as image:
            rgb = image.convert("RGB")
        x, y = torch.randint(0, rgb.width - self.crop + 1, (2,)).tolist()
        patch = rgb.crop((x, y, x + self.crop, y + self.crop))
        if torch.rand(()) < 0.5:
            patch = patch.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        array = np.asarray(patch, dtype=np.float32) / 255.0
        return torch.from_numpy(array).permute(2, 0, 1).contiguous(), index


class _Store:
    def __init__(self, path: str) -> None:
        self.name = path
        self.handle = open(path, "rb")  # noqa: SIM115 - the point: a handle held open


class UnpicklableDataset(Dataset[int]):
    """Holds an open file two attributes down, as a dataset with a lazy "store" often does."""

    def __init__(self, path: str) -> None:
        self.size = 8
        self.store = _Store(path)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index

    def close(self) -> None:
        self.store.handle.close()


def thread_report(worker_id: int) -> None:
    """A user ``worker_init_fn``: records that it ran, and the torch threads it saw."""
    info = torch.utils.data.get_worker_info()
    assert info is not None
    info.dataset.init_ran = (worker_id, torch.get_num_threads())  # type: ignore[attr-defined]


class BlasThreadsDataset(Dataset[tuple[int, int]]):
    """``(index, threads of the BLAS pools numpy loaded)`` as seen inside a worker."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[int, int]:
        from threadpoolctl import threadpool_info

        np.ones((8, 8)) @ np.ones((8, 8))  # the pool exists and has run
        blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
        return index, max(blas, default=-1)


class ThreadsDataset(Dataset[tuple[int, int, int, int]]):
    """``(index, torch threads, OMP_NUM_THREADS, threads seen by thread_report)`` in a worker."""

    init_ran: tuple[int, int] | None = None

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[int, int, int, int]:
        seen = -1 if self.init_ran is None else self.init_ran[1]
        omp = int(os.environ.get("OMP_NUM_THREADS", "-1"))
        return index, torch.get_num_threads(), omp, seen


class MatmulBatches(Dataset[tuple[torch.Tensor]]):
    """Rows of 32 features, each batch costing its worker ``matmuls`` matrix products.

    ``__getitems__`` (which torch's fetcher calls with a batch's indices) computes the batch at
    once, so a loader with a batch size runs it like a batch-at-a-time loader; an index list
    (``batch_size=None`` with a batch sampler) gets the batch collated. torch runs one
    intra-op thread in a DataLoader worker, so the share of a core a worker takes beside a
    matmul step depends little on the machine's speed.
    """

    def __init__(self, samples: int, width: int = 2048, matmuls: int = 6) -> None:
        self.samples, self.width, self.matmuls = samples, width, matmuls

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int | list[int]) -> tuple[torch.Tensor]:
        if isinstance(index, list):
            return (self._batch(index),)
        return (self._batch([index])[0],)

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor]]:
        return [(row,) for row in self._batch(indices)]

    def _batch(self, indices: list[int]) -> torch.Tensor:
        """The batch of ``indices``: ``matmuls`` products of a seeded ``width``-wide matrix."""
        g = torch.Generator().manual_seed(indices[0])
        w = torch.randn(self.width, self.width, generator=g)
        x = torch.randn(len(indices), self.width, generator=g)
        for _ in range(self.matmuls):
            x = torch.tanh(x @ w / self.width**0.5)
        return x[:, :32].contiguous()
