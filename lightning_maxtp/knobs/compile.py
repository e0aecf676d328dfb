"""``compile``: ``torch.compile`` in place on the LightningModule's submodules.

``Module.compile()`` on each child that holds parameters (the module itself when none does),
compiled lazily on the next call; the compiled callables are kept, so switching back and forth
compiles once. Compiling takes steps no window measures at their cost: the trial settles for
``settle_steps`` (the first step compiles the forward and backward graphs, the second may
recompile on a dynamo guard such as a shape) and on while a step still runs far slower than
the reference (``settles_until_steady``: a recompile lands in no window), the excess time of
those steps is counted in the tuning cost, and with less than ``min_budget_s`` of tuning
budget left it is not tried (it could not pay back in time).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any, ClassVar

from typing_extensions import override

from lightning_maxtp._compat.torch_modules import compiled_call, is_compiled, set_compiled_call
from lightning_maxtp.knobs.base import BaseKnob, FitView

__all__ = ["Compile"]


class Compile(BaseKnob):
    """``torch.compile`` in place on the module's submodules."""

    name = "compile"
    reason = "torch.compile fuses the step's kernels"
    changes = (
        "``torch.compile`` in place on the module's submodules, compiled once and kept across "
        "switches"
    )
    guarded = True
    tried_for: ClassVar[Mapping[str, int]] = {
        "compute": 0,
        "healthy": 0,
        "kernel_launch": 0,
        "host_overhead": 0,
    }
    settle_steps = 2
    settles_until_steady = True  # a cold ResNet-50 compile, then a recompile on a guard
    min_budget_s = 30.0  # a small conv net on two CPU cores; a ResNet-50 on a GPU takes longer
    context_field: ClassVar[str | None] = "compiled"

    def __init__(self) -> None:
        self._compiled: dict[int, Any] = {}

    @override
    def current(self, fit: FitView) -> bool:
        return is_compiled(fit.module)

    @override
    def why_not(self, fit: FitView) -> str | None:
        device = fit.device
        if device == "cpu" and shutil.which("gcc") is None and shutil.which("cc") is None:
            return "no C compiler for inductor on the CPU"
        if device not in ("cuda", "cpu"):
            return f"no inductor backend on {device}"
        return fit.sharded_by()

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        for module in fit.submodules():
            if not value:
                set_compiled_call(module, None)
            elif id(module) in self._compiled:
                set_compiled_call(module, self._compiled[id(module)])
            else:  # compiled lazily, on the next call
                module.compile()
                self._compiled[id(module)] = compiled_call(module)
