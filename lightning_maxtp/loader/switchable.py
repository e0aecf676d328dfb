"""A training DataLoader whose loader knobs can change mid-epoch without losing a sample.

``SwitchableLoader`` is a plain ``DataLoader`` whose batch sampler is a ``BatchFeed``: every inner
iterator (worker pool) pulls batch indices from one shared iterator per epoch. To change
``num_workers``/``prefetch_factor``/``pin_memory``/``persistent_workers`` the feed is closed for
the running iterator, which then yields the batches it already has in flight (in order) and stops;
a new iterator with the new settings continues from the next index. So the sample order is the
one the user's sampler produced, with no batch skipped or seen twice.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from lightning_maxtp._compat.torch_data import (
    cached_iterator,
    drop_cached_iterator,
    set_multiprocessing_context,
    shutdown_workers,
)
from lightning_maxtp.loader.candidate import LOADER_KNOBS
from lightning_maxtp.loader.worker_limits import (
    MORE_WORKERS_THAN_CPUS,
    WorkerThreadLimit,
    start_method_of,
    unwrap_worker_init_fn,
)

__all__ = ["BatchFeed", "SwitchableLoader", "switchable_reason"]

log = logging.getLogger(__name__)


class BatchFeed:
    """Batch sampler proxy: hands out the epoch's batches once, to whichever iterator asks."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._source: Iterator[Any] | None = None
        self._generation = 0
        self.exhausted = False

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        """Forwarded so a ``DistributedSampler`` reshuffles as Lightning expects."""
        target = self.inner if callable(getattr(self.inner, "set_epoch", None)) else None
        if target is None:
            sampler = getattr(self.inner, "sampler", None)
            target = sampler if callable(getattr(sampler, "set_epoch", None)) else None
        if target is not None:
            target.set_epoch(epoch)

    def begin_epoch(self) -> None:
        """Start the epoch's single index stream."""
        self._source = iter(self.inner)
        self.exhausted = False

    def close(self) -> None:
        """Stop feeding the iterators handed out so far (they drain what they already took)."""
        self._generation += 1

    def __iter__(self) -> Iterator[Any]:
        generation = self._generation
        while generation == self._generation:
            if self._source is None:
                self.begin_epoch()
            assert self._source is not None
            try:
                indices = next(self._source)
            except StopIteration:
                self.exhausted = True
                return
            yield indices


def switchable_reason(loader: object) -> str | None:
    """Why ``loader`` cannot be switched mid-run (``None``: it can)."""
    if type(loader) is not DataLoader:
        return (
            f"the train loader is a {type(loader).__name__}, not a plain torch DataLoader; its "
            "knobs are only recommended"
        )
    assert isinstance(loader, DataLoader)
    if isinstance(loader.dataset, IterableDataset):
        return "the train dataset is an IterableDataset: changing num_workers changes its stream"
    if loader.batch_sampler is None:
        return "the train loader has no batch sampler (batch_size=None)"
    return None


class SwitchableLoader(DataLoader[Any]):
    """The user's train DataLoader rebuilt around a ``BatchFeed`` (see the module docstring).

    Args:
        source: The loader Lightning set up (distributed sampler already injected).
        cpu_threads: CPUs shared by the workers, for the per-worker thread limit.
    """

    def __init__(self, source: DataLoader[Any], cpu_threads: int = 1) -> None:
        self.source = source
        """The loader it was built from (the user's, after Lightning's sampler injection)."""
        self.user_worker_init_fn = unwrap_worker_init_fn(source.worker_init_fn)
        self.user_mp_context = source.multiprocessing_context
        self.cpu_threads = max(1, cpu_threads)
        workers = source.num_workers
        super().__init__(
            source.dataset,
            batch_sampler=BatchFeed(source.batch_sampler),
            num_workers=workers,
            collate_fn=source.collate_fn,
            pin_memory=source.pin_memory,
            timeout=source.timeout,
            worker_init_fn=self._init_fn(workers),
            multiprocessing_context=self.user_mp_context if workers else None,
            generator=source.generator,
            prefetch_factor=source.prefetch_factor if workers else None,
            persistent_workers=source.persistent_workers,
            pin_memory_device=source.pin_memory_device,
            in_order=source.in_order,
        )
        self._pending: dict[str, Any] | None = None
        self._current: Any = None
        self.switches = 0
        self.followers: list[SwitchableLoader] = []
        """Loaders that take every setting this one is asked for (the validation loaders
        built like the train loader): their workers restart with the same settings."""

    @property
    def feed(self) -> BatchFeed:
        """The batch sampler proxy."""
        feed = self.batch_sampler
        assert isinstance(feed, BatchFeed)
        return feed

    def settings(self) -> dict[str, Any]:
        """The loader knobs now in force (or requested, once the switch happens).

        As the switch will apply them: a prefetch of 2 (torch's) once there are workers, none
        without.
        """
        current = {k: getattr(self, k) for k in LOADER_KNOBS}
        merged = current | (self._pending or {})
        if "prefetch_factor" in merged:
            workers = merged.get("num_workers") or 0
            merged["prefetch_factor"] = (merged["prefetch_factor"] or 2) if workers else None
        return merged

    @property
    def switched(self) -> bool:
        """Whether the last requested change is in force."""
        return self._pending is None

    def request(self, **settings: Any) -> None:
        """Switch to ``settings`` at the next batch boundary (in-flight batches drain first)."""
        unknown = set(settings) - set(LOADER_KNOBS)
        assert not unknown, unknown
        self._pending = (self._pending or {}) | settings
        for follower in self.followers:  # each takes them at its next iterator
            follower.request(**settings)

    def _init_fn(self, workers: int) -> Any:
        if workers == 0:
            return self.user_worker_init_fn
        forked = start_method_of(self.user_mp_context) == "fork"
        return WorkerThreadLimit(
            max(1, self.cpu_threads // workers), self.user_worker_init_fn, forked=forked
        )

    def _apply_pending(self) -> None:
        if not self._pending:
            self._pending = None
            return
        settings = {k: getattr(self, k) for k in LOADER_KNOBS} | self._pending
        self._pending = None
        workers = int(settings["num_workers"])
        prefetch = settings["prefetch_factor"]
        self.num_workers = workers
        self.prefetch_factor = (prefetch or 2) if workers else None
        self.pin_memory = bool(settings["pin_memory"])
        self.worker_init_fn = self._init_fn(workers)
        # DataLoader forbids setting these after __init__; the iterators read them at creation.
        object.__setattr__(self, "persistent_workers", bool(settings["persistent_workers"]))
        set_multiprocessing_context(self, self.user_mp_context if workers else None)
        self.switches += 1

    def shutdown(self) -> None:
        """Stop the workers of the current iterator, and its followers' (idempotent)."""
        for follower in self.followers:
            follower.shutdown()
        for it in (self._current, cached_iterator(self)):
            shutdown_workers(it)
        drop_cached_iterator(self)
        self._current = None

    def _start(self, *, fresh_rng: bool) -> Any:
        with warnings.catch_warnings():
            if self.switches:  # our settings: more workers than CPUs pays for waiting reads
                warnings.filterwarnings("ignore", message=MORE_WORKERS_THAN_CPUS)
            if fresh_rng:
                import torch

                # A replacement iterator draws its worker base seed from the global RNG; keep
                # the training's own random stream where it would have been without the switch.
                with torch.random.fork_rng(devices=[]):
                    it = super().__iter__()
            else:
                it = super().__iter__()
        self._current = it
        return it

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        if self._pending is not None:
            self.shutdown()
            self._apply_pending()
        feed = self.feed
        feed.begin_epoch()
        it = self._start(fresh_rng=False)
        draining = False
        while True:
            try:
                batch = next(it)
            except StopIteration:
                if not draining:
                    return
                draining = False
                self.shutdown()
                self._apply_pending()
                if feed.exhausted:
                    return
                it = self._start(fresh_rng=True)
                continue
            yield batch
            if self._pending is not None and not draining:
                draining = True
                feed.close()
