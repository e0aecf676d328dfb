"""``backend="ray"``: the pool's batches run on Ray actors, one ``BatchRunner`` in each.

The driver keeps the work queue exactly as the local coordinator does: batches pulled lazily
(at most ``max_in_flight`` outstanding), at most ``PREFETCH`` on an actor (the least loaded gets
the next), outcomes yielded in input order or as they come back. Ray's own restarts and task
retries are off (``max_restarts=0``): a dead actor's batches are sent again by this loop, which
counts them (``stats.retries``) and fails their items with stage ``"worker"`` after
``max_retries``, and a fresh actor takes the dead one's slot. A result is taken only from a
call the run still tracks, so a batch is never yielded twice. Ray is imported inside functions
only: ``import lightning_maxtp.inference`` stays free of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_maxtp._log import prefixed
from lightning_maxtp.inference.arguments import ON_ERROR
from lightning_maxtp.inference.coordinator import PREFETCH, Run, Slot
from lightning_maxtp.inference.plan import Devices
from lightning_maxtp.inference.ray_plan import RayRunner, check_ray_arguments, plan_ray_actors
from lightning_maxtp.inference.records import InferencePlan, InferenceStats
from lightning_maxtp.resources.ray_address import check_ray_address

log = logging.getLogger(__name__)

NEEDS_RAY = "backend='ray' needs Ray: pip install 'lightning-maxtp[ray]'"
START_TIMEOUT_S = 600.0
_POLL_S = 1.0


def _gone(ray: Any) -> tuple[type[Exception], ...]:
    """The errors of ``ray.kill`` and ``ray.cancel`` that say there is nothing left to stop.

    A ``RayError`` (the actor, or Ray itself, is gone), or the ``ValueError`` older Rays raise
    for an actor they no longer know. Anything else is a bug, and is raised.
    """
    return (ray.exceptions.RayError, ValueError)


@dataclass(eq=False)
class _Actor(Slot):
    """A worker slot held by a Ray actor; a fresh actor takes over the slot of a dead one."""

    options: dict[str, Any] = field(default_factory=dict)
    """What ``.options(...)`` gets: the plan's resources, then the caller's ``actor_options``."""
    handle: Any = None
    ready_ref: Any = None
    """The pending ``info()`` call: the actor takes batches once it has returned."""


class RayBackend:
    """The engine of ``BatchInferencePool(backend="ray")``: one Ray actor per model copy.

    Args:
        config: ``model_factory``, ``load``, ``preprocess``, ``collate``, ``precision``.
        devices: ``"auto"`` (GPU actors if the cluster has GPUs, else CPU actors), ``"cpu"``
            or ``"cuda"``; see ``plan_ray_actors``.
        workers_per_device: ``"auto"`` or actors per GPU (fractional ``num_gpus``), or per node
            for CPU actors.
        io_threads: Threads per actor for ``load``/``preprocess``.
        max_retries: Times a batch is sent again after its actor died.
        actor_options: Merged over each actor's ``.options(...)`` (``num_cpus``,
            ``resources``, ``scheduling_strategy``, ``runtime_env``...).

    Raises:
        ImportError: Without Ray installed.
        ValueError: For an argument out of range.
    """

    def __init__(
        self,
        config: dict[str, Any],
        *,
        devices: Devices = "auto",
        workers_per_device: int | str = "auto",
        io_threads: int | None = None,
        max_retries: int = 2,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        try:
            import ray
        except ImportError as error:
            raise ImportError(NEEDS_RAY) from error
        check_ray_arguments(devices, workers_per_device, io_threads)
        if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
            raise ValueError(f"`max_retries` must be an int >= 0, got {max_retries!r}")
        if actor_options is not None and not isinstance(actor_options, Mapping):
            raise ValueError(
                f"`actor_options` must be a dict of Ray actor options or None, got "
                f"{actor_options!r}"
            )
        self.config = dict(config)
        self.devices, self.workers_per_device = devices, workers_per_device
        self.io_threads = io_threads
        self.max_retries = max_retries
        self.actor_options = dict(actor_options or {})
        self.start_timeout_s = START_TIMEOUT_S
        """Seconds the first run waits for an actor to build its model (set before ``imap``)."""
        self._plan: InferencePlan | None = None
        self._options: list[dict[str, Any]] = []
        self._actors: list[_Actor] = []
        self._remote: Any = None
        self._run: _RayRun | None = None
        self._started_at: float | None = None
        self._closed = False
        if ray.is_initialized():
            self._make_plan()

    @property
    def plan(self) -> InferencePlan:
        """One ``WorkerSpec`` per actor (empty, with a note, until Ray is initialised)."""
        if self._plan is None:
            note = "Ray is not initialised yet: the actors are planned when the pool starts"
            return InferencePlan((), notes=(note,), mode="ray")
        return self._plan

    def _make_plan(self) -> None:
        import ray

        self._plan, self._options = plan_ray_actors(
            ray.cluster_resources(),  # type: ignore[no-untyped-call]
            devices=self.devices,
            workers_per_device=self.workers_per_device,
            io_threads=self.io_threads,
        )

    def start(self) -> None:
        """Create the actors (they build their models meanwhile); ``ray.init()`` if needed."""
        if self._closed:
            raise RuntimeError("this Ray backend is closed; create a new pool")
        if self._actors:
            return
        import ray

        if not ray.is_initialized():
            check_ray_address(None)  # a RAY_ADDRESS nobody answers at: an error, not minutes
            log.info(prefixed("Ray is not initialised: ray.init() starts a local Ray instance"))
            ray.init()
        if self._plan is None:
            self._make_plan()
        self._started_at = time.monotonic()
        self._remote = ray.remote(RayRunner)
        try:
            for worker_id, (spec, request) in enumerate(
                zip(self.plan.workers, self._options, strict=True)
            ):
                options = {
                    **request,
                    "max_concurrency": PREFETCH,
                    "max_restarts": 0,
                    "max_task_retries": 0,
                    **self.actor_options,
                }
                self._actors.append(_Actor(worker_id, spec, options))
                self._launch(self._actors[-1])
        except BaseException:
            self.close()
            raise

    def _launch(self, actor: _Actor) -> None:
        actor.handle = self._remote.options(**actor.options).remote(actor.spec, self.config)
        actor.ready_ref = actor.handle.info.remote()
        actor.ready, actor.info, actor.assigned = False, {}, {}

    def close(self) -> None:
        """Kill the actors (their models and any batch they hold); safe to call twice."""
        self._closed = True
        if self._run is not None:
            self._run.abandon()
        live = [a for a in self._actors if a.handle is not None]
        if not live:
            return
        import ray

        for actor in live:
            with contextlib.suppress(*_gone(ray)):  # dead already, or Ray shut down
                ray.kill(actor.handle)
            actor.handle = actor.ready_ref = None
            actor.ready = False

    @property
    def stats(self) -> InferenceStats | None:
        """Statistics of the latest ``imap`` (live while it runs); None before any."""
        return self._run.stats() if self._run is not None else None

    @property
    def worker_info(self) -> tuple[dict[str, Any], ...]:
        """``BatchRunner.info()`` of each ready actor, with its ``node_id`` and ``node_ip``."""
        return tuple(dict(a.info) for a in self._actors if a.info)

    def imap(
        self,
        items: Iterable[Any],
        *,
        batch_size: int,
        ordered: bool,
        max_in_flight: int,
        on_error: str,
    ) -> Iterator[Any]:
        """Outcomes of ``items``, as ``BatchInferencePool.imap`` yields them.

        At most ``max_in_flight`` batches are taken from ``items`` ahead of the caller.
        """
        for name, value in (("batch_size", batch_size), ("max_in_flight", max_in_flight)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be an int >= 1, got {value!r}")
        if on_error not in ON_ERROR:
            raise ValueError(f"`on_error` must be one of {ON_ERROR}, got {on_error!r}")
        if self._closed or not self._actors:
            raise RuntimeError("the Ray backend is not running; call start() first")
        if self._run is not None and self._run.active:
            raise RuntimeError(
                "another map/imap of this pool is still running; exhaust or close() its "
                "iterator first"
            )
        started, self._started_at = self._started_at or time.monotonic(), None
        self._run = _RayRun(self, batch_size, max_in_flight, on_error, started)
        return self._run.results(iter(items), ordered=ordered)


class _RayRun(Run):
    """One ``imap`` on the actors: ``Run``'s pulling, ordering and counting, Ray's transport.

    ``where`` maps each batch call this run waits for to its actor and batch; a call dropped
    from it (its actor died and the batch was sent again) is never read, so no batch is
    collected twice.
    """

    def __init__(
        self,
        backend: RayBackend,
        batch_size: int,
        max_in_flight: int,
        on_error: str,
        started: float,
    ) -> None:
        actors: list[Slot] = list(backend._actors)
        super().__init__(
            actors,
            b"",
            batch_size=batch_size,
            max_in_flight=max_in_flight,
            on_error=on_error,
            max_retries=backend.max_retries,
            progress=False,
            start_timeout_s=backend.start_timeout_s,
            started=started,
        )
        self.backend = backend
        self.actors = backend._actors
        self.where: dict[Any, tuple[_Actor, int]] = {}
        for actor in self.actors:
            actor.assigned = {}  # an abandoned run's calls are not this run's

    def stats(self) -> InferenceStats:
        """Counts so far (final once the run has ended)."""
        return dataclasses.replace(super().stats(), mode="ray")

    def abandon(self) -> None:
        """Forget outstanding batches; calls that have not started yet are cancelled."""
        if self.where:
            import ray

            for ref in self.where:
                with contextlib.suppress(*_gone(ray)):  # finished already, or Ray is gone
                    ray.cancel(ref)
            self.where.clear()
        for actor in self.actors:
            actor.assigned = {}
        super().abandon()

    def _dispatch(self) -> None:
        while self.todo:
            free = [a for a in self.actors if a.ready and len(a.assigned) < PREFETCH]
            if not free:
                return
            actor = min(free, key=lambda a: len(a.assigned))
            batch = self.todo.popleft()
            ref = actor.handle.run.remote(batch.entries)
            actor.assigned[batch.id] = batch
            self.where[ref] = (actor, batch.id)
            self.first_sent = self.first_sent or time.monotonic()

    def _pump(self) -> None:
        import ray

        starting = {a.ready_ref: a for a in self.actors if a.ready_ref is not None}
        waiting = [*self.where, *starting]
        if not waiting:
            time.sleep(0.01)  # every actor is busy with an abandoned run's calls, or starting
        elif ray.wait(waiting, num_returns=1, timeout=_POLL_S)[0]:
            for ref in ray.wait(waiting, num_returns=len(waiting), timeout=0)[0]:
                if ref in self.where:
                    actor, batch_id = self.where[ref]
                elif ref in starting and starting[ref].ready_ref is ref:
                    actor, batch_id = starting[ref], -1
                else:
                    continue  # its actor died meanwhile: the batch was sent again
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayError as error:
                    self._died(actor, error)
                    continue
                if batch_id < 0:
                    actor.info, actor.ready_ref, actor.ready = value, None, True
                else:
                    del self.where[ref]
                    self._collect(actor, batch_id, *value)
        if not any(a.ready for a in self.actors) and (
            time.monotonic() - self.started > self.start_timeout_s
        ):
            raise RuntimeError(
                f"no Ray actor became ready within {self.start_timeout_s:.0f} s; check that "
                "model_factory returns and that the cluster has the resources asked for "
                f"({self.actors[0].options}; ray.cluster_resources() shows what it has)"
            )

    def _died(self, actor: _Actor, error: Exception) -> None:
        """Send the actor's batches again (or fail their items), start a fresh actor."""
        import ray

        if isinstance(error, ray.exceptions.RayActorError) and error.actor_init_failed:
            raise RuntimeError(
                f"Ray actor #{actor.worker_id} ({actor.spec.device}) could not build the model; "
                f"fix model_factory (Ray's error follows)\n{error}"
            ) from error
        if isinstance(error, ray.exceptions.ActorUnschedulableError):
            raise RuntimeError(f"Ray cannot place actor #{actor.worker_id}: {error}") from error
        with contextlib.suppress(*_gone(ray)):  # a call that raised left its actor alive
            ray.kill(actor.handle)
        lines = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {lines[0][:200] if lines else ''}"
        self.where = {ref: where for ref, where in self.where.items() if where[0] is not actor}
        for batch in actor.assigned.values():
            self._retry(batch, f"the Ray actor died ({reason})")
        actor.failures_in_row += 1
        if actor.failures_in_row > self.max_retries + 2:
            actor.handle = actor.ready_ref = None
            actor.ready, actor.assigned = False, {}
            raise RuntimeError(
                f"Ray actor #{actor.worker_id} ({actor.spec.device}) died "
                f"{actor.failures_in_row} times without finishing a batch; last error: {reason}"
            ) from error
        actor.restarts += 1
        log.warning(prefixed("Ray actor #%d died (%s); starting another"), actor.worker_id, reason)
        self.backend._launch(actor)
