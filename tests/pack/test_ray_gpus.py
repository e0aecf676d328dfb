"""``maxtp pack --backend ray`` with GPUs: Ray's logical GPUs on a CPU machine (``num_gpus=2``).

Ray assigns GPU ids to tasks as it would on a GPU node; the job sees them in
``CUDA_VISIBLE_DEVICES``. No CUDA runs: nothing here needs a real GPU.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lightning_maxtp.pack import JobSpec, run_jobs
from lightning_maxtp.pack.ray_cluster import plan_ray_pack
from tests.helpers.ray_local import local_ray
from tests.pack.test_runner import OOM_ONCE

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.slow]

PY = sys.executable
SHOW_GPU = "import os; print('gpu', repr(os.environ['CUDA_VISIBLE_DEVICES']), flush=True)"


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[Any]:
    with local_ray(num_cpus=2, num_gpus=2) as context:
        yield context


def test_each_job_sees_the_gpu_ray_gave_it(gpu_cluster: Any, tmp_path: Path) -> None:
    jobs = [JobSpec((PY, "-c", SHOW_GPU), name=f"g{i}") for i in range(2)]
    result = run_jobs(jobs, backend="ray", log_dir=tmp_path)
    assert [j.status for j in result.jobs] == ["ok", "ok"]
    for job in result.jobs:
        text = Path(job.log_path or "").read_text()
        assert "# ray_task: num_cpus=1, num_gpus=1" in text  # 2 CPUs for 2 GPUs
        assert f"gpu '{job.gpu}'" in text and job.gpu in (0, 1)


def test_declared_memory_asks_for_a_share_of_a_gpu(gpu_cluster: Any, tmp_path: Path) -> None:
    jobs = [JobSpec((PY, "-c", SHOW_GPU), name=f"q{i}", gpu_memory_gib=10) for i in range(2)]
    plan = plan_ray_pack(jobs, gpu_size_gib=40)
    assert [d.num_gpus for d in plan.demands] == [0.25, 0.25]
    assert plan.to_dict()["gpu_bytes"] == 40 * 2**30
    result = run_jobs(jobs, backend="ray", log_dir=tmp_path, gpu_size_gib=40)
    for job in result.jobs:
        text = Path(job.log_path or "").read_text()
        assert "num_gpus=0.25" in text and f"gpu '{job.gpu}'" in text
    # Without the GPU's size Ray cannot tell it (NVML on the node has no GPU here): whole GPUs.
    assert [d.num_gpus for d in plan_ray_pack(jobs).demands] == [1.0, 1.0]


def test_an_oom_is_rerun_with_a_whole_gpu(gpu_cluster: Any, tmp_path: Path) -> None:
    job = JobSpec((PY, "-c", OOM_ONCE, str(tmp_path / "marker")), name="big", gpu_memory_gib=10)
    result = run_jobs(
        [job], backend="ray", log_dir=tmp_path / "logs", gpu_size_gib=40, retry_oom=True
    )
    big = result.jobs[0]
    assert (big.status, big.exit_code, big.attempts) == ("ok", 0, 2)
    assert big.earlier[0].startswith("out of GPU memory on ")
    assert "num_gpus=1" in Path(big.log_path or "").read_text()
    assert "num_gpus=0.25" in (tmp_path / "logs" / "01-big.log").read_text()
    fresh = JobSpec((PY, "-c", OOM_ONCE, str(tmp_path / "fresh")), name="big")
    without = run_jobs([fresh], backend="ray", log_dir=tmp_path / "again")
    assert (without.jobs[0].status, without.jobs[0].attempts, without.exit_code) == ("oom", 1, 1)
