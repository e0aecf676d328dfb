"""``fused_optimizer``: ``fused=True`` on the param groups of the optimizers that have a fused step.

One kernel per optimizer step instead of one per tensor. Adam's ``step`` counters move to the
parameters' device with it (a fused step keeps them there, in float32) and back when it is
switched off, in the dtype torch gives a counter of the step in force (float64 when that is the
default dtype), so a reverted trial leaves the optimizer as it was. What is kept stays on the
optimizer when the fit ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from lightning_maxtp._compat.torch_modules import fused_kernel_devices
from lightning_maxtp.knobs.base import BaseKnob, FitView

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

__all__ = ["FUSED", "FusedOptimizer", "fused_groups", "steps_to"]

FUSED = {"Adam": None, "AdamW": None, "SGD": None, "Adagrad": "cpu"}
"""torch optimizers with a fused step (``fused=True``), and the one device it is limited to
(Adagrad's fused kernel is CPU-only in some torch releases this package supports)."""


class FusedOptimizer(BaseKnob):
    """``fused=True`` on the optimizers' param groups that can take it."""

    name = "fused_optimizer"
    reason = "one fused kernel per optimizer step instead of one per tensor"
    changes = (
        f"``fused=True`` on the param groups of {', '.join(FUSED)}; what is kept stays on the "
        "optimizer when the fit ends"
    )
    guarded = True
    tried_for: ClassVar[Mapping[str, int]] = {
        "compute": 0,
        "healthy": 0,
        "kernel_launch": 0,
        "host_overhead": 0,
    }

    def __init__(self) -> None:
        self._was: dict[int, tuple[Any, Any]] = {}
        """Per param group (by id): its ``fused`` and ``foreach`` before the first switch."""
        self._start: bool | None = None
        """The knob's value before the first switch (``None``: not switched yet)."""

    @override
    def current(self, fit: FitView) -> bool:
        groups = fused_groups(fit.trainer)
        return bool(groups) and all(g.get("fused") for _, g in groups)

    @override
    def why_not(self, fit: FitView) -> str | None:
        if not fused_groups(fit.trainer):
            return "no optimizer with a fused step (Adam, AdamW, SGD, Adagrad on the device)"
        return None

    @override
    def why_off(self, fit: FitView) -> str | None:
        if fit.device != "cpu":
            return None
        return "set by hand; a fused step on a CPU can run slower (0.55x-0.96x measured on 2 cores)"

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        if self._start is None:
            self._start = self.current(fit)
        for optimizer, group in fused_groups(fit.trainer):
            was = self._was.setdefault(id(group), (group.get("fused"), group.get("foreach")))
            if bool(value) == self._start:  # back to how the fit started, group by group
                group["fused"], group["foreach"] = was
            elif value:  # fused and foreach exclude each other
                group["fused"], group["foreach"] = True, False
            else:  # fused by hand: off, torch's default step instead
                group["fused"], group["foreach"] = None, None
            steps_to(optimizer, group, fused=bool(group["fused"]))


def fused_groups(trainer: pl.Trainer) -> list[tuple[torch.optim.Optimizer, dict[str, Any]]]:
    """Param groups that can take ``fused=True`` now (floating params on a fused device)."""
    import torch

    devices = fused_kernel_devices()
    groups = []
    for optimizer in trainer.optimizers:
        name = type(optimizer).__name__
        if name not in FUSED or "fused" not in optimizer.defaults:
            continue
        only = FUSED[name]
        for group in optimizer.param_groups:
            params = group["params"]
            if group.get("differentiable") or not params:
                continue
            if all(
                p.device.type in devices
                and torch.is_floating_point(p)
                and only in (None, p.device.type)
                for p in params
            ):
                groups.append((optimizer, group))
    return groups


def steps_to(optimizer: torch.optim.Optimizer, group: dict[str, Any], *, fused: bool) -> None:
    """Adam's ``step`` counters where and as torch keeps them for the step in force.

    A fused step's on the parameter's device in float32; otherwise on the CPU (on the device
    for a capturable step) in float64 when that is the default dtype, else float32: the rule
    torch's optimizers apply when they create a counter or load one from a state dict.
    """
    import torch

    on_device = fused or group.get("capturable")  # capturable steps keep it on the device
    default = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    dtype = torch.float32 if fused else default
    for p in group["params"]:
        state = optimizer.state.get(p)
        if state and torch.is_tensor(state.get("step")):
            state["step"] = state["step"].to(p.device if on_device else "cpu", dtype)
