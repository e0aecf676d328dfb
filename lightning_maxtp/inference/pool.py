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

import dataclasses
import itertools
import logging
import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from types import TracebackType
from typing import Any

from lightning_maxtp._log import prefixed
from lightning_maxtp.inference.adapt import PROBE_BATCH, Adaptive
from lightning_maxtp.inference.arguments import check_arguments, check_picklable
from lightning_maxtp.inference.coordinator import Run, Slot, stop_slots
from lightning_maxtp.inference.measured import MeasuredRun
from lightning_maxtp.inference.plan import Devices, plan_workers
from lightning_maxtp.inference.records import InferencePlan, InferenceStats
from lightning_maxtp.resources.probe import Resources, inspect_resources

log = logging.getLogger(__name__)


class BatchInferencePool(Adaptive):
    """Run ``model_factory()`` on every usable device and map batches of items through it.

    Example::

        with BatchInferencePool(build_model, load=read_image, batch_size="auto") as pool:
            for logits in pool.imap(paths):
                ...
        print(pool.plan)   # where it ran, the batch size, and why
        print(pool.stats)  # end-to-end and steady items/s

    Every input yields exactly one output or one error (with its index): outputs come back in
    input order (``map``, ``imap(ordered=True)``) and a worker that dies is replaced, its batches
    sent again (at most ``max_retries`` times each). Leaving the context stops every worker.

    Where it runs (``mode="auto"``): on GPUs, one spawned worker process per model copy. On a
    CPU with ``workers_per_device="auto"`` the pool measures instead of guessing: it runs the
    first batches in the calling process (a plain batched loop, loading overlapped), and starts
    worker processes only when the rest of the input is long enough to pay for trying them,
    keeping them only if they are measurably faster (``pool.plan.decisions`` says what it
    measured). So a short job is never slower than a plain loop over the same items.

    Args:
        model_factory: Builds the model in each worker (``nn.Module``s are moved to the device
            and put in eval mode). Must be picklable: a module-level function, a class, or a
            ``functools.partial`` of one. The worker imports its module, so keep heavy imports
            (lightning) out of that module's top level if start-up time matters.
        devices: ``"auto"`` (free GPUs, else the CPU), ``"cpu"``, ``"cuda"`` (free GPUs or an
            error), a GPU ordinal or a list of them.
        workers_per_device: Model copies per device; ``"auto"``: on GPUs from memory (the first
            copy on each GPU measures what it holds after a batch, then ``(free - 2.5 GiB) //
            that`` copies run, at most 4; or from ``model_bytes`` when given), one
            single-threaded process per core on the CPU (at most 8, then more threads each).
        batch_size: Items per forward call, or ``"auto"``: the fastest batch, searched on the
            first items (doubling to the memory ceiling, then the smallest size within 3 % of the
            best items/s, 10 % under the ceiling), reported in ``pool.plan``.
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
        model_bytes: Device memory one worker needs, for ``workers_per_device="auto"`` (skips
            the measurement).
        resources: A probe result to plan from (default: ``inspect_resources()``).
        start_timeout_s: Seconds to wait for the first worker to build its model.
        mode: ``"auto"`` (measured on a CPU, processes on GPUs), ``"processes"`` (always worker
            processes) or ``"inline"`` (always the calling process, on the plan's first device).
        backend: ``"local"`` (this machine) or ``"ray"`` (Ray actors across the cluster
            ``ray.init()`` connected to, or the one ``RAY_ADDRESS`` names (``start()``
            raises a ``ValueError`` in seconds where nothing answers there), or a local one
            it starts; one actor per GPU with
            ``num_gpus=1``, CPU actors without GPUs; needs ``pip install
            'lightning-maxtp[ray]'``). On Ray, ``batch_size="auto"`` keeps the probe size (no
            search yet) and ``progress`` is ignored; ``close()`` stops the actors, not Ray.
        ray_actor_options: Merged over each Ray actor's ``.options(...)`` (``num_cpus``,
            ``resources``, ``scheduling_strategy``, ``runtime_env``...).

    Raises:
        ValueError: For an argument out of range or a callable that cannot be pickled.
    """

    def __init__(
        self,
        model_factory: Callable[[], Any],
        *,
        devices: Devices = "auto",
        workers_per_device: int | str = "auto",
        batch_size: int | str = 64,
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
        mode: str = "auto",
        backend: str = "local",
        ray_actor_options: dict[str, Any] | None = None,
    ) -> None:
        check_arguments(
            batch_size=batch_size,
            max_retries=max_retries,
            max_in_flight=max_in_flight,
            on_error=on_error,
            precision=precision,
            mode=mode,
            backend=backend,
            start_timeout_s=start_timeout_s,
            workers_per_device=workers_per_device,
            io_threads=io_threads,
            model_bytes=model_bytes,
        )
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
            check_picklable(name, fn)
        self._config = config
        self.batch_choice: dict[str, Any] | None = None
        """What ``batch_size="auto"`` measured (``InferenceBatchChoice.to_dict()``), once run."""
        self._io_threads = io_threads
        self._payload = pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL)
        self._ray: Any = None
        self._free: dict[int, int | None] = {}
        self._cores = 1
        self._grow = False
        self._grown: set[str] = set()
        self._auto_batch = batch_size == "auto"
        self.batch_size = PROBE_BATCH if self._auto_batch else int(batch_size)
        """Items per batch now (with ``"auto"``: the probe size until the search has run)."""
        if backend == "ray":
            from lightning_maxtp.inference.ray_backend import RayBackend

            self._ray = RayBackend(
                config,
                devices=devices,
                workers_per_device=workers_per_device,
                io_threads=io_threads,
                max_retries=max_retries,
                actor_options=ray_actor_options,
            )
            self._ray.start_timeout_s = start_timeout_s
            plan = self._ray.plan
        else:
            resources = resources or inspect_resources()
            plan = plan_workers(
                resources,
                devices=devices,
                workers_per_device=workers_per_device,
                model_bytes=model_bytes,
                io_threads=io_threads,
            )
            self._free = {g.index: g.memory_free_bytes for g in resources.gpus}
            self._cores = max(1, resources.cpu.effective)
            cpu_only = plan.devices == ("cpu",)
            if mode == "auto":
                mode = "measured" if cpu_only and workers_per_device == "auto" else "processes"
            gpu_auto = not cpu_only and workers_per_device == "auto" and model_bytes is None
            self._grow = gpu_auto and mode == "processes"
            plan = dataclasses.replace(plan, mode=mode)
        self.plan: InferencePlan = dataclasses.replace(
            plan, batch_size=None if self._auto_batch else self.batch_size
        )
        """What this pool runs (shape, devices, threads, batch size) and what it decided, why."""
        self._shape: str | None = {"inline": "inline", "processes": "processes"}.get(plan.mode)
        self._max_in_flight = max_in_flight
        self.max_in_flight = max_in_flight or 4 * max(1, len(self.plan.workers))
        self.on_error = on_error
        self.max_retries = max_retries
        self.progress = progress
        self.start_timeout_s = start_timeout_s
        self._slots: list[Slot] = []
        self._run: Run | MeasuredRun | None = None
        self._runner: Any = None
        self._build_s = 0.0
        self._started: float | None = None
        self._closed = False
        _announce(self.plan)

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
        """Start the workers (``with`` does this): spawn processes, or build the inline model."""
        if self._closed:
            raise RuntimeError("this BatchInferencePool is closed; create a new one")
        if self._started is not None:
            return
        self._started = time.monotonic()
        try:
            if self._ray is not None:
                self._ray.start()  # the cluster is known now: its actors are the plan
                self.plan = dataclasses.replace(
                    self._ray.plan, batch_size=self.plan.batch_size, mode="ray"
                )
                self.max_in_flight = self._max_in_flight or 4 * max(1, len(self.plan.workers))
            elif self._shape == "processes":
                self._spawn()
            else:
                self._build_inline()
        except BaseException:
            self.close(graceful=False)
            raise

    def close(self, *, graceful: bool = True) -> None:
        """Stop every worker (``graceful``: ask first, then terminate); safe to call twice."""
        self._closed = True
        if isinstance(self._run, Run):
            self._run.abandon()
        stop_slots(self._slots, timeout_s=5.0 if graceful else 0.5)
        if self._runner is not None:
            self._runner.close()
        if self._ray is not None:
            self._ray.close()

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the running workers, by worker slot."""
        return tuple(s.process.pid for s in self._slots if s.process is not None and s.process.pid)

    @property
    def worker_info(self) -> tuple[dict[str, Any], ...]:
        """What each ready worker reported at start-up (pid, device, threads, autocast...)."""
        if self._ray is not None:
            return tuple(self._ray.worker_info)
        inline = (self._runner.info(),) if self._runner is not None else ()
        return inline + tuple(dict(s.info) for s in self._slots if s.info)

    @property
    def stats(self) -> InferenceStats | None:
        """Statistics of the latest ``map``/``imap`` (live while it runs); None before any."""
        if self._ray is not None:
            return self._ray.stats  # type: ignore[no-any-return]
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
        if self._closed or self._started is None:
            raise RuntimeError(
                "the pool is not running; use `with BatchInferencePool(...) as pool:` "
                "or call pool.start() first"
            )
        self._check_idle()
        return self._runs(items, ordered)

    def _check_idle(self) -> None:
        busy = (
            self._run.active
            if isinstance(self._run, Run)
            else (self._run is not None and self._run.finished is None)
        )
        if busy:
            raise RuntimeError(
                "another map/imap of this pool is still running; exhaust or close() its "
                "iterator first"
            )

    def _runs(self, items: Iterable[Any], ordered: bool) -> Iterator[Any]:
        """The generator behind ``imap``: nothing is pulled or built before its first item."""
        self._check_idle()
        # The first run's wait began at start(): its stats count the start-up.
        started, self._started = self._started, 0.0
        started = started or time.monotonic()
        if self._ray is not None:
            yield from self._ray.imap(
                items,
                batch_size=self.batch_size,
                ordered=ordered,
                max_in_flight=self.max_in_flight,
                on_error=self.on_error,
            )
            return
        remaining = len(items) if isinstance(items, Sized) else None
        iterator = iter(items)
        if self._shape == "processes":
            if not self._slots:
                self._spawn()
            run = self._run = self._process_run(0, None, started)
            if self._auto_batch and self.plan.batch_size is None:
                run.search = self._search_options()
            yield from run.results(iterator, ordered=ordered)
            return
        head = None
        if self._auto_batch and self.plan.batch_size is None:
            head = list(zip(itertools.count(), itertools.islice(iterator, PROBE_BATCH)))
            if head:
                self._search_inline(head)
        measured = self._run = MeasuredRun(
            self._runner,
            build_s=self._build_s,
            workers=len(self.plan.workers),
            cores=self._cores,
            remaining=remaining,
            shape=self._shape,
            start_workers=self._spawn,
            stop_workers=self._stop_workers,
            make_run=lambda offset, watch: self._process_run(
                offset, watch, time.monotonic(), progress=False
            ),
            decided=self._decided,
            batch_size=lambda: self.batch_size,
            on_error=self.on_error,
            started=started,
            progress=self.progress,
        )
        yield from measured.results(iterator, ordered=ordered, head=head)

    def _process_run(
        self,
        offset: int,
        watch: Callable[[Run], None] | None,
        started: float,
        *,
        progress: bool | None = None,
    ) -> Run:
        return Run(
            self._slots,
            self._payload,
            batch_size=self.batch_size,
            max_in_flight=self.max_in_flight,
            on_error=self.on_error,
            max_retries=self.max_retries,
            progress=self.progress if progress is None else progress,
            start_timeout_s=self.start_timeout_s,
            offset=offset,
            started=started,
            on_message=self._on_message,
            watch=watch,
        )


def _announce(plan: InferencePlan) -> None:
    """The plan, and each GPU it skipped as a warning: it may be this job's own, misread."""
    log.info(prefixed("%s"), plan)
    where = "on the CPU" if plan.devices == ("cpu",) else "without it"
    for index, reason in plan.skipped_gpus:
        log.warning(prefixed("cuda:%d skipped (%s): the pool runs %s"), index, reason, where)
