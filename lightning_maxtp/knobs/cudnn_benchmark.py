"""``cudnn_benchmark``: cuDNN times its convolution kernels for these shapes and keeps the fastest.

Same math (it picks among kernels computing the same convolution), so ``allow="safe"`` has it;
process-wide, so it is put back when the fit ends. A deterministic Trainer never tries it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from typing_extensions import override

from lightning_maxtp.knobs.base import BaseKnob, FitView

__all__ = ["CudnnBenchmark"]


class CudnnBenchmark(BaseKnob):
    """``torch.backends.cudnn.benchmark`` (CUDA)."""

    name = "cudnn_benchmark"
    reason = "cuDNN picks the fastest convolution kernels for these shapes"
    changes = "``torch.backends.cudnn.benchmark``, put back when the fit ends"
    preset: ClassVar[Literal["safe", "all"]] = "safe"
    deterministic = False
    devices: ClassVar[frozenset[str] | None] = frozenset({"cuda"})
    tried_for: ClassVar[Mapping[str, int]] = {"compute": 0, "healthy": 0, "kernel_launch": 1}

    def __init__(self) -> None:
        self._was: bool | None = None

    @override
    def current(self, fit: FitView) -> bool:
        import torch

        return bool(torch.backends.cudnn.benchmark)

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        import torch

        if self._was is None:
            self._was = bool(torch.backends.cudnn.benchmark)
        torch.backends.cudnn.benchmark = bool(value)

    @override
    def restore(self, fit: FitView) -> None:
        import torch

        if self._was is not None:
            torch.backends.cudnn.benchmark = self._was
            self._was = None
