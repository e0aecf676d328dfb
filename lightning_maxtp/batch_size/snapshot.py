"""Snapshot and bit-for-bit restore of what training steps change, without a disk round-trip.

Covered: parameter and buffer values (BatchNorm running statistics included), gradients (a
``None`` gradient stays ``None``; an existing one keeps its tensor object), every module's
``training`` flag, optimizer state and hyper-parameters, a ``GradScaler``'s scale, and the
random number generators (Python, NumPy, torch CPU and every initialised CUDA device).

Copies of device tensors are kept in host memory: a copy on the device would take memory from
the trials and lower the ceiling they find. Values are restored in place where the tensor still
exists, so references held elsewhere (the optimizer's, DDP's) stay valid.
"""

from __future__ import annotations

import copy
import random
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lightning_maxtp._compat.torch_modules import (
    clear_scaler_optimizer_states,
    scaler_tensors,
    scheduler_mark,
    set_scaler_tensor,
    set_scheduler_mark,
)

__all__ = ["TrainingState"]


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


Saved = dict[str, tuple[Any, Any]]
"""A mapping's entries: ``(tensor, host copy)`` for a tensor, ``(None, deep copy)`` otherwise."""


def _save(mapping: Mapping[str, Any], skip: str = "") -> Saved:
    return {
        k: (v, _host_copy(v)) if isinstance(v, torch.Tensor) else (None, copy.deepcopy(v))
        for k, v in mapping.items()
        if k != skip
    }


def _load(saved: Saved) -> dict[str, Any]:
    # Tensors are written back into the captured objects (same identity, dtype and device, no
    # new allocation); other values are copied again so the snapshot stays pristine.
    with torch.no_grad():
        return {
            k: tensor.copy_(host) if tensor is not None else copy.deepcopy(host)
            for k, (tensor, host) in saved.items()
        }


@dataclass
class _OptimizerState:
    optimizer: torch.optim.Optimizer
    state: list[tuple[Any, Saved]]
    groups: list[Saved]
    opt_called: Any

    def restore(self) -> None:
        opt = self.optimizer
        opt.state.clear()
        for param, saved in self.state:
            opt.state[param] = _load(saved)
        for group, saved in zip(opt.param_groups, self.groups, strict=True):
            params = group["params"]
            group.clear()
            group["params"] = params
            group.update(_load(saved))
        # LR schedulers mark a stepped optimizer; trials must not leave the mark behind.
        set_scheduler_mark(opt, self.opt_called)


@dataclass
class _ScalerState:
    """A GradScaler's scale and growth tracker (``scaler_tensors``, read in torch 2.4-2.14).

    Both are created lazily, so "not created yet" is part of the state.
    """

    scaler: Any
    tensors: dict[str, torch.Tensor | None]

    def restore(self) -> None:
        now = scaler_tensors(self.scaler)
        for name, saved in self.tensors.items():
            current = now[name]
            if saved is None:
                set_scaler_tensor(self.scaler, name, None)
            elif current is not None:
                current.copy_(saved)
            else:
                set_scaler_tensor(self.scaler, name, saved.clone())
        clear_scaler_optimizer_states(self.scaler)


@dataclass
class TrainingState:
    """A snapshot of modules, optimizers, scalers and RNGs; ``restore()`` may be called often."""

    values: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    grads: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = field(
        default_factory=list
    )
    flags: list[tuple[nn.Module, bool]] = field(default_factory=list)
    optimizers: list[_OptimizerState] = field(default_factory=list)
    scalers: list[_ScalerState] = field(default_factory=list)
    rng: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def capture(
        cls,
        modules: Iterable[nn.Module],
        optimizers: Iterable[torch.optim.Optimizer] = (),
        scalers: Iterable[Any] = (),
    ) -> TrainingState:
        """Copy everything a training step may change."""
        snap = cls()
        seen: set[int] = set()
        for module in modules:
            snap.flags += [(m, m.training) for m in module.modules()]
            for tensor in (*module.parameters(), *module.buffers()):
                if id(tensor) in seen:
                    continue
                seen.add(id(tensor))
                snap.values.append((tensor, _host_copy(tensor)))
                if isinstance(tensor, nn.Parameter):
                    grad = tensor.grad
                    snap.grads.append((tensor, grad, None if grad is None else _host_copy(grad)))
        for opt in optimizers:
            state = [(param, _save(st)) for param, st in opt.state.items()]
            groups = [_save(g, skip="params") for g in opt.param_groups]
            snap.optimizers.append(_OptimizerState(opt, state, groups, scheduler_mark(opt)))
        for scaler in scalers:
            tensors = {
                name: None if value is None else _host_copy(value)
                for name, value in scaler_tensors(scaler).items()
            }
            snap.scalers.append(_ScalerState(scaler, tensors))
        snap.rng = _rng_state()
        return snap

    def restore(self) -> None:
        """Put every captured value back, bit for bit."""
        with torch.no_grad():
            for tensor, saved in self.values:
                tensor.copy_(saved)
            for param, grad, saved_grad in self.grads:
                if grad is not None and saved_grad is not None:
                    grad.copy_(saved_grad)
                param.grad = grad
        for module, training in self.flags:
            module.training = training
        for optimizer in self.optimizers:
            optimizer.restore()
        for scaler in self.scalers:
            scaler.restore()
        _set_rng_state(self.rng)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
