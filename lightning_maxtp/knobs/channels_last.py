"""``channels_last``: NHWC memory layout for the module's 4-D weights and every batch's 4-D floats.

The 4-D parameters and buffers change layout one by one (5-D ones, a ``Conv3d``'s, are left
alone: they have no channels_last layout) and the optimizers' tensors follow their strides;
the batches are converted by a step added to ``on_after_batch_transfer`` (the DataModule's when
it overrides the hook, else the module's), after ``DeviceTransform``'s step
(``CHANNELS_LAST_ORDER``), which turns uint8 batches into the floats converted here. Switching
back to the value the fit started with puts every 4-D tensor back to the strides it had then
(a module with some weights in NHWC by hand gets exactly those back) and removes the batch
step, so a reverted trial leaves the step as it was, bit for bit. When the fit ends the weights
stay as they were last set (kept or not); the batch step is removed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from lightning_maxtp.data.hooks import add_batch_step, hook_owner, remove_batch_step
from lightning_maxtp.knobs.base import BaseKnob, FitView

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHANNELS_LAST_ORDER",
    "ChannelsLast",
    "four_d",
    "layouts",
    "state_layout",
    "to_channels_last",
]

_HOOK = "on_after_batch_transfer"
_STEP = "lightning_maxtp.channels_last"
CHANNELS_LAST_ORDER = 100
"""After ``DeviceTransform``'s step (order 0), which turns uint8 batches into floats."""


class ChannelsLast(BaseKnob):
    """The module's 4-D weights and the batches' 4-D floats in NHWC layout."""

    name = "channels_last"
    reason = "NHWC layout: convolutions without layout transposes"
    changes = (
        "the module's 4-D weights and every batch's 4-D float tensors (NHWC); the weights stay "
        "as last set when the fit ends"
    )
    guarded = True
    tried_for: ClassVar[Mapping[str, int]] = {"compute": 0, "healthy": 0}

    def __init__(self) -> None:
        self._start: bool | None = None
        """The knob's value before the first switch (``None``: not switched yet)."""
        self._strides: dict[str, tuple[int, ...]] = {}
        """Per 4-D parameter and buffer (by name): its strides before the first switch."""

    @override
    def current(self, fit: FitView) -> bool:
        nhwc = layouts(four_d(fit.module))
        return bool(nhwc) and all(nhwc)

    @override
    def why_not(self, fit: FitView) -> str | None:
        if not layouts(four_d(fit.module)):
            return "the module has no 4-D (convolution) weights whose layout can change"
        return fit.sharded_by()

    @override
    def why_off(self, fit: FitView) -> str | None:
        if fit.device != "cpu" or fit.sharded_by() is not None:
            return None
        return "set by hand; NHWC convolutions on a CPU can run slower (0.8x measured on 2 cores)"

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        import torch

        module = fit.module
        if self._start is None:
            self._start = self.current(fit)
            self._strides = {name: t.stride() for name, t in _four_d_tensors(module)}
        back = bool(value) == self._start
        if back:  # each tensor as the fit started, not all of them in one layout
            start = self._strides
            _relayout(module, lambda name, t: _strided(t, start.get(name)))
        else:
            layout = torch.channels_last if value else torch.contiguous_format
            _relayout(module, lambda _, t: t.contiguous(memory_format=layout))
        for optimizer in fit.trainer.optimizers:
            state_layout(optimizer)
        owner = hook_owner(fit.trainer, _HOOK)
        if value and not back:  # after the device transform's step: it makes the floats here
            add_batch_step(owner, _HOOK, _STEP, to_channels_last, CHANNELS_LAST_ORDER)
        else:
            remove_batch_step(owner, _HOOK, _STEP)

    @override
    def restore(self, fit: FitView) -> None:
        remove_batch_step(hook_owner(fit.trainer, _HOOK), _HOOK, _STEP)


def _four_d_tensors(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The module's 4-D parameters and buffers, by name (what a layout switch moves)."""
    import itertools

    tensors = itertools.chain(module.named_parameters(), module.named_buffers())
    return [(name, t) for name, t in tensors if t.dim() == 4]


def _relayout(
    module: torch.nn.Module, convert: Callable[[str, torch.Tensor], torch.Tensor]
) -> None:
    """Each 4-D parameter and buffer (and its gradient) becomes ``convert(name, tensor)``.

    In place (``.data``), as ``Module.to`` does, so the optimizers keep the same parameters.
    """
    import torch

    with torch.no_grad():
        for name, t in _four_d_tensors(module):
            t.data = convert(name, t.data)
            if t.grad is not None:
                t.grad = convert(name, t.grad)


def _strided(t: torch.Tensor, stride: tuple[int, ...] | None) -> torch.Tensor:
    """``t``'s values with ``stride`` (``None``, or the strides it has: ``t`` itself)."""
    import torch

    if stride is None or t.stride() == stride:
        return t
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


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


def to_channels_last(batch: Any) -> Any:
    """``batch`` with its 4-D float tensors in NHWC layout."""
    import torch
    from lightning_utilities.core.apply_func import apply_to_collection

    def convert(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 4 and torch.is_floating_point(t):
            return t.contiguous(memory_format=torch.channels_last)
        return t

    return apply_to_collection(batch, torch.Tensor, convert)
