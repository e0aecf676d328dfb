"""The training step a trial runs: Lightning's (through the Trainer's precision plugin) or plain.

Each builder returns ``step(batch)``: one forward, backward and optimizer step on ``batch``, as
the real training loop would run it, so a trial measures what training will cost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = [
    "PLAIN_PRECISIONS",
    "LossFn",
    "Step",
    "lightning_step",
    "loss_of",
    "manual_step",
    "plain_step",
    "quiet_logging",
]

Step = Callable[[Any], None]
LossFn = Callable[[nn.Module, Any], torch.Tensor]
PLAIN_PRECISIONS = ("32-true", "64-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned (a tensor, ``{"loss": tensor}`` or None)."""
    if output is None or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        loss: torch.Tensor = output["loss"]
        return loss
    raise ValueError(
        "`training_step` must return a loss tensor, a dict with a 'loss' tensor or None, got "
        f"{type(output).__name__}"
    )


def lightning_step(module: Any, optimizer: torch.optim.Optimizer, precision: Any) -> Step:
    """Automatic optimization as Lightning runs it, through the Trainer's precision plugin.

    The module is called directly, never through a DDP wrapper, so no rank waits in a gradient
    all-reduce for a rank that ran out of memory.
    """

    def step(batch: Any) -> None:
        optimizer.zero_grad(set_to_none=True)

        def closure() -> torch.Tensor | None:
            with precision.train_step_context():
                loss = loss_of(module.training_step(batch, 0))
            if loss is None:
                return None
            loss = precision.pre_backward(loss, module)
            precision.backward(loss, module, optimizer)
            return precision.post_backward(loss, module)  # type: ignore[no-any-return]

        precision.optimizer_step(optimizer, model=module, closure=closure)

    return step


def manual_step(module: Any, precision: Any) -> Step:
    """Manual optimization: ``training_step`` does its own backward and optimizer steps."""

    def step(batch: Any) -> None:
        with precision.train_step_context():
            module.training_step(batch, 0)

    return step


def plain_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    precision: str,
    device: torch.device,
) -> tuple[Step, Any]:
    """A training step without a Trainer: ``loss_fn(model, batch)``, backward, optimizer step.

    Returns:
        The step, and the ``GradScaler`` it uses for ``"16-mixed"`` (else ``None``).
    """
    dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None

    def context() -> contextlib.AbstractContextManager[Any]:
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=dtype)

    def step(batch: Any) -> None:
        optimizer.zero_grad(set_to_none=True)
        with context():
            loss = loss_fn(model, batch)
        if scaler is None:
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        else:
            scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            scaler.step(optimizer)
            scaler.update()

    return step, scaler


@contextlib.contextmanager
def quiet_logging(module: nn.Module) -> Iterator[None]:
    """Make ``self.log``/``self.log_dict`` no-ops: no loop collects results during trials."""
    names = ("log", "log_dict")
    saved: dict[str, Any] = {n: module.__dict__[n] for n in names if n in module.__dict__}
    module.__dict__["log"] = module.__dict__["log_dict"] = lambda *args, **kwargs: None
    try:
        yield
    finally:
        for name in ("log", "log_dict"):
            module.__dict__.pop(name, None)
        module.__dict__.update(saved)
