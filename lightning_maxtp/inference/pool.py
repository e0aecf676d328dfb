"""``BatchInferencePool``: batched inference on every usable device, losing nothing.

One spawned process per model copy (``CUDA_VISIBLE_DEVICES`` isolates its GPU), the model built
once per worker, a thread pool in each worker for ``load``/``preprocess``, batches pulled on
demand. The coordinator (this process) keeps the work queue: a worker holds at most two batches
(one running, one loading) and gets the next when it returns one, so a slow worker takes fewer
batches. Each worker has its own pipe rather than one shared ``multiprocessing.Queue``: a
worker killed while holding a shared queue's lock would hang every other worker, and with one
pipe per worker the coordinator always knows which batches a dead worker held.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from lightning_maxtp._log import prefixed
from lightning_maxtp.inference.coordinator import Run, Slot, start_slot, stop_slots
from lightning_maxtp.inference.plan import Devices, plan_workers
from lightning_maxtp.inference.records import InferencePlan, InferenceStats
from lightning_maxtp.resources.probe import Resources, inspect_resources

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip", "return")
PRECISIONS = ("auto", "32", "fp32", "bf16", "fp16")


class BatchInferencePool:
    """Run ``model_factory()`` in worker processes and map batches of items through it.

    Example::

        with BatchInferencePool(build_model, load=read_image, batch_size=256) as pool:
            for logits in pool.imap(paths):
                ...

    Every input yields exactly one output or one error (with its index): outputs come back in
    input order (``map``, ``imap(ordered=True)``) and a worker that dies is replaced, its batches
    sent again (at most ``max_retries`` times each). Leaving the context stops every worker.

    Args:
        model_factory: Builds the model in each worker (``nn.Module``s are moved to the device
            and put in eval mode). Must be picklable: a module-level function, a class, or a
            ``functools.partial`` of one. The worker imports its module, so keep heavy imports
            (lightning) out of that module's top level if start-up time matters.
        devices: ``"auto"`` (free GPUs, else the CPU), ``"cpu"``, ``"cuda"`` (free GPUs or an
            error), a GPU ordinal or a list of them.
        workers_per_device: Model copies per device; ``"auto"``: from ``model_bytes`` on GPUs
            (``(free - headroom) // model_bytes``, capped at 4; 1 without ``model_bytes``), one
            single-threaded process per core on the CPU (at most 8, then more threads each).
        batch_size: Items per forward call.
        load: Runs on each item in the worker's I/O threads (e.g. read and decode a file).
        preprocess: Runs on each loaded item in the same threads (e.g. resize, to tensor).
        collate: Builds the model's input from a list of items (default: stack tensors).
        io_threads: Threads per worker for ``load``/``preprocess`` (default: the CPU budget).
        precision: ``"auto"`` (bf16 autocast on GPUs that support it, fp32 otherwise),
            ``"32"``/``"fp32"``, ``"bf16"`` or ``"fp16"``. Half outputs come back as float32.
        max_in_flight: Batches taken from the input and not yet returned (default 4 per
            worker): bounds memory for an input of any length.
        on_error: An item whose load/preprocess/forward raises: ``"raise"`` an
            ``InferenceError``, ``"skip"`` it (it is in ``stats.errors``), or ``"return"`` its
            ``ItemError`` in its place.
        max_retries: Times a batch is sent again after its worker died; then its items fail
            with stage ``"worker"``.
        progress: Log items/s per device every few seconds, and the final stats.
        model_bytes: Device memory one worker needs, for ``workers_per_device="auto"``.
        resources: A probe result to plan from (default: ``inspect_resources()``).
        start_timeout_s: Seconds to wait for the first worker to build its model.

    Raises:
        ValueError: For an argument out of range or a callable that cannot be pickled.
    """

    def __init__(
        self,
        model_factory: Callable[[], Any],
        *,
        devices: Devices = "auto",
        workers_per_device: int | str = "auto",
        batch_size: int = 64,
        load: Callable[[Any], Any] | None = None,
        preprocess: Callable[[Any], Any] | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        io_threads: int | None = None,
        precision: str = "auto",
        max_in_flight: int | None = None,
        on_error: str = "raise",
        max_retries: int = 2,
        progress: bool = False,
        model_bytes: int | None = None,
        resources: Resources | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        _check_int("batch_size", batch_size, 1)
        _check_int("max_retries", max_retries, 0)
        if max_in_flight is not None:
            _check_int("max_in_flight", max_in_flight, 1)
        if on_error not in ON_ERROR:
            raise ValueError(f"`on_error` must be one of {ON_ERROR}, got {on_error!r}")
        if str(precision) not in PRECISIONS:
            raise ValueError(f"`precision` must be one of {PRECISIONS}, got {precision!r}")
        if start_timeout_s <= 0:
            raise ValueError(f"`start_timeout_s` must be > 0, got {start_timeout_s!r}")
        config = {
            "model_factory": model_factory,
            "load": load,
            "preprocess": preprocess,
            "collate": collate,
            "precision": str(precision),
        }
        for name, fn in config.items():
            if name != "precision" and fn is not None and not callable(fn):
                raise ValueError(f"`{name}` must be callable or None, got {fn!r}")
            _check_picklable(name, fn)
        self._payload = pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL)
        self.plan: InferencePlan = plan_workers(
            resources or inspect_resources(),
            devices=devices,
            workers_per_device=workers_per_device,
            model_bytes=model_bytes,
            io_threads=io_threads,
        )
        """The workers this pool runs (devices, threads, skipped GPUs)."""
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight or 4 * len(self.plan.workers)
        self.on_error = on_error
        self.max_retries = max_retries
        self.progress = progress
        self.start_timeout_s = start_timeout_s
        self._slots: list[Slot] = []
        self._run: Run | None = None
        self._closed = False
        log.info(prefixed("%s"), self.plan)

    def __enter__(self) -> BatchInferencePool:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(graceful=exc_type is None)

    def start(self) -> None:
        """Start the worker processes (``with`` does this); they build their models meanwhile."""
        if self._closed:
            raise RuntimeError("this BatchInferencePool is closed; create a new one")
        if self._slots:
            return
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        try:
            for worker_id, spec in enumerate(self.plan.workers):
                slot = Slot(worker_id, spec)
                self._slots.append(slot)
                start_slot(context, slot, self._payload)
        except BaseException:
            self.close(graceful=False)
            raise

    def close(self, *, graceful: bool = True) -> None:
        """Stop every worker (``graceful``: ask first, then terminate); safe to call twice."""
        self._closed = True
        if self._run is not None:
            self._run.abandon()
        stop_slots(self._slots, timeout_s=5.0 if graceful else 0.5)

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the running workers, by worker slot."""
        return tuple(s.process.pid for s in self._slots if s.process is not None and s.process.pid)

    @property
    def worker_info(self) -> tuple[dict[str, Any], ...]:
        """What each ready worker reported at start-up (pid, device, threads, autocast...)."""
        return tuple(dict(s.info) for s in self._slots if s.info)

    @property
    def stats(self) -> InferenceStats | None:
        """Statistics of the latest ``map``/``imap`` (live while it runs); None before any."""
        return self._run.stats() if self._run is not None else None

    def map(self, items: Iterable[Any]) -> list[Any]:
        """Outputs for ``items``, in input order (see ``on_error`` for failed items)."""
        return list(self.imap(items, ordered=True))

    def imap(self, items: Iterable[Any], *, ordered: bool = True) -> Iterator[Any]:
        """Stream outputs as batches finish, pulling at most ``max_in_flight`` batches ahead.

        Args:
            items: Any iterable, consumed lazily (a generator of millions of items is fine).
            ordered: Yield in input order; ``False`` yields each output as soon as it is back.
        """
        if self._closed or not self._slots:
            raise RuntimeError(
                "the pool is not running; use `with BatchInferencePool(...) as pool:` "
                "or call pool.start() first"
            )
        if self._run is not None and self._run.active:
            raise RuntimeError(
                "another map/imap of this pool is still running; exhaust or close() its "
                "iterator first"
            )
        iterator = iter(items)
        self._run = Run(
            self._slots,
            self._payload,
            batch_size=self.batch_size,
            max_in_flight=self.max_in_flight,
            on_error=self.on_error,
            max_retries=self.max_retries,
            progress=self.progress,
            start_timeout_s=self.start_timeout_s,
        )
        return self._run.results(iterator, ordered=ordered)


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}")


def _check_picklable(name: str, fn: object) -> None:
    try:
        pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        raise ValueError(
            f"`{name}` must be picklable to reach the spawned worker processes, got {fn!r} "
            f"({type(error).__name__}: {error}); define it as a module-level function (`def`, "
            "not a lambda or a nested function) or pass functools.partial(module_level_fn, ...)"
        ) from error
