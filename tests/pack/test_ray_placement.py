"""``maxtp pack --backend ray``'s planning, on fake clusters (``ray.nodes()``-shaped data)."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_maxtp._units import GIB
from lightning_maxtp.pack.ray_placement import cluster_nodes, plan_ray, ray_demands
from lightning_maxtp.pack.spec import JobSpec


def _node(
    name: str, cpus: float, gpus: float = 0, memory_gib: float = 64, alive: bool = True
) -> dict[str, Any]:
    resources: dict[str, Any] = {"CPU": cpus, "memory": memory_gib * GIB, f"node:{name}": 1.0}
    if gpus:
        resources |= {"GPU": gpus, "accelerator_type:H100": 1.0}
    return {"NodeID": name, "Alive": alive, "Resources": resources}


EIGHT_GPUS_ON_TWO_NODES = [_node("a", 32, 4), _node("b", 32, 4), _node("gone", 64, 8, alive=False)]


def test_eight_gpus_on_two_nodes_give_each_job_a_gpu_and_its_cpus() -> None:
    nodes = cluster_nodes(EIGHT_GPUS_ON_TWO_NODES)
    assert [n.node_id for n in nodes] == ["a", "b"]  # the dead node is not counted
    demands = ray_demands([JobSpec(f"python train.py --seed {s}") for s in range(8)], nodes)
    assert all(d.options() == {"num_cpus": 8.0, "num_gpus": 1.0} for d in demands)
    assert [d.name for d in demands][:2] == ["job1", "job2"] and demands[0].threads == 8


def test_declared_gpu_memory_asks_for_a_share_of_one_gpu() -> None:
    nodes = cluster_nodes(EIGHT_GPUS_ON_TWO_NODES)
    jobs = [
        JobSpec("a", gpu_memory_gib=20),  # a quarter of an 80 GiB GPU
        JobSpec("b", gpu_memory_gib=33, cpu_threads=3, memory_gib=16),
        JobSpec("c", gpu_memory_gib=20),  # the GPU's size unknown: a whole GPU
    ]
    quarter, third, _ = ray_demands(jobs, nodes, gpu_bytes=80 * GIB)
    assert quarter.options() == {"num_cpus": 2.0, "num_gpus": 0.25}  # a quarter of 8 CPUs
    assert third.options() == {"num_cpus": 3.0, "num_gpus": 0.42, "memory": 16 * GIB}
    assert ray_demands(jobs, nodes)[2].num_gpus == 1.0


def test_a_cpu_only_cluster_shares_cpus_and_hides_nothing() -> None:
    nodes = cluster_nodes([_node("a", 2), _node("b", 2)])
    plain, threaded = ray_demands([JobSpec("x"), JobSpec("y", cpu_threads=2)], nodes)
    assert plain.options() == {"num_cpus": 1.0, "num_gpus": 0.0} and plain.threads == 1
    assert threaded.num_cpus == 2.0 and threaded.threads == 2


def test_a_job_that_fits_nowhere_is_refused_before_anything_starts() -> None:
    nodes = cluster_nodes(EIGHT_GPUS_ON_TWO_NODES)
    job = JobSpec("python big.py", name="big", cpu_threads=48, where="jobs.json job 3")
    with pytest.raises(ValueError, match=r"^jobs.json job 3 asks for 1 GPU\(s\), 48 CPU\(s\)"):
        ray_demands([JobSpec("ok"), job], nodes)
    with pytest.raises(ValueError, match=r"the largest: 4 GPU\(s\), 32 CPU\(s\), 64.0 GiB"):
        ray_demands([JobSpec("x", memory_gib=100)], nodes)
    with pytest.raises(ValueError, match="`gpu_bytes` must be > 0"):
        ray_demands([JobSpec("x")], nodes, gpu_bytes=0)


def test_a_cluster_without_an_alive_node_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"no alive node with a CPU .*ray start --head"):
        cluster_nodes([_node("gone", 8, alive=False)])


def test_the_plan_fills_in_the_defaults_and_shows_each_task() -> None:
    nodes = cluster_nodes(EIGHT_GPUS_ON_TWO_NODES)
    jobs = [JobSpec("python a.py", name="a"), JobSpec("python b.py", name="b", cpu_threads=1)]
    plan = plan_ray(jobs, nodes, gpu_bytes=80 * GIB, default_gpu_memory_gib=40,
                    default_cpu_threads=4)  # fmt: skip
    assert [j.cpu_threads for j in plan.jobs] == [4, 1]  # a job's own value wins
    assert [d.options() for d in plan.demands] == [{"num_cpus": 4.0, "num_gpus": 0.5},
                                                   {"num_cpus": 1.0, "num_gpus": 0.5}]  # fmt: skip
    text = str(plan).splitlines()
    assert text[0] == "pack plan: 2 jobs as Ray tasks on 2 node(s), 64 CPUs, 8 GPUs"
    assert text[2].split()[:4] == ["job", "num_gpus", "num_cpus", "threads"]
    assert plan.to_dict()["jobs"][0] == {"job": 0, "name": "a", "num_gpus": 0.5, "num_cpus": 4.0,
                                         "memory_bytes": None, "threads": 4,
                                         "command": "python a.py"}  # fmt: skip


@pytest.mark.parametrize(
    ("jobs", "kwargs", "match"),
    [
        ([], {}, r"`jobs` is empty"),
        ([JobSpec("x", name="a"), JobSpec("y", name="a")], {}, r"job names must be unique"),
        ([JobSpec("x")], {"default_cpu_threads": 0}, r"`default_cpu_threads` must be >= 1"),
        ([JobSpec("x")], {"default_gpu_memory_gib": -1}, r"`default_gpu_memory_gib` must be > 0"),
    ],
)
def test_the_plan_refuses_bad_input(jobs: list[JobSpec], kwargs: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_ray(jobs, cluster_nodes(EIGHT_GPUS_ON_TWO_NODES), **kwargs)
