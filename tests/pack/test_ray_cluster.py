"""The Ray cluster of `maxtp pack --backend ray`: its address, and the probe of its GPUs' size.

A wrong address fails in seconds, naming what to check. A GPU node that cannot tell its GPU's size
is named in a warning, and jobs get whole GPUs (these tests use a stand-in for Ray, no instance;
``gpu_memory_bytes``, run on each GPU node, a fake NVML in place of ``pynvml``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_maxtp._units import GIB
from lightning_maxtp.pack import JobSpec, ray_cluster
from lightning_maxtp.pack.ray_cluster import plan_ray_pack
from tests.helpers.fake_nvml import FakeGpu, FakeNvml, NVMLError, NVMLError_NotSupported
from tests.helpers.ray_local import closed_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_an_address_where_nothing_listens_fails_in_seconds_naming_it(tmp_path: Path) -> None:
    port = closed_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "lightning_maxtp.cli", "pack", "--backend", "ray",
         "--address", f"127.0.0.1:{port}", "--log-dir", str(tmp_path), "--", "echo a"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"`address` '127.0.0.1:{port}': nothing accepts a connection at 127.0.0.1:{port}" in (
        done.stderr
    )
    assert time.monotonic() - start < 60, "Ray's own retries took over"
    assert not list(tmp_path.iterdir()), "no job started"


# --- the GPU size probe, with a stand-in for Ray (no instance) -------------------------------


class RayError(Exception):
    """Stands in for ``ray.exceptions.RayError``."""


class GetTimeoutError(RayError):
    pass


class RayTaskError(RayError):
    pass


class _Ray:
    """The few calls ``plan_ray_pack`` makes, over GPU nodes that answer the NVML probe as told.

    ``answers`` maps a node id to what its probe returns (``(bytes, why)``), or to the error
    ``ray.get`` raises for it.
    """

    exceptions = SimpleNamespace(
        RayError=RayError, GetTimeoutError=GetTimeoutError, RayTaskError=RayTaskError
    )
    util = SimpleNamespace(
        scheduling_strategies=SimpleNamespace(
            NodeAffinitySchedulingStrategy=lambda node_id, soft: node_id
        )
    )

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def is_initialized(self) -> bool:
        return True

    def nodes(self) -> list[dict[str, Any]]:
        return [
            {"NodeID": node, "Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}}
            for node in self.answers
        ]

    def remote(self, fn: Any) -> Any:
        def options(**kwargs: Any) -> Any:
            return SimpleNamespace(remote=lambda: kwargs["scheduling_strategy"])  # ref: node id

        return SimpleNamespace(options=options)

    def get(self, ref: str, timeout: float) -> Any:
        answer = self.answers[ref]
        if isinstance(answer, BaseException):
            raise answer
        return answer


SHARED = [JobSpec("true", name=f"q{i}", gpu_memory_gib=10) for i in range(2)]


def test_every_node_answering_gives_shares_of_the_smallest_gpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ray = _Ray({"a": (80 * GIB, None), "b": (40 * GIB, None)})
    monkeypatch.setattr(ray_cluster, "import_ray", lambda: ray)
    with caplog.at_level(logging.WARNING, logger="lightning_maxtp"):
        plan = plan_ray_pack(SHARED)
    assert plan.gpu_bytes == 40 * GIB and [d.num_gpus for d in plan.demands] == [0.25, 0.25]
    assert not caplog.records


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ((None, "NVML did not start (NVMLError: Driver Not Loaded)"),
         "NVML did not start (NVMLError: Driver Not Loaded)"),
        (RayTaskError("ValueError: boom\n  the remote traceback"),
         "the probe failed (RayTaskError: ValueError: boom)"),
        (GetTimeoutError("Get timed out"), "no answer within 60 s"),
    ],
    ids=["no-nvml", "probe-raised", "no-answer"],
)  # fmt: skip
def test_a_node_that_cannot_tell_is_named_in_a_warning_and_gpus_stay_whole(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, answer: Any, why: str
) -> None:
    ray = _Ray({"a": (80 * GIB, None), "b": answer})
    monkeypatch.setattr(ray_cluster, "import_ray", lambda: ray)
    with caplog.at_level(logging.WARNING, logger="lightning_maxtp"):
        plan = plan_ray_pack(SHARED)
    assert plan.gpu_bytes is None and [d.num_gpus for d in plan.demands] == [1.0, 1.0]
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith("maxtp: GPU size unknown (node b: ")
    assert f"node b: {why})" in message and "node a" not in message
    assert "get whole GPUs" in message and "--gpu-size-gib" in message


def test_an_error_ray_does_not_raise_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = _Ray({"a": RuntimeError("a bug, not Ray's")})
    monkeypatch.setattr(ray_cluster, "import_ray", lambda: ray)
    with pytest.raises(RuntimeError, match="a bug, not Ray's"):
        plan_ray_pack(SHARED)


# --- gpu_memory_bytes on a node, with a fake NVML ------------------------------------------


class _MemoryFails(FakeNvml):
    def __init__(self, gpus: list[FakeGpu], error: Exception) -> None:
        super().__init__(gpus)
        self.error = error

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        raise self.error


class _ShutdownFails(FakeNvml):
    def nvmlShutdown(self) -> None:
        super().nvmlShutdown()
        raise NVMLError("Uninitialized")


def test_the_smallest_gpu_comes_back_with_no_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([FakeGpu(total_gib=80), FakeGpu(total_gib=40)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert ray_cluster.gpu_memory_bytes() == (40 * GIB, None)
    assert nvml.shutdowns == 1
    monkeypatch.setitem(sys.modules, "pynvml", _ShutdownFails([FakeGpu(total_gib=80)]))
    assert ray_cluster.gpu_memory_bytes() == (80 * GIB, None)  # a failed shutdown changes nothing


@pytest.mark.parametrize(
    ("nvml", "why"),
    [
        (None, "nvidia-ml-py is not installed there ("),
        (
            FakeNvml([], init_error=NVMLError("Driver Not Loaded")),
            "NVML did not start (NVMLError: Driver Not Loaded)",
        ),
        (
            FakeNvml([], init_error=OSError("libnvidia-ml.so.1: cannot open")),
            "NVML did not start (OSError: libnvidia-ml.so.1: cannot open)",
        ),
        (
            _MemoryFails([FakeGpu()], NVMLError_NotSupported()),
            "NVML could not read a GPU's memory (NVMLError_NotSupported: Not Supported)",
        ),
        (FakeNvml([]), "NVML lists no GPU there"),
    ],
    ids=["no-pynvml", "no-driver", "no-library", "memory-unsupported", "no-gpu"],
)
def test_a_node_that_cannot_tell_says_why(
    monkeypatch: pytest.MonkeyPatch, nvml: Any, why: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None: `import pynvml` raises ImportError
    size, reason = ray_cluster.gpu_memory_bytes()
    assert size is None and reason is not None and reason.startswith(why)


def test_an_error_nvml_does_not_raise_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug is not "this node cannot tell": the task fails and the submitting machine says so.
    nvml = _MemoryFails([FakeGpu()], TypeError("a bug"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with pytest.raises(TypeError, match="a bug"):
        ray_cluster.gpu_memory_bytes()
    assert nvml.shutdowns == 1
