"""Capture summaries from a constructed trace, and a real (CPU) profiler run."""

from __future__ import annotations

import pytest

from lightning_maxtp.callbacks import BottleneckMonitor
from lightning_maxtp.observe.capture import KernelCapture, summarize_trace
from tests.helpers import planted

TRACE = [
    {"cat": "kernel", "name": "gemm", "ts": 0, "dur": 5},
    {"cat": "kernel", "name": "relu", "ts": 10, "dur": 5},
    {"cat": "kernel", "name": "add", "ts": 12, "dur": 8},
    {"cat": "kernel", "name": "sum", "ts": 40, "dur": 5},
    {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 1, "dur": 2},
    {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 3, "dur": 2},
    {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 6},
    {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9, "dur": 4},
    {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 30, "dur": 10},
    {"cat": "cuda_runtime", "name": "cudaMemcpy", "ts": 46, "dur": 3},
    {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50},
]


def test_summarize_trace_counts_kernels_idle_copies_and_syncs() -> None:
    s = summarize_trace(TRACE, steps=2, overhead_s=0.5)
    assert s.kernels_per_step == 2.0
    assert s.median_kernel_us == 5.0
    # busy union: [0,5] + [10,20] + [40,45] = 20 us of a 45 us span
    assert s.gpu_idle_share == pytest.approx(1 - 20 / 45)
    assert s.pageable_h2d_per_step == 0.5
    assert s.syncs_per_step == 1.0
    assert s.median_launch_us == 5.0
    assert "2 kernels/step, median kernel 5.0 us, GPU idle 56%" in str(s)
    with pytest.raises(ValueError, match="`steps` must be >= 1, got 0"):
        summarize_trace(TRACE, steps=0)


def test_real_cpu_capture_summarises_without_kernels() -> None:
    import torch

    model = torch.nn.Linear(16, 16)
    capture = KernelCapture(steps=2, baseline_step_s=0.0)
    capture.start()
    for _ in range(2):
        model(torch.randn(4, 16)).sum().backward()
        capture.step()
    assert capture.done
    s = capture.stop()
    assert (s.steps, s.kernels_per_step, s.median_kernel_us, s.gpu_idle_share) == (
        2,
        0.0,
        None,
        None,
    )
    assert s.overhead_s > 0
    with pytest.raises(RuntimeError, match="before start"):
        capture.stop()


def test_monitor_capture_always_attaches_a_summary_to_the_window() -> None:
    monitor = BottleneckMonitor(window_steps=4, capture="always", capture_steps=2, verbose=False)
    planted.fit(*planted.well_fed_job(), [monitor], steps=12)
    assert len(monitor.captures) == 1 and monitor.captures[0].steps == 2
    assert any(w.capture is monitor.captures[0] for w in monitor.windows)
    assert monitor.report.captures == (monitor.captures[0],)
    with pytest.raises(ValueError, match="`capture` must be one of"):
        BottleneckMonitor(capture="sometimes")
