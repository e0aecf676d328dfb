"""``tf32``: TF32 matmuls and convolutions on CUDA tensor cores (rounds fp32 inputs to 10 bits).

``torch.set_float32_matmul_precision("high")`` and cuDNN's TF32 flag; both are process-wide, so
they are put back when the fit ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from typing_extensions import override

from lightning_maxtp.knobs.base import BaseKnob, FitView

__all__ = ["Tf32"]


class Tf32(BaseKnob):
    """TF32 matmuls and convolutions (CUDA)."""

    name = "tf32"
    reason = "TF32 matmuls and convolutions on tensor cores"
    changes = (
        '``torch.set_float32_matmul_precision("high")`` and cuDNN\'s TF32 flag, both put back '
        "when the fit ends"
    )
    guarded = True
    devices: ClassVar[frozenset[str] | None] = frozenset({"cuda"})
    tried_for: ClassVar[Mapping[str, int]] = {"compute": 0, "healthy": 0}
    context_field: ClassVar[str | None] = "tf32"

    def __init__(self) -> None:
        self._was: tuple[str, bool] | None = None

    @override
    def current(self, fit: FitView) -> bool:
        import torch

        return torch.get_float32_matmul_precision() != "highest"

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        import torch

        if self._was is None:
            self._was = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
        matmul, cudnn = self._was
        torch.set_float32_matmul_precision("high" if value else matmul)
        torch.backends.cudnn.allow_tf32 = True if value else cudnn

    @override
    def restore(self, fit: FitView) -> None:
        import torch

        if self._was is not None:
            torch.set_float32_matmul_precision(self._was[0])
            torch.backends.cudnn.allow_tf32 = self._was[1]
            self._was = None
