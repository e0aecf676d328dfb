"""A worker's environment is set in the parent around ``start()`` and put back after."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from lightning_maxtp.inference.coordinator import child_environment
from lightning_maxtp.inference.records import WorkerSpec
from lightning_maxtp.resources.gpus import child_visible_id


def _report(queue: multiprocessing.Queue[dict[str, str | None]]) -> None:
    names = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    queue.put({name: os.environ.get(name) for name in names})


def test_a_spawned_child_starts_with_its_gpu_and_threads_and_the_parent_is_put_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "8")
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[dict[str, str | None]] = context.Queue()
    process = context.Process(target=_report, args=(queue,))
    # Spawn re-imports the main module before the target runs: the values must be in the
    # environment the process starts with, not set by the target.
    with child_environment(WorkerSpec("cuda:1", "5", 3, 4)):
        process.start()
    try:
        seen = queue.get(timeout=60)
    finally:
        process.join(timeout=30)
    assert seen == {"CUDA_VISIBLE_DEVICES": "5", "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5" and os.environ["MKL_NUM_THREADS"] == "8"
    assert "OMP_NUM_THREADS" not in os.environ


def test_an_error_in_start_puts_the_environment_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(RuntimeError), child_environment(WorkerSpec("cpu", "", 1, 1)):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
        raise RuntimeError("start failed")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_ray_spec_leaves_the_gpu_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with child_environment(WorkerSpec("cuda:0", None, 2, 2)):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"


@pytest.mark.parametrize(
    ("ordinal", "parent", "child"),
    [(1, "3,5", "5"), (0, " 7 , 2", "7"), (0, "GPU-ab", "GPU-ab"), (2, None, "2"), (0, "", "0")],
)
def test_child_visible_id_maps_an_ordinal_to_the_parents_entry(
    ordinal: int, parent: str | None, child: str
) -> None:
    assert child_visible_id(ordinal, parent) == child
