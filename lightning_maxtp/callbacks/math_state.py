"""What the math knobs touch besides the module: weight layouts, optimizer state, fused steps.

Plain functions over torch objects, for ``math_knobs.MathKnobs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_maxtp._compat.torch_modules import fused_kernel_devices

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

__all__ = ["FUSED", "four_d", "fused_groups", "layouts", "state_layout", "steps_to",
           "to_channels_last"]  # fmt: skip

FUSED = {"Adam": None, "AdamW": None, "SGD": None, "Adagrad": "cpu"}
"""torch optimizers with a fused step (``fused=True``), and the one device it is limited to
(Adagrad's fused kernel is CPU-only in some torch releases this package supports)."""


def four_d(module: torch.nn.Module) -> list[torch.Tensor]:
    """The module's 4-D (convolution) weights."""
    return [p for p in module.parameters() if p.dim() == 4]


def layouts(weights: list[torch.Tensor]) -> list[bool]:
    """Per 4-D weight whose layout can change: whether it is channels_last now.

    A 1x1 convolution's weight, or one with a single input channel, is contiguous in both
    layouts at once (size-1 dimensions have no stride that matters); torch leaves such a
    weight as it is, so it tells nothing and is left out.
    """
    import torch

    found = []
    for w in weights:
        nchw, nhwc = w.is_contiguous(), w.is_contiguous(memory_format=torch.channels_last)
        if nchw != nhwc:
            found.append(nhwc)
    return found


def state_layout(optimizer: torch.optim.Optimizer) -> None:
    """Each 4-D weight's optimizer tensors (moments, buffers) with the weight's strides.

    Fused kernels pair a weight with its moments by memory offset and refuse mismatched
    layouts, so after the weights change layout the moments follow (``empty_like`` keeps the
    weight's strides).
    """
    import torch

    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p) if p.dim() == 4 else None
            for key, value in (state or {}).items():
                if (
                    torch.is_tensor(value)
                    and value.shape == p.shape
                    and value.stride() != p.stride()
                ):
                    state[key] = torch.empty_like(p, dtype=value.dtype).copy_(value)  # type: ignore[index]


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
            if all(p.device.type in devices and torch.is_floating_point(p)
                   and only in (None, p.device.type) for p in params):  # fmt: skip
                groups.append((optimizer, group))
    return groups


def to_channels_last(batch: Any) -> Any:
    """``batch`` with its 4-D float tensors in NHWC layout."""
    import torch
    from lightning_utilities.core.apply_func import apply_to_collection

    def convert(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 4 and torch.is_floating_point(t):
            return t.contiguous(memory_format=torch.channels_last)
        return t

    return apply_to_collection(batch, torch.Tensor, convert)


def steps_to(optimizer: torch.optim.Optimizer, group: dict[str, Any], *, fused: bool) -> None:
    """Adam's ``step`` counters live on the CPU, except for a fused step (on the param's device)."""
    import torch

    on_device = fused or group.get("capturable")  # capturable steps keep it on the device
    for p in group["params"]:
        state = optimizer.state.get(p)
        if state and torch.is_tensor(state.get("step")):
            state["step"] = state["step"].to(p.device if on_device else "cpu", torch.float32)
