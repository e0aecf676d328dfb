"""The numerics guard: a math trial that damages training is undone, step by step.

Before a trial of a knob that rounds differently (``knobs.registry.GUARDED``) the module's and the
optimizers' state are copied to host memory. Every measured window's losses are collected on
the device (no sync per step) and read once at the window's end. The trial's window fails the
guard when

- a loss is not finite, or a parameter is not finite after the window, or
- its median loss leaves the reference's band: above the median loss of the last window under
  the reference settings by more than ``BAND_SPREADS`` times that window's spread (the median
  absolute deviation scaled to a standard deviation, 1.4826 x MAD) or ``BAND_SHARE`` of its
  median, whichever is larger. Losses fall as training goes on, so only a rise is a failure;
  the band is wide, since one batch's loss varies a lot from the next one's.

A failed trial is reverted and the snapshot restored, so no step it damaged survives (the
updates since the snapshot are undone; their samples are not seen again), the gradients are
cleared, and the learning rate schedule goes on. A kept precision change stays watched once
tuning is over: each monitoring window must be finite, else precision is reverted and the
state restored from the last monitoring window that passed (before the first, from the start
of the precision trial).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_maxtp.tuning.guard_band import GuardCheck, loss_band

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

__all__ = ["GuardCheck", "NumericsGuard", "loss_band"]


def _loss_of(outputs: Any) -> torch.Tensor | None:
    import torch

    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
        return outputs.detach().reshape(())
    return None


def _to_host(value: Any) -> Any:
    import torch
    from lightning_utilities.core.apply_func import apply_to_collection

    return apply_to_collection(value, torch.Tensor, lambda t: t.detach().to("cpu", copy=True))


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _optimizer_state(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter's optimizer state, its tensors on the host (with their device)."""
    import torch

    saved = []
    for p in _params(optimizer):
        state = optimizer.state.get(p) or {}
        saved.append(
            {
                k: (v.detach().to("cpu", copy=True), v.device) if torch.is_tensor(v) else v
                for k, v in state.items()
            }
        )
    return saved


def _load_optimizer_state(optimizer: torch.optim.Optimizer, saved: list[dict[str, Any]]) -> None:
    import torch

    for p, entries in zip(_params(optimizer), saved, strict=True):
        if not entries:
            optimizer.state.pop(p, None)
            continue
        state = optimizer.state[p]
        for key, value in entries.items():
            if not isinstance(value, tuple):
                state[key] = value
                continue
            tensor, device = value
            live = state.get(key)
            if torch.is_tensor(live) and live.shape == tensor.shape:
                live.copy_(tensor)
            else:
                state[key] = tensor.to(device, copy=True)


class NumericsGuard:
    """Collects each window's losses, snapshots the training state, restores it."""

    def __init__(self) -> None:
        self.enabled = False
        """Whether losses are collected (a guarded knob is allowed)."""
        self.reference: list[float] = []
        """Losses of the last window measured under the reference settings."""
        self.trial: list[float] = []
        """Losses of the last window measured under a trial's new settings."""
        self._losses: list[torch.Tensor] = []
        self._snapshot: dict[str, Any] | None = None
        self.snapshot_step: int | None = None
        """Training step of the snapshot (``None``: none held)."""

    def record(self, outputs: Any) -> None:
        """One training step's output: its loss is kept on the device until the window ends."""
        if self.enabled:
            loss = _loss_of(outputs)
            if loss is not None:
                self._losses.append(loss)

    def clear(self) -> None:
        """A window starts: forget the losses of the steps before it."""
        self._losses.clear()

    def take(self) -> list[float]:
        """The losses since the window started, read once (one sync), and forget them."""
        if not self._losses:
            return []
        import torch

        values = torch.stack(self._losses).float().cpu().tolist()
        self._losses.clear()
        return [float(v) for v in values]

    @staticmethod
    def params_finite(module: torch.nn.Module) -> bool:
        """Whether every parameter is finite (one sync)."""
        import torch

        flags = [p.detach().isfinite().all() for p in module.parameters()]
        return bool(torch.stack(flags).all().item()) if flags else True

    def snapshot(self, trainer: pl.Trainer) -> None:
        """Copy the module's state and each optimizer's per-parameter state to host memory.

        The optimizers' hyperparameters (learning rate, momentum) are not part of it: they
        belong to the schedule, which goes on; only what the steps computed is undone.
        """
        self._snapshot = {
            "module": _to_host(trainer.lightning_module.state_dict()),
            "optimizers": [_optimizer_state(o) for o in trainer.optimizers],
        }
        self.snapshot_step = trainer.global_step

    def restore(self, trainer: pl.Trainer) -> bool:
        """Put the snapshot back in place, bit for bit (``False`` when none was taken).

        Tensors are copied into the live ones (their layout and device stay as the knobs in
        force want them), the gradients are cleared, and a parameter without state then has
        none again.
        """
        if self._snapshot is None:
            return False
        trainer.lightning_module.load_state_dict(self._snapshot["module"])
        for optimizer, saved in zip(trainer.optimizers, self._snapshot["optimizers"], strict=True):
            _load_optimizer_state(optimizer, saved)
            optimizer.zero_grad(set_to_none=True)
        return True

    def drop(self) -> None:
        """Release the snapshot's host memory."""
        self._snapshot, self.snapshot_step = None, None
