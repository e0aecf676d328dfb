"""What a batch-size search runs on: the step, the state to restore, the device, the example.

Two ways in: from a Trainer (``on_fit_start`` or later: the model is on its device, the
optimizers exist and the Trainer's precision plugin decides autocast and gradient scaling), or
alone (a LightningModule or a plain ``nn.Module`` with an optimizer and an example batch).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

from lightning_maxtp.batch_size.steps import (
    PLAIN_PRECISIONS,
    LossFn,
    Step,
    lightning_step,
    loss_of,
    manual_step,
    plain_step,
    quiet_logging,
)
from lightning_maxtp.batch_size.trial import batch_length

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["Subject", "from_trainer", "memory_limit", "standalone"]


@dataclass
class Subject:
    """Everything the search needs, however it was called."""

    step: Step
    modules: list[nn.Module]
    optimizers: list[torch.optim.Optimizer]
    scalers: list[Any]
    device: torch.device
    example: Any
    previous_batch_size: int
    previous_accumulation: int
    world_size: int
    distributed: bool
    precision: str
    dataset_length: int | None = None
    contexts: list[Callable[[], contextlib.AbstractContextManager[Any]]] = field(
        default_factory=list
    )
    restore_extra: list[Callable[[], None]] = field(default_factory=list)


def is_lightning_module(obj: object) -> bool:
    """Without importing lightning (8 s): a LightningModule exists only if it was imported."""
    module = sys.modules.get("lightning.pytorch")
    return module is not None and isinstance(obj, module.LightningModule)


def _dist_world() -> tuple[int, bool]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_world_size(), True
    return 1, False


def _configured_optimizer(model: Any) -> torch.optim.Optimizer:
    """The first optimizer ``configure_optimizers()`` returns, in any of its return forms."""
    found = model.configure_optimizers()
    while not isinstance(found, torch.optim.Optimizer):
        if isinstance(found, dict) and "optimizer" in found:
            found = found["optimizer"]
        elif isinstance(found, list | tuple) and found:
            found = found[0]
        else:
            raise ValueError(
                "`optimizer` is None and `configure_optimizers()` returned no optimizer; pass "
                "`optimizer=`"
            )
    return found


def from_trainer(
    model: nn.Module, trainer: pl.Trainer, batch: Any, batch_arg_name: str
) -> tuple[Subject, Callable[[], Any]]:
    """A subject from a Trainer whose strategy is set up.

    Returns:
        The subject (its example still unset when ``batch`` is None) and a function fetching
        the example; call it after capturing state, since iterating a loader draws random numbers.
    """
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    from lightning_maxtp.batch_size.trainer_internals import (
        LoopCounters,
        example_batch,
        read_batch_size,
        without_callbacks,
    )

    module = trainer.lightning_module
    if model is not module:
        raise ValueError(
            "`model` must be the Trainer's LightningModule (`trainer.lightning_module`), got "
            f"{type(model).__name__}; pass the module being fitted"
        )
    if not isinstance(trainer.strategy, SingleDeviceStrategy | DDPStrategy):
        raise ValueError(
            f"`find_batch_size` supports single-device and DDP strategies, got "
            f"{type(trainer.strategy).__name__}; sharded strategies (FSDP, DeepSpeed) are not "
            "supported"
        )
    if not trainer.optimizers:
        raise ValueError(
            "the Trainer has no optimizers yet; call `find_batch_size` from `on_fit_start` or "
            "later, when the strategy has set up the model and its optimizers"
        )
    distributed = trainer.world_size > 1
    precision = trainer.precision_plugin
    if module.automatic_optimization:
        if len(trainer.optimizers) != 1:
            raise ValueError("automatic optimization with several optimizers is not supported")
        step = lightning_step(module, trainer.optimizers[0], precision)
    elif distributed:
        raise ValueError(
            "manual optimization under DDP is not supported: `manual_backward` synchronizes "
            "gradients, which could leave a rank waiting for one that ran out of memory"
        )
    else:
        step = manual_step(module, precision)
    scaler = getattr(precision, "scaler", None)
    counters = LoopCounters(trainer)
    subject = Subject(
        step=step,
        modules=[module],
        optimizers=list(trainer.optimizers),
        scalers=[scaler] if scaler is not None else [],
        device=trainer.strategy.root_device,
        example=batch,
        previous_batch_size=0,
        previous_accumulation=int(trainer.accumulate_grad_batches),
        world_size=trainer.world_size,
        distributed=distributed,
        precision=str(trainer.precision),
        contexts=[lambda: without_callbacks(trainer), lambda: quiet_logging(module)],
        restore_extra=[counters.restore],
    )

    def fetch() -> Any:
        if batch is not None:
            example = trainer.strategy.batch_to_device(batch)
        else:
            example, subject.dataset_length = example_batch(trainer)
        subject.previous_batch_size = read_batch_size(module, batch_arg_name) or (
            batch_length(example) or 0
        )
        return example

    return subject, fetch


def standalone(
    model: nn.Module,
    batch: Any,
    optimizer: torch.optim.Optimizer | None,
    loss_fn: LossFn | None,
    precision: str,
) -> Subject:
    """A subject from a module, an optimizer and an example batch, without a Trainer."""
    if batch is None:
        raise ValueError("`batch` is required without a `trainer`; pass one batch of your loader")
    if precision not in PLAIN_PRECISIONS:
        raise ValueError(f"`precision` must be one of {PLAIN_PRECISIONS}, got {precision!r}")
    lightning = is_lightning_module(model)
    contexts: list[Callable[[], contextlib.AbstractContextManager[Any]]] = []
    if lightning:
        if not model.automatic_optimization:
            raise ValueError(
                "a LightningModule with manual optimization needs its Trainer; pass `trainer=`"
            )
        optimizer = optimizer or _configured_optimizer(model)
        contexts.append(lambda: quiet_logging(model))
        if loss_fn is None:

            def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
                loss = loss_of(m.training_step(b, 0))  # type: ignore[operator]
                if loss is None:
                    raise ValueError("`training_step` returned None; pass `loss_fn=`")
                return loss

    elif optimizer is None or loss_fn is None:
        raise ValueError(
            "a plain nn.Module needs `optimizer=` and `loss_fn=` (``loss_fn(model, batch) -> "
            "loss``); or pass a LightningModule, whose `training_step` gives the loss"
        )
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    example = apply_to_collection(batch, torch.Tensor, lambda t: t.to(device))
    step, scaler = plain_step(model, optimizer, loss_fn, precision, device)
    world_size, distributed = _dist_world()
    return Subject(
        step=step,
        modules=[model],
        optimizers=[optimizer],
        scalers=[scaler] if scaler is not None else [],
        device=device,
        example=example,
        previous_batch_size=batch_length(example) or 0,
        previous_accumulation=1,
        world_size=world_size,
        distributed=distributed,
        precision=precision,
        contexts=contexts,
    )


def memory_limit(subject: Subject) -> int | None:
    """On a CPU: this process's RSS now plus the RAM it may still take (agreed over ranks)."""
    if subject.device.type != "cpu":
        return None
    from lightning_maxtp.batch_size.oom import current_rss_bytes
    from lightning_maxtp.resources.host import probe_memory

    available, rss = probe_memory().effective_available_bytes, current_rss_bytes()
    limit = None if available is None or rss is None else available + rss
    if subject.distributed:
        import torch.distributed as dist

        value = torch.tensor([float(limit if limit is not None else -1)], dtype=torch.float64)
        gathered = [torch.empty_like(value) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, value)
        known = [int(v.item()) for v in gathered if v.item() >= 0]
        limit = min(known) if known else None
    return limit
