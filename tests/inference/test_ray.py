"""The Ray backend on a local two-CPU Ray instance, and its pure placement with made-up clusters.

One Ray instance for the module (starting one costs ~3 s, each actor ~2-3 s: it imports torch).
The shared backend asks for half a CPU per actor, the other tests a quarter, so that the actors
of a test, the shared ones and Ray Data's fit in the instance's two CPUs.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lightning_maxtp.inference import BatchInferencePool, InferenceError, ItemError
from lightning_maxtp.inference.ray_backend import NEEDS_RAY, RayBackend
from lightning_maxtp.inference.ray_plan import RayDataPredictor, plan_ray_actors
from tests.helpers.inference_models import POISON_LOAD, load_vector, make_model, reference
from tests.helpers.ray_local import closed_port, local_ray
from tests.helpers.ray_models import broken_model

ray = pytest.importorskip("ray")

# One worker runs the whole module, so the module's Ray instance starts once (~11 s); its ~45 s
# go out first so that they do not end the parallel pass on one worker.
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BATCH = 4
IN_FLIGHT = 3


def config(factory: Any = make_model, **overrides: Any) -> dict[str, Any]:
    base = {"model_factory": factory, "load": load_vector, "preprocess": None,
            "collate": None, "precision": "auto"}  # fmt: skip
    return {**base, **overrides}


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    with local_ray(num_cpus=2):
        with warnings.catch_warnings():  # Ray Data's context warns about its own old fields
            warnings.simplefilter("ignore", DeprecationWarning)
            context = ray.data.DataContext.get_current()
        context.enable_progress_bars = context.print_on_execution_start = False
        yield


@pytest.fixture(scope="module")
def backend(ray_instance: None) -> Iterator[RayBackend]:
    engine = RayBackend(
        config(), devices="cpu", workers_per_device=2, actor_options={"num_cpus": 0.5}
    )
    engine.start()
    try:
        wait_ready(engine, 2)  # the actors' processes exist before the first test counts them
        yield engine
    finally:
        engine.close()


def imap(engine: RayBackend, items: Any, *, ordered: bool = True, on_error: str = "raise") -> Any:
    return engine.imap(
        items, batch_size=BATCH, ordered=ordered, max_in_flight=IN_FLIGHT, on_error=on_error
    )


def assert_matches(outputs: list[torch.Tensor], items: list[int]) -> None:
    expected = reference(items)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(got, want)


def wait_ready(engine: RayBackend, count: int, timeout_s: float = 60.0) -> None:
    """Run tiny batches until ``count`` actors have reported (an actor is sent work once ready)."""
    deadline = time.monotonic() + timeout_s
    while len(engine.worker_info) < count:
        assert time.monotonic() < deadline, f"only {len(engine.worker_info)} actor(s) ready"
        list(imap(engine, [0]))
        time.sleep(0.2)


# The placement, pure: ray.cluster_resources()-shaped dicts.

GPU_NODE = {"CPU": 64.0, "GPU": 8.0, "memory": 5e11, "node:10.0.0.1": 1.0,
            "node:__internal_head__": 1.0}  # fmt: skip


def test_plan_one_actor_per_gpu() -> None:
    plan, options = plan_ray_actors(GPU_NODE)
    assert plan.mode == "ray"
    assert [w.device for w in plan.workers] == [f"cuda:{i}" for i in range(8)]
    assert all(w.cuda_visible_devices is None for w in plan.workers)  # Ray sets it per actor
    assert options == [{"num_gpus": 1.0, "num_cpus": 1.0}] * 8
    assert plan.workers[0].io_threads == 7  # (64 - 8) // 8 cores each for load/preprocess
    assert "1 node(s), 64 CPU(s), 8 GPU(s)" in plan.notes[0]


def test_plan_shares_gpus_with_fractional_requests() -> None:
    plan, options = plan_ray_actors(GPU_NODE, workers_per_device=2)
    assert len(plan.workers) == 16 and {o["num_gpus"] for o in options} == {0.5}
    assert [w.device for w in plan.workers][:4] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    _, thirds = plan_ray_actors({"CPU": 2.0, "GPU": 1.0}, workers_per_device=3)
    assert sum(o["num_gpus"] for o in thirds) <= 1.0  # all three fit on the one GPU
    assert all(o["num_cpus"] == pytest.approx(0.6666) for o in thirds)  # 2 CPUs for 3 actors


def test_plan_cpu_actors_without_gpus_or_when_asked() -> None:
    plan, options = plan_ray_actors({"CPU": 6.0, "node:10.0.0.2": 1.0})
    assert [w.device for w in plan.workers] == ["cpu"] * 6
    assert {w.torch_threads for w in plan.workers} == {1} and options == [{"num_cpus": 1.0}] * 6
    plan, options = plan_ray_actors({"CPU": 16.0, "GPU": 2.0}, devices="cpu")
    assert [w.device for w in plan.workers] == ["cpu"] * 8  # at most 8, 2 threads each
    assert options == [{"num_cpus": 2.0}] * 8 and plan.workers[0].torch_threads == 2
    two_nodes = {"CPU": 8.0, "node:10.0.0.3": 1.0, "node:10.0.0.4": 1.0}
    assert len(plan_ray_actors(two_nodes)[0].workers) == 8  # 4 per node
    assert len(plan_ray_actors(two_nodes, workers_per_device=2)[0].workers) == 4  # 2 per node
    plan, options = plan_ray_actors({"CPU": 2.0}, workers_per_device=4)
    assert options == [{"num_cpus": 0.5}] * 4 and "oversubscribed" in plan.notes[-1]


@pytest.mark.parametrize(
    ("kwargs", "cluster", "named"),
    [
        ({"devices": 0}, GPU_NODE, "devices"),
        ({"devices": [0, 1]}, GPU_NODE, "devices"),
        ({"devices": "tpu"}, GPU_NODE, "devices"),
        ({"devices": "cuda"}, {"CPU": 4.0}, "devices='cuda'"),
        ({"workers_per_device": 0}, GPU_NODE, "workers_per_device"),
        ({"workers_per_device": "many"}, GPU_NODE, "workers_per_device"),
        ({"io_threads": 0}, GPU_NODE, "io_threads"),
        ({}, {"CPU": 0.0}, "cluster"),
    ],
)
def test_plan_rejects_bad_values(kwargs: Any, cluster: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=f"`{named}"):
        plan_ray_actors(cluster, **kwargs)


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"needs Ray: pip install 'lightning-maxtp\[ray\]'"):
        RayBackend(config())
    with pytest.raises(ImportError) as caught:
        BatchInferencePool(make_model, backend="ray")
    assert str(caught.value) == NEEDS_RAY


def test_backend_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="`max_retries`"):
        RayBackend(config(), max_retries=-1)
    with pytest.raises(ValueError, match="`actor_options`"):
        RayBackend(config(), actor_options=["num_cpus"])  # type: ignore[arg-type]


# On a local Ray instance.


def test_ordered_outputs_equal_the_reference(backend: RayBackend) -> None:
    items = list(range(50))
    assert_matches(list(imap(backend, items)), items)
    stats = backend.stats
    assert stats is not None and stats.mode == "ray"
    assert (stats.items, stats.outputs, stats.errors, stats.retries) == (50, 50, (), 0)
    assert sum(w.items for w in stats.workers) == 50 and stats.per_device == {"cpu": 50}
    assert 0 < stats.startup_s <= stats.elapsed_s and stats.steady_items <= 50
    info = backend.worker_info[0]
    assert info["device"] == "cpu" and info["torch_threads"] == 1 and info["node_id"]
    assert not info["lightning_imported"]
    assert backend.plan.mode == "ray" and len(backend.plan.workers) == 2


def test_unordered_outputs_are_a_permutation(backend: RayBackend) -> None:
    items = list(range(100, 137))
    unordered = list(imap(backend, iter(items), ordered=False))
    expected = reference(items)
    matched = sorted(
        next(j for j, want in enumerate(expected) if torch.allclose(got, want)) for got in unordered
    )
    assert matched == list(range(len(items)))  # nothing lost, nothing twice


def test_on_error_policies(backend: RayBackend) -> None:
    items: list[Any] = [0, 1, POISON_LOAD, 3, -5, 6, 7]
    returned = list(imap(backend, items, on_error="return"))
    errors = {i: v for i, v in enumerate(returned) if isinstance(v, ItemError)}
    assert {i: e.stage for i, e in errors.items()} == {2: "load", 4: "forward"}
    assert errors[2].error_type == "OSError" and "bad-load" in errors[2].item_repr
    good = [i for i in items if i not in (POISON_LOAD, -5)]
    assert_matches([v for v in returned if not isinstance(v, ItemError)], good)
    assert_matches(list(imap(backend, items, on_error="skip")), good)
    stats = backend.stats
    assert stats is not None and [e.index for e in stats.errors] == [2, 4]
    got: list[Any] = []
    with pytest.raises(InferenceError) as caught:
        got.extend(imap(backend, items))
    assert caught.value.error.index == 2 and len(got) == 2  # items 0 and 1 came first


def test_endless_input_is_pulled_lazily(backend: RayBackend) -> None:
    pulled = 0

    def endless() -> Iterator[int]:
        nonlocal pulled
        for i in itertools.count():
            pulled += 1
            yield i % 50

    stream = imap(backend, endless())
    outputs = list(itertools.islice(stream, 30))
    assert pulled <= 30 + (IN_FLIGHT + 1) * BATCH
    stream.close()  # abandons the run: its calls in flight are dropped
    assert_matches(outputs, list(range(30)))
    assert_matches(list(imap(backend, range(5))), list(range(5)))  # the next run is clean


def test_killed_actor_loses_and_duplicates_nothing(ray_instance: None) -> None:
    engine = RayBackend(
        config(functools.partial(make_model, 0.2)), devices="cpu", workers_per_device=2,
        actor_options={"num_cpus": 0.25},
    )  # fmt: skip
    engine.start()
    try:
        wait_ready(engine, 2)
        items = list(range(40))
        outputs: list[Any] = []
        killed: list[int] = []
        for output in imap(engine, items):
            outputs.append(output)
            if not killed:  # both actors hold batches now, one of them mid-forward
                killed.append(engine.worker_info[0]["pid"])
                os.kill(killed[0], signal.SIGKILL)
        assert_matches(outputs, items)
        stats = engine.stats
        assert stats is not None and stats.retries >= 1 and stats.errors == ()
        assert stats.outputs == 40 and sum(w.items for w in stats.workers) == 40
        assert sum(w.restarts for w in stats.workers) == 1
        assert killed[0] not in [info["pid"] for info in engine.worker_info]
        # Without retries the dead actor's items fail instead, each exactly once.
        engine.max_retries = 0
        wait_ready(engine, 2)
        returned: list[Any] = []
        for output in imap(engine, items, on_error="return"):
            returned.append(output)
            if len(returned) == 1:
                os.kill(engine.worker_info[0]["pid"], signal.SIGKILL)
        failed = [v for v in returned if isinstance(v, ItemError)]
        assert len(returned) == 40 and failed
        assert {(e.stage, e.error_type) for e in failed} == {("worker", "WorkerDied")}
        assert sorted(e.index for e in failed) == [e.index for e in engine.stats.errors]  # type: ignore[union-attr]
    finally:
        engine.close()
        engine.close()  # safe twice


def test_a_model_that_cannot_be_built_fails_the_run(ray_instance: None) -> None:
    engine = RayBackend(
        config(broken_model), devices="cpu", workers_per_device=1,
        actor_options={"num_cpus": 0.25},
    )  # fmt: skip
    engine.start()
    try:
        with pytest.raises(RuntimeError, match="could not build the model"):
            list(imap(engine, range(4)))
    finally:
        engine.close()


def test_the_pool_runs_on_ray(ray_instance: None) -> None:
    with BatchInferencePool(
        make_model, backend="ray", devices="cpu", workers_per_device=1, load=load_vector,
        batch_size=BATCH,
    ) as pool:  # fmt: skip
        assert pool.plan.mode == "ray" and len(pool.plan.workers) == 1
        items = list(range(10))
        assert_matches(pool.map(items), items)
        assert pool.stats is not None and pool.stats.mode == "ray"


def test_a_ray_address_nobody_answers_at_fails_the_start_in_seconds() -> None:
    # In a fresh interpreter: this module's Ray is initialised, and the check runs before init.
    port = closed_port()
    code = (
        "from lightning_maxtp.inference import BatchInferencePool\n"
        "from tests.helpers.inference_models import load_vector, make_model\n"
        "try:\n"
        "    BatchInferencePool(make_model, backend='ray', devices='cpu', load=load_vector,\n"
        "                       batch_size=4).start()\n"
        "except ValueError as err:\n"
        "    print(err)\n"
    )
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
        check=False,
    )  # fmt: skip
    assert f"RAY_ADDRESS '127.0.0.1:{port}': nothing accepts a connection" in done.stdout, (
        done.stdout + done.stderr
    )
    assert time.monotonic() - start < 60, "Ray's own retries took over"


def _rows(dataset: Any) -> dict[int, dict[str, Any]]:
    return {row["item"]: row for row in dataset.take_all()}


@pytest.fixture(scope="module")
def ray_data_rows(ray_instance: None) -> tuple[dict[int, Any], dict[int, Any]]:
    """Rows of two ``map_batches`` runs: default, and ``on_error="return"`` with a bad item.

    Module-scoped on purpose: Ray Data's first run starts actors that live as long as Ray
    (its stats actor, actor-location tracker, autoscaling coordinator), not leaks of a test.
    """
    kwargs = {"model_factory": make_model, "load": load_vector}
    ran = [
        ray.data.from_items([{"item": i} for i in items]).map_batches(
            RayDataPredictor, fn_constructor_kwargs=kwargs | extra, batch_size=8,
            compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.25,
        )
        # Batches of 8: the failed item's batch and a clean one must join into one dataset.
        for items, extra in ((range(20), {}), ([0, -3, *range(2, 12)], {"on_error": "return"}))
    ]  # fmt: skip
    return _rows(ran[0]), _rows(ran[1])


def test_ray_data_predictor_matches_the_reference(ray_data_rows: Any) -> None:
    rows = ray_data_rows[0]
    assert sorted(rows) == list(range(20))
    assert_matches([torch.tensor(rows[i]["output"]) for i in range(20)], list(range(20)))


def test_ray_data_predictor_returns_errors_in_a_column(ray_data_rows: Any) -> None:
    rows = ray_data_rows[1]
    assert np.isnan(rows[-3]["output"]).all() and "failed in forward" in rows[-3]["error"]
    assert rows[-3]["output"].shape == rows[0]["output"].shape  # one schema for every batch
    assert rows[0]["error"] == "" and rows[2]["error"] == ""
    assert_matches([torch.tensor(rows[i]["output"]) for i in (0, 2)], [0, 2])
