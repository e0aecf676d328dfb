"""The Ray side of inference: which actors start, what runs in them, the Ray Data predictor.

``plan_ray_actors`` is pure (``ray.cluster_resources()`` in, the plan out), so the placement is
tested with made-up clusters. Ray, not the driver, decides where an actor runs and which GPU it
gets (it sets the actor's ``CUDA_VISIBLE_DEVICES``), so the plan is counts and resource requests:
one actor per GPU (or ``workers_per_device`` actors sharing it through fractional ``num_gpus``),
else CPU actors per node. ``RayRunner`` is the body of a ``RayBackend`` actor and
``RayDataPredictor`` a ``Dataset.map_batches`` class; both wrap one ``BatchRunner``. Nothing here
imports ray or torch at module level.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from lightning_maxtp._checks import COUNT, refuse_bool
from lightning_maxtp._log import prefixed
from lightning_maxtp.inference.arguments import ON_ERROR, PRECISIONS
from lightning_maxtp.inference.plan import CPU_THREADS_PER_WORKER, Devices, _cpu_plan
from lightning_maxtp.inference.records import InferenceError, InferencePlan, WorkerSpec
from lightning_maxtp.inference.runner import BatchRunner, Entries, Outcome

log = logging.getLogger(__name__)

RAY_DEVICES = ("auto", "cpu", "cuda")
_HEAD = "node:__internal_head__"


def plan_ray_actors(
    cluster: Mapping[str, float],
    *,
    devices: Devices = "auto",
    workers_per_device: int | str = "auto",
    io_threads: int | None = None,
) -> tuple[InferencePlan, list[dict[str, Any]]]:
    """The actors for a Ray cluster, and each one's Ray resource request.

    GPUs (``devices="auto"`` when the cluster has any, or ``"cuda"``): ``workers_per_device``
    actors per GPU (``"auto"``: one), each asking for ``num_gpus=1/k``; their specs are
    ``cuda:<n>``, ``n`` numbering the cluster's GPUs (Ray picks the physical one). A GPU actor
    asks for one CPU (less when the cluster has fewer CPUs than actors): asking for its whole
    share of the cluster's cores could make it unschedulable on a GPU node with few cores,
    since ``cluster_resources()`` does not say how the cores are spread over nodes. Its I/O
    threads still come from that share.

    CPU (``devices="cpu"``, or ``"auto"`` without GPUs): on each node, ``workers_per_device``
    actors (``"auto"``: one single-threaded actor per core up to 8, as the local pool does),
    each asking for ``num_cpus`` equal to its torch threads; nodes are taken as equal (the
    cluster's CPUs divided by its ``node:<ip>`` entries).

    Args:
        cluster: ``ray.cluster_resources()``: ``{"CPU": 64.0, "GPU": 8.0, "node:10.0.0.1": 1.0,
            ...}``.
        devices: ``"auto"``, ``"cpu"`` or ``"cuda"`` (Ray places actors itself, so GPU
            ordinals cannot be chosen).
        workers_per_device: ``"auto"`` or actors per GPU (per node on the CPU).
        io_threads: Threads per actor for ``load``/``preprocess`` (default: its CPU share).

    Returns:
        The plan (``mode="ray"``, one ``WorkerSpec`` per actor) and, in the same order, the
        options for ``ActorClass.options(...)``: ``{"num_cpus": ..., "num_gpus": ...}``.

    Raises:
        ValueError: For a malformed argument, ``devices="cuda"`` on a cluster without GPUs,
            or a cluster without CPUs.
    """
    check_ray_arguments(devices, workers_per_device, io_threads)
    cpus = float(cluster.get("CPU", 0.0))
    gpus = int(cluster.get("GPU", 0.0))  # a fraction of a GPU left over cannot hold an actor
    nodes = max(1, sum(1 for key in cluster if key.startswith("node:") and key != _HEAD))
    notes = [f"ray cluster: {nodes} node(s), {cpus:g} CPU(s), {gpus} GPU(s)"]
    if devices == "cuda" and gpus == 0:
        raise ValueError(
            "`devices='cuda'` but the Ray cluster has no GPU "
            f"(cluster_resources: CPU={cpus:g}, GPU={cluster.get('GPU', 0)}); start Ray on GPU "
            "nodes, or pass devices='auto' or devices='cpu'"
        )
    if devices == "cpu" or gpus == 0:
        return _cpu_actors(cpus, nodes, workers_per_device, io_threads, notes)
    per_gpu = 1 if workers_per_device == "auto" else int(workers_per_device)
    total = gpus * per_gpu
    share = cpus / total
    budget = max(1, int((cpus - total) // total))  # the cores left after one per actor
    threads = max(1, min(CPU_THREADS_PER_WORKER, budget // 4))
    workers = tuple(
        WorkerSpec(f"cuda:{index}", None, threads, io_threads or budget)
        for index in range(gpus)
        for _ in range(per_gpu)
    )
    options = {"num_gpus": _floor4(1 / per_gpu), "num_cpus": min(1.0, _floor4(share))}
    return _plan(workers, notes), [dict(options) for _ in workers]


def check_ray_arguments(
    devices: Devices, workers_per_device: int | str, io_threads: int | None
) -> None:
    """Raise ``ValueError`` for arguments ``plan_ray_actors`` cannot plan from, in any cluster."""
    if not (isinstance(devices, str) and devices in RAY_DEVICES):
        raise ValueError(
            f"`devices` must be one of {RAY_DEVICES} with backend='ray', got {devices!r}: Ray "
            "places the actors itself, so GPU ordinals cannot be chosen (pass 'cuda', and "
            "start Ray with the GPUs it may use)"
        )
    if not (workers_per_device == "auto" or _positive_int(workers_per_device)):
        raise ValueError(
            f"`workers_per_device` must be 'auto' or an int >= 1, got {workers_per_device!r}"
        )
    if io_threads is not None and not _positive_int(io_threads):
        raise ValueError(f"`io_threads` must be None or an int >= 1, got {io_threads!r}")


def _cpu_actors(
    cpus: float,
    nodes: int,
    workers_per_device: int | str,
    io_threads: int | None,
    notes: list[str],
) -> tuple[InferencePlan, list[dict[str, Any]]]:
    if cpus <= 0:
        raise ValueError(
            "`cluster` has no CPU for CPU actors (ray.cluster_resources() shows CPU=0); start "
            "Ray with CPUs, e.g. ray.init(num_cpus=4)"
        )
    cores = max(1, int(cpus // nodes))
    node = _cpu_plan(cores, workers_per_device, io_threads)
    actors = len(node.workers)
    # Oversubscribed on purpose (more actors than cores): ask for a share of a core each, or
    # the actors past the core count would wait for resources for ever.
    num_cpus = float(node.workers[0].torch_threads) if actors <= cores else _floor4(cores / actors)
    workers = node.workers * nodes
    return _plan(workers, notes + list(node.notes)), [{"num_cpus": num_cpus} for _ in workers]


def _plan(workers: tuple[WorkerSpec, ...], notes: list[str]) -> InferencePlan:
    return InferencePlan(workers, (), tuple(notes), mode="ray")


def _floor4(value: float) -> float:
    """``value`` rounded down to Ray's resource precision (1e-4): ``3 x 1/3`` must fit in 1."""
    return math.floor(value * 10_000) / 10_000


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class RayRunner:
    """The body of one Ray actor: the model is built once, in ``__init__``.

    ``RayBackend`` lets two calls run at once (``max_concurrency=PREFETCH``): the second
    batch's items load on the I/O threads while the first one's forward holds the lock.
    """

    def __init__(self, spec: WorkerSpec, config: Mapping[str, Any]) -> None:
        if spec.cuda_visible_devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices  # before CUDA starts
        self.runner = BatchRunner(spec, config)
        self.lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        """``BatchRunner.info()`` plus where Ray put this actor."""
        import ray

        context = ray.get_runtime_context()
        return {
            **self.runner.info(),
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "actor_id": context.get_actor_id(),
        }

    def run(self, entries: Entries) -> Outcome:
        """One batch: ``(index, output)`` pairs and the ``ItemError``s."""
        futures = self.runner.submit(entries)
        with self.lock:
            return self.runner.complete(self.runner.launch(0, entries, futures))


class RayDataPredictor:
    """``BatchRunner`` as a Ray Data ``map_batches`` class: one model copy per Ray Data actor.

    Example::

        ds = ray.data.read_parquet("s3://bucket/paths/")
        ds = ds.map_batches(
            RayDataPredictor,
            fn_constructor_kwargs={"model_factory": build_model, "load": read_image},
            batch_size=256, compute=ray.data.ActorPoolStrategy(size=2), num_gpus=1,
        )  # before Ray 2.51: concurrency=2 instead of compute=...

    A batch (``batch_format="numpy"``, Ray Data's default: a dict of column arrays) keeps its
    columns and gains ``output_column``: stacked into one tensor column when every output is an
    array of one shape and dtype, else an object column (dict outputs, ragged shapes). An item
    whose ``load``, ``preprocess`` or forward raises: ``on_error="raise"`` raises
    ``InferenceError`` (Ray Data then fails the dataset), ``"skip"`` drops its row (with a
    warning), ``"return"`` keeps it with the error in ``error_column`` (``""`` on rows that
    worked) and, as output, NaNs shaped like the batch's other outputs when they are float
    arrays (so every batch's output column has one schema), else ``None``.
    An error's ``index`` is the row's position in its batch.

    Args:
        model_factory: Builds the model, once per actor (on ``cuda:0`` when Ray gave the actor
            a GPU, else on the CPU).
        load: Runs on each item on the I/O threads.
        preprocess: Runs on each loaded item on the same threads.
        collate: Builds the model's input from a list of items (default: stack tensors).
        precision: As ``BatchInferencePool``'s.
        item_column: The column holding the items.
        output_column: The column the outputs go to.
        error_column: The column of error texts with ``on_error="return"``.
        on_error: ``"raise"``, ``"skip"`` or ``"return"``.
        io_threads: Threads for ``load``/``preprocess`` (default: the actor's CPUs).

    Raises:
        ValueError: For an unknown ``on_error`` or ``precision``.
    """

    def __init__(
        self,
        model_factory: Callable[[], Any],
        *,
        load: Callable[[Any], Any] | None = None,
        preprocess: Callable[[Any], Any] | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        precision: str = "auto",
        item_column: str = "item",
        output_column: str = "output",
        error_column: str = "error",
        on_error: str = "raise",
        io_threads: int | None = None,
    ) -> None:
        import ray
        import torch

        if on_error not in ON_ERROR:
            raise ValueError(f"`on_error` must be one of {ON_ERROR}, got {on_error!r}")
        if str(precision) not in PRECISIONS:
            raise ValueError(f"`precision` must be one of {PRECISIONS}, got {precision!r}")
        refuse_bool("io_threads", io_threads, f"{COUNT} >= 1 or None", 4)
        inside = ray.is_initialized()
        context = ray.get_runtime_context() if inside else None
        cpus = context.get_assigned_resources().get("CPU", 1.0) if context else 1  # type: ignore[no-untyped-call]
        threads = max(1, int(cpus))
        cuda = inside and bool(ray.get_gpu_ids()) and torch.cuda.is_available()
        spec = WorkerSpec("cuda:0" if cuda else "cpu", None, threads, io_threads or threads)
        config = {
            "model_factory": model_factory,
            "load": load,
            "preprocess": preprocess,
            "collate": collate,
            "precision": str(precision),
        }
        self.runner = BatchRunner(spec, config)
        self.item_column, self.output_column = item_column, output_column
        self.error_column, self.on_error = error_column, on_error

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch's columns plus the output column (and the error column, see ``on_error``)."""
        import numpy as np

        if self.item_column not in batch:
            raise ValueError(
                f"`item_column={self.item_column!r}` is not a column of the batch (columns: "
                f"{list(batch)}); pass item_column=<the column holding the items>"
            )
        column = batch[self.item_column]
        # One value per row: Python scalars from a 1-D column, arrays from a tensor column.
        items = column.tolist() if getattr(column, "ndim", 1) == 1 else list(column)
        outputs, errors = self.runner.run(list(enumerate(items)))
        if errors and self.on_error == "raise":
            raise InferenceError(min(errors, key=lambda e: e.index))
        done = dict(outputs)
        if self.on_error == "return":
            failed = {e.index: str(e) for e in errors}
            rows = range(len(items))
            # A failed row holds NaNs shaped like the others, so every batch's output column has
            # one type (Ray Data refuses to join object and tensor blocks).
            good = [_to_numpy(v) for v in done.values()]
            fill = None
            if good and isinstance(good[0], np.ndarray) and good[0].dtype.kind == "f":
                fill = np.full_like(good[0], np.nan)
            return {
                **batch,
                self.output_column: _column([done.get(i, fill) for i in rows]),
                self.error_column: np.array([failed.get(i, "") for i in rows], dtype=str),
            }
        if not errors:
            return {**batch, self.output_column: _column([done[i] for i, _ in outputs])}
        log.warning(prefixed("skipped %d item(s) of a batch: first %s"), len(errors), errors[0])
        keep = sorted(done)
        kept = {name: np.asarray(values)[keep] for name, values in batch.items()}
        return {**kept, self.output_column: _column([done[i] for i in keep])}


def _column(values: list[Any], *, stack: bool = True) -> Any:
    """A numpy column of ``values``: stacked when they are arrays of one shape, else objects."""
    import numpy as np

    rows = [_to_numpy(value) for value in values]
    same = len({(r.shape, r.dtype) for r in rows if isinstance(r, np.ndarray)}) == 1
    if stack and rows and same and all(isinstance(r, np.ndarray) for r in rows):
        return np.stack(rows)
    column = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):  # item by item: a slice assignment would broadcast arrays
        column[i] = row
    return column


def _to_numpy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {key: _to_numpy(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_numpy(v) for v in value)
    return value
