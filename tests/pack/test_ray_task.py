"""What a pack Ray task does on its node when something fails, with no Ray instance.

``gpu_memory_bytes`` runs on each GPU node with a fake NVML in place of ``pynvml``; ``_stop``
with a stand-in process tree. The jobs themselves run in ``test_ray_runner.py``.
"""

from __future__ import annotations

import signal
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_maxtp.pack import ray_task
from tests.helpers.fake_nvml import GIB, FakeGpu, FakeNvml, NVMLError, NVMLError_NotSupported


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
    assert ray_task.gpu_memory_bytes() == (40 * GIB, None)
    assert nvml.shutdowns == 1
    monkeypatch.setitem(sys.modules, "pynvml", _ShutdownFails([FakeGpu(total_gib=80)]))
    assert ray_task.gpu_memory_bytes() == (80 * GIB, None)  # a failed shutdown changes nothing


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
    size, reason = ray_task.gpu_memory_bytes()
    assert size is None and reason is not None and reason.startswith(why)


def test_an_error_nvml_does_not_raise_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug is not "this node cannot tell": the task fails and the submitting machine says so.
    nvml = _MemoryFails([FakeGpu()], TypeError("a bug"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with pytest.raises(TypeError, match="a bug"):
        ray_task.gpu_memory_bytes()
    assert nvml.shutdowns == 1


def test_a_failed_sample_still_stops_the_job_then_is_raised() -> None:
    sent: list[signal.Signals] = []

    def sample() -> None:
        raise RuntimeError("a bug in the sampler")

    tree = SimpleNamespace(sample=sample, signal=sent.append)
    ended = SimpleNamespace(code=lambda timeout_s: -15, closed=False)
    with pytest.raises(RuntimeError, match="a bug in the sampler"):
        ray_task._stop(tree, ended)  # type: ignore[arg-type]
    assert sent == [signal.SIGTERM, signal.SIGKILL]


def test_a_worker_that_inherited_sigint_ignored_gets_python_s_handler_back() -> None:
    import signal

    from lightning_maxtp.pack.ray_task import _interruptible

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _interruptible()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        handler = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, own := lambda *_: None)  # a handler someone set: kept
        _interruptible()
        assert signal.getsignal(signal.SIGINT) is own and handler is not own
    finally:
        signal.signal(signal.SIGINT, before)
