"""Measuring one DataLoader setting alone: build it from the user's loader, time it, clean up.

A candidate loader is a plain ``torch.utils.data.DataLoader`` over the user's own dataset,
sampler (or batch sampler), collate function, batch size, ``worker_init_fn``, generator and
multiprocessing context; only the knobs under test differ. Timing: ``iter()`` to the first batch
is the start-up (worker processes plus one batch); the next ``2 x num_workers`` batches are
warm-up (workers started together deliver in bursts until they drift apart); then at least
``3 x num_workers`` batches are timed, until the slice or the deadline ends, and the rate is the
slope over whole bursts (see ``_steady``). An epoch boundary pauses the clock (workers persist
across it), so a small data set still gives a rate. Workers are always shut down and joined
before returning.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import psutil

from lightning_maxtp._compat.torch_data import (
    cached_iterator,
    drop_cached_iterator,
    shutdown_workers,
    worker_processes,
)
from lightning_maxtp.loader.candidate import LoaderCandidate
from lightning_maxtp.loader.order import preserved_rng
from lightning_maxtp.loader.sample_cost import batch_facts
from lightning_maxtp.loader.worker_limits import (
    MORE_WORKERS_THAN_CPUS,
    WorkerThreadLimit,
    start_method_of,
)
from lightning_maxtp.resources.schedstat import SchedClock

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = [
    "candidate_loader",
    "measure_candidate",
    "start_method",
    "sweep",
]

log = logging.getLogger(__name__)


def start_method(loader: DataLoader[Any]) -> str:
    """How the loader's workers would be started: ``fork``, ``spawn`` or ``forkserver``."""
    return start_method_of(loader.multiprocessing_context)


def candidate_loader(
    loader: DataLoader[Any],
    *,
    num_workers: int,
    prefetch_factor: int | None,
    pin_memory: bool,
    threads: int,
    persistent_workers: bool | None = None,
) -> DataLoader[Any]:
    """A plain DataLoader with the user's data pipeline and the knobs under test.

    ``persistent_workers`` defaults to having workers: then an epoch boundary inside a
    measurement does not restart them.
    """
    from torch.utils.data import DataLoader, IterableDataset

    workers = num_workers > 0
    persistent = workers if persistent_workers is None else persistent_workers and workers
    kwargs: dict[str, Any] = {
        "collate_fn": loader.collate_fn,
        "num_workers": num_workers,
        "prefetch_factor": (prefetch_factor or 2) if workers else None,
        "pin_memory": pin_memory,
        "persistent_workers": persistent,
        "worker_init_fn": WorkerThreadLimit(
            threads, loader.worker_init_fn, forked=start_method(loader) == "fork"
        )
        if workers
        else None,
        "multiprocessing_context": loader.multiprocessing_context if workers else None,
        "generator": loader.generator,
        "timeout": loader.timeout,
    }
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is not None:  # DataLoader's own batching: keep it visible as such
        kwargs.update(
            batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last
        )
    elif loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        kwargs.update(batch_size=None, sampler=loader.sampler)
    return DataLoader(loader.dataset, **kwargs)


def _count_samples(batch: Any, default: int) -> int:
    """Samples in a batch, cheaply: the first dimension of its first tensor."""
    while isinstance(batch, list | tuple | Mapping) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, Mapping) else batch[0]
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else default


def _worker_memory(iterator: object) -> int | None:
    """USS of the largest live worker of a multi-process iterator (RSS where USS is missing)."""
    largest: int | None = None
    for worker in worker_processes(iterator):
        try:
            proc = psutil.Process(worker.pid)
            try:
                used = int(proc.memory_full_info().uss)
            except (psutil.AccessDenied, AttributeError):
                used = int(proc.memory_info().rss)
        except (psutil.Error, ValueError, TypeError):
            continue
        largest = used if largest is None else max(largest, used)
    return largest


def _shutdown(loader: DataLoader[Any], iterator: object) -> None:
    for it in (iterator, cached_iterator(loader)):
        shutdown_workers(it)
    drop_cached_iterator(loader)


def measure_candidate(
    loader: DataLoader[Any],
    *,
    num_workers: int,
    prefetch_factor: int | None,
    pin_memory: bool,
    threads: int,
    slice_s: float,
    deadline: float,
    min_batches: int = 3,
) -> LoaderCandidate:
    """Time one setting of ``loader`` alone; see the module docstring for what is counted.

    Args:
        loader: The user's loader (only its pipeline is reused).
        num_workers: Worker processes to test.
        prefetch_factor: Batches per worker in flight (ignored without workers).
        pin_memory: Pin batches as training on a GPU would.
        threads: Thread-pool limit inside each worker.
        slice_s: Seconds of timed batches to aim for.
        deadline: ``time.perf_counter()`` value at which to stop regardless.
        min_batches: Batches to time even if they take longer than ``slice_s``.

    Returns:
        The measured candidate (``expected_rate`` is filled in by the search).
    """
    start = time.perf_counter()
    with warnings.catch_warnings():
        # torch warns when workers exceed the CPU count; a measurement may do so on purpose.
        warnings.filterwarnings("ignore", message=MORE_WORKERS_THAN_CPUS)
        return _measure(
            loader,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            pin_memory=pin_memory,
            threads=threads,
            slice_s=slice_s,
            deadline=deadline,
            min_batches=min_batches,
            start=start,
        )


def _measure(
    loader: DataLoader[Any],
    *,
    num_workers: int,
    prefetch_factor: int | None,
    pin_memory: bool,
    threads: int,
    slice_s: float,
    deadline: float,
    min_batches: int,
    start: float,
) -> LoaderCandidate:
    dl = candidate_loader(
        loader,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        pin_memory=pin_memory,
        threads=threads,
    )
    iterator: Iterator[Any] = iter(dl)
    try:
        try:
            first = next(iterator)
        except StopIteration:
            raise ValueError(
                "`loader` yielded no batch; pass a DataLoader with at least one batch"
            ) from None
        startup_s = time.perf_counter() - start
        per_batch, batch_bytes, pixel_dtype = batch_facts(first)
        del first
        warm_left = max(1, 2 * num_workers)
        # Three bursts at least: the steady window runs between fetches that waited.
        min_batches = max(min_batches, 3 * num_workers + 1)
        segments: list[list[_Fetch]] = [[]]
        timed_s, batches = 0.0, 0
        # Without workers the whole process loads (torch ops may use its other threads); with
        # workers the main thread only receives batches.
        cpu_clock = time.thread_time if num_workers else time.process_time
        # Without workers: the time the process waited for a core over the timed fetches.
        clock: SchedClock | None = None
        clock_start = 0.0
        while time.perf_counter() < deadline and (batches < min_batches or timed_s < slice_s):
            if num_workers == 0 and warm_left == 0 and clock is None:
                clock, clock_start = SchedClock(), time.perf_counter()
            t0, c0 = time.perf_counter(), cpu_clock()
            try:
                batch = next(iterator)
            except StopIteration:
                if len(segments) > 1 and not segments[-1]:
                    break  # an epoch without batches
                iterator = iter(dl)  # a new epoch; persistent workers carry over
                warm_left = 0
                segments.append([])
                continue
            t1, c1 = time.perf_counter(), cpu_clock()
            if warm_left > 0:
                warm_left -= 1
                continue
            segments[-1].append(_Fetch(t0, t1, c1 - c0, _count_samples(batch, per_batch)))
            batches += 1
            timed_s += t1 - t0
        waited = clock.advance() if clock is not None else None
        span = time.perf_counter() - clock_start
        wait_share = waited[1] / 1e9 / span if waited is not None and span > 0 else 0.0
        worker_memory = _worker_memory(iterator) if num_workers else None
    finally:
        _shutdown(dl, iterator)
    return _candidate(
        segments,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        pin_memory=pin_memory,
        startup_s=startup_s,
        wait_share=wait_share,
        worker_memory=worker_memory,
        facts=(per_batch, batch_bytes, pixel_dtype),
    )


def _candidate(
    segments: list[list[_Fetch]],
    *,
    num_workers: int,
    prefetch_factor: int | None,
    pin_memory: bool,
    startup_s: float,
    wait_share: float,
    worker_memory: int | None,
    facts: tuple[int, int, str | None],
) -> LoaderCandidate:
    """The candidate from its timed fetches: the steady rate, the main thread's share, memory."""
    per_batch, batch_bytes, pixel_dtype = facts
    rate, batches, timed_s, main_cpu_s, samples = _steady(segments, bursts=num_workers > 0)
    # With 0 workers all loading is serial with training (wall time: it may wait on I/O);
    # with workers only the hand-off runs on the main thread, which is CPU time.
    main_s = timed_s if num_workers == 0 else main_cpu_s
    # CPU time per second of loading, plus the time the process waited for a core: on a busy
    # machine a CPU-bound loader must not look as if it waited on reads.
    busy = min(1.0, main_cpu_s / timed_s + wait_share) if num_workers == 0 and timed_s > 0 else None
    return LoaderCandidate(
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if num_workers else None,
        pin_memory=pin_memory,
        samples_per_s=rate,
        startup_s=startup_s,
        timed_batches=batches,
        timed_s=timed_s,
        main_thread_s_per_sample=main_s / samples if samples else 0.0,
        worker_memory_bytes=worker_memory,
        batch_bytes=batch_bytes,
        sample_bytes=batch_bytes // max(per_batch, 1),
        pixel_dtype=pixel_dtype,
        expected_rate=rate,
        cpu_share=busy,
    )


class _Fetch(NamedTuple):
    start: float
    end: float
    cpu_s: float
    samples: int


def _steady(
    segments: list[list[_Fetch]], *, bursts: bool = True
) -> tuple[float, int, float, float, int]:
    """``(samples/s, batches, seconds, main-thread CPU s, samples)`` over the steady windows.

    Workers started together deliver batches in bursts: one fetch waits, the next few were
    already queued. Each epoch's window therefore runs from just before a fetch that waited to
    just before the last one (a fetch "waited" when it took over half the mean interval), and
    the rate is the least-squares slope of samples delivered against time within the windows,
    which is far less sensitive than two end points to where each worker was in its batch.
    """
    batches = samples = 0
    seconds = cpu_s = 0.0
    sxy = sxx = 0.0
    for fetches in segments:
        if not fetches:
            continue
        span = fetches[-1].end - fetches[0].start
        threshold = 0.5 * span / len(fetches)
        waited = [i for i, f in enumerate(fetches) if f.end - f.start >= threshold]
        if not bursts or len(waited) < 2:  # loading in this process: every fetch is work
            lo, hi = 0, len(fetches)
        else:
            lo, hi = waited[0], waited[-1]
        window = fetches[lo:hi]
        end = fetches[hi].start if hi < len(fetches) else fetches[-1].end
        batches += len(window)
        samples += sum(f.samples for f in window)
        seconds += end - fetches[lo].start
        cpu_s += sum(f.cpu_s for f in window)
        # (time, samples delivered so far) from the window's start: one point per batch
        points = [(fetches[lo].start, 0.0)]
        delivered = 0.0
        for f in window:
            delivered += f.samples
            points.append((f.end, delivered))
        mean_t = sum(t for t, _ in points) / len(points)
        mean_s = sum(v for _, v in points) / len(points)
        sxy += sum((t - mean_t) * (v - mean_s) for t, v in points)
        sxx += sum((t - mean_t) ** 2 for t, _ in points)
    rate = sxy / sxx if sxx > 0 else (samples / seconds if seconds > 0 else 0.0)
    return max(rate, 0.0), batches, seconds, cpu_s, samples


def sweep(
    loader: DataLoader[Any],
    settings: list[tuple[int, int | None]],
    *,
    rounds: int = 2,
    slice_s: float = 0.5,
    pin_memory: bool = False,
    threads: int = 1,
) -> dict[tuple[int, int | None], list[LoaderCandidate]]:
    """Measure every ``(num_workers, prefetch_factor)`` once per round, rounds interleaved.

    The exhaustive reference the search is checked against (tests, benchmarks): interleaving
    exposes every setting to the same drift of a shared machine.
    """
    results: dict[tuple[int, int | None], list[LoaderCandidate]] = {s: [] for s in settings}
    with preserved_rng(loader):
        for _ in range(rounds):
            for workers, prefetch in settings:
                results[(workers, prefetch)].append(
                    measure_candidate(
                        loader,
                        num_workers=workers,
                        prefetch_factor=prefetch,
                        pin_memory=pin_memory,
                        threads=threads,
                        slice_s=slice_s,
                        deadline=time.perf_counter() + 10 * slice_s + 30.0,
                    )
                )
    return results
