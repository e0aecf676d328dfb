"""Private torch state of modules, optimizers and grad scalers.

The math knobs and the batch-size snapshot read or write it.

* ``nn.Module._compiled_call_impl``: what ``Module.compile()`` installs (compiled lazily, on the
  next call); set back to ``None`` to run eagerly, or to a kept compiled callable to switch back
  without compiling again.
* ``LightningModule._compiler_ctx``: set by Lightning when the user passed a
  ``torch.compile``-d LightningModule to the Trainer.
* ``torch.utils._foreach_utils._get_fused_kernels_supported_devices()``: the device types with
  fused optimizer kernels.
* ``Optimizer._step_supports_amp_scaling``: a fused optimizer unscales inside its step, which
  Lightning cannot combine with gradient clipping under mixed precision.
* ``Optimizer._opt_called``: set by LR schedulers' ``step`` wrapper on the first optimizer step
  (read to warn about the call order); trial steps must not leave it behind.
* ``GradScaler._scale``, ``._growth_tracker`` (created lazily) and ``._per_optimizer_states``:
  the scale state a snapshot restores.
* ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``: whether oneDNN runs bf16 kernels on this
  CPU (AVX-512 on x86, bf16 instructions on Arm); torch has no public call for it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "NOT_MARKED",
    "SCALER_TENSORS",
    "clear_scaler_optimizer_states",
    "compiled_call",
    "cpu_bf16_kernels",
    "fused_kernel_devices",
    "is_compiled",
    "scaler_tensors",
    "scheduler_mark",
    "set_compiled_call",
    "set_scaler_tensor",
    "set_scheduler_mark",
    "steps_with_amp_scaling",
]

SCALER_TENSORS = ("_scale", "_growth_tracker")
"""A ``GradScaler``'s state tensors (each ``None`` until the scaler first scales)."""

NOT_MARKED = object()
"""``scheduler_mark`` of an optimizer no LR scheduler has seen step."""


@functools.cache
def cpu_bf16_kernels() -> bool | None:
    """Whether this CPU has bf16 kernels (``None``: this torch cannot say).

    Without them bf16 autocast is emulated: on an AVX2-only AMD EPYC, a 3-layer conv net's step
    ran 13x slower under it. Asked once: the math knobs are offered again at every decision.
    """
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return None


def compiled_call(module: nn.Module) -> Any:
    """The compiled forward ``module.compile()`` installed (``None``: the module runs eagerly)."""
    return getattr(module, "_compiled_call_impl", None)


def set_compiled_call(module: nn.Module, call: Any) -> None:
    """Run ``module`` through ``call`` (a kept ``compiled_call``), or eagerly for ``None``."""
    module._compiled_call_impl = call


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` runs compiled.

    True when it was given to the Trainer compiled, or any submodule was compiled in place
    (``Module.compile()``, as the ``compile`` knob does).
    """
    if getattr(module, "_compiler_ctx", None) is not None:
        return True
    return any(compiled_call(m) is not None for m in module.modules())


def fused_kernel_devices() -> set[str]:
    """Device types that have fused optimizer kernels (``cuda``, ``cpu``, ... per torch build)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return set(_get_fused_kernels_supported_devices())


def steps_with_amp_scaling(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` unscales gradients itself (fused optimizers)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def scheduler_mark(optimizer: torch.optim.Optimizer) -> Any:
    """The mark an LR scheduler left on ``optimizer`` (``NOT_MARKED`` when there is none)."""
    return vars(optimizer).get("_opt_called", NOT_MARKED)


def set_scheduler_mark(optimizer: torch.optim.Optimizer, mark: Any) -> None:
    """Put back a ``scheduler_mark`` (``NOT_MARKED`` removes it)."""
    if mark is NOT_MARKED:
        vars(optimizer).pop("_opt_called", None)
    else:
        vars(optimizer)["_opt_called"] = mark


def scaler_tensors(scaler: Any) -> dict[str, torch.Tensor | None]:
    """A ``GradScaler``'s ``SCALER_TENSORS`` by name (``None``: not created yet)."""
    return {name: getattr(scaler, name, None) for name in SCALER_TENSORS}


def set_scaler_tensor(scaler: Any, name: str, value: torch.Tensor | None) -> None:
    """Set one of ``SCALER_TENSORS``; ``None`` makes the scaler create it again when it scales."""
    if name not in SCALER_TENSORS:
        raise ValueError(f"`name` must be one of {SCALER_TENSORS}, got {name!r}")
    setattr(scaler, name, value)


def clear_scaler_optimizer_states(scaler: Any) -> None:
    """Forget a ``GradScaler``'s per-optimizer unscale records (as its ``update()`` does)."""
    states = getattr(scaler, "_per_optimizer_states", None)
    if states is not None:
        states.clear()
