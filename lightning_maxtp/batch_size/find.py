"""Find the memory ceiling and the fastest batch: ``find_batch_size(...) -> BatchSizePlan``.

Lightning's BatchSizeFinder asks only what fits, and returns the largest size; this search asks
what is fastest, safely. It doubles the batch until out of memory, bisects to the ceiling (a
cap is tested itself), backs off by a margin, times every candidate with the real training step
on a replicated example batch, and picks the smallest batch within a tolerance of the best
throughput. All state the trials touch is restored bit for bit, without a checkpoint on disk.
Under DDP every trial is agreed by all ranks, so they end with the same batch and none waits
for a rank that ran out of memory.

The search itself is pure (``search``); the torch and Lightning glue is in ``subject``,
``trial``, ``snapshot`` and ``trainer_internals``; global-batch arithmetic in ``global_batch``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from lightning_maxtp._checks import COUNT, SECONDS, SHARE, refuse_bool
from lightning_maxtp._log import prefixed, rank_zero_info
from lightning_maxtp.batch_size.plan import BatchSizePlan, plan_changes

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch
    from torch import nn

    from lightning_maxtp.batch_size.global_batch import GlobalBatchDecision
    from lightning_maxtp.batch_size.search import SearchOutcome
    from lightning_maxtp.batch_size.snapshot import TrainingState
    from lightning_maxtp.batch_size.steps import LossFn
    from lightning_maxtp.batch_size.subject import Subject

__all__ = ["find_batch_size"]

log = logging.getLogger(__name__)


def _check_arguments(
    *,
    init_batch_size: int,
    max_batch_size: int,
    margin: float,
    tolerance: float,
    steps_per_trial: int,
    time_budget_s: float,
    target_global_batch_size: int | None,
) -> None:
    for name, value, expected, example in (
        ("init_batch_size", init_batch_size, f"{COUNT} >= 1", 2),
        ("max_batch_size", max_batch_size, f"{COUNT} >= 1", 8192),
        ("margin", margin, SHARE, 0.2),
        ("tolerance", tolerance, SHARE, 0.03),
        ("steps_per_trial", steps_per_trial, f"{COUNT} >= 1", 3),
        ("time_budget_s", time_budget_s, SECONDS, 20),
        ("target_global_batch_size", target_global_batch_size, f"{COUNT} >= 1 or None", 256),
    ):
        refuse_bool(name, value, expected, example)
    if init_batch_size < 1:
        raise ValueError(f"`init_batch_size` must be >= 1, got {init_batch_size}")
    if max_batch_size < init_batch_size:
        raise ValueError(
            f"`max_batch_size` must be >= `init_batch_size` ({init_batch_size}), got "
            f"{max_batch_size}; raise it or lower `init_batch_size`"
        )
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"`margin` must be in [0, 1), got {margin}; 0.2 keeps 20 % free")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"`tolerance` must be in [0, 1), got {tolerance}; 0.03 means 3 %")
    if steps_per_trial < 1:
        raise ValueError(f"`steps_per_trial` must be >= 1, got {steps_per_trial}")
    if time_budget_s <= 0:
        raise ValueError(f"`time_budget_s` must be > 0, got {time_budget_s}; pass e.g. 20")
    if target_global_batch_size is not None and target_global_batch_size < 1:
        raise ValueError(
            f"`target_global_batch_size` must be >= 1 or None, got {target_global_batch_size}"
        )


def find_batch_size(
    model: nn.Module,
    batch: Any = None,
    *,
    trainer: pl.Trainer | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    loss_fn: LossFn | None = None,
    precision: str = "32-true",
    init_batch_size: int = 2,
    max_batch_size: int = 8192,
    margin: float = 0.2,
    tolerance: float = 0.03,
    steps_per_trial: int = 3,
    time_budget_s: float = 20.0,
    global_batch: Literal["keep", "grow"] = "keep",
    target_global_batch_size: int | None = None,
    lr_scaling: Literal["auto", "none", "linear", "sqrt"] = "auto",
    lr_warmup_steps: int | None = None,
    batch_arg_name: str = "batch_size",
    verbose: bool = True,
) -> BatchSizePlan:
    """Find the memory ceiling, then the fastest per-device batch under it; change nothing.

    With a ``trainer`` (from ``on_fit_start`` or later) the steps run through the Trainer's
    precision plugin with its callbacks hidden; without one, ``model`` is a LightningModule
    (its ``training_step`` gives the loss) or a plain module with ``optimizer`` and ``loss_fn``.
    The model, optimizer, RNG and loop counters are restored bit for bit afterwards; apply the
    result with ``plan.apply(trainer)`` or read ``plan.batch_size``.

    Args:
        model: The module to train (with a trainer: ``trainer.lightning_module``).
        batch: One real batch from the training loader, replicated to every candidate size;
            with a trainer it defaults to the first batch of its train loader.
        trainer: A Trainer whose strategy is set up (single device or DDP).
        optimizer: The optimizer (without a trainer; a LightningModule's own by default).
        loss_fn: ``loss_fn(model, batch) -> loss`` (without a trainer, for a plain module).
        precision: Without a trainer: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ...
        init_batch_size: First size tried (doubling starts here).
        max_batch_size: Largest size tried; it is tested itself before it can be picked.
        margin: Share of the ceiling kept free (the seeds' ~20 % back-off).
        tolerance: A batch within this share of the best throughput counts as fastest.
        steps_per_trial: Timed steps per candidate, after one warm-up step.
        time_budget_s: No trial starts that would overrun this; the plan says what it took.
        global_batch: ``"keep"`` the global batch (gradient accumulation makes up for a
            smaller micro-batch) or let it ``"grow"`` to the fastest one, scaling the LR.
        target_global_batch_size: The global batch to keep, or the least to grow from;
            defaults to ``batch size x world size x accumulation`` before the search.
        lr_scaling: With ``"grow"``: ``"auto"`` (linear for SGD-like, square root for
            Adam-like), ``"linear"``, ``"sqrt"`` or ``"none"``.
        lr_warmup_steps: Linear warm-up when the LR grows (default 100 optimizer steps).
        batch_arg_name: Where the user's loader reads its batch size (model, hparams or
            datamodule); read for the current size, written by ``plan.apply``.
        verbose: Log the plan's first line (rank zero); ``False`` logs nothing.

    Returns:
        The plan, with every trial.

    Raises:
        ValueError: For arguments no search can satisfy (each message names the fix).
        RuntimeError: If even the smallest batch does not fit.
    """
    _check_arguments(
        init_batch_size=init_batch_size,
        max_batch_size=max_batch_size,
        margin=margin,
        tolerance=tolerance,
        steps_per_trial=steps_per_trial,
        time_budget_s=time_budget_s,
        target_global_batch_size=target_global_batch_size,
    )
    start = time.perf_counter()
    from lightning_maxtp.batch_size.global_batch import decide_global_batch
    from lightning_maxtp.batch_size.snapshot import TrainingState
    from lightning_maxtp.batch_size.subject import from_trainer, standalone

    if trainer is not None:
        subject, fetch = from_trainer(model, trainer, batch, batch_arg_name)
    else:
        subject = standalone(model, batch, optimizer, loss_fn, precision)
        fetch = None
    state = TrainingState.capture(subject.modules, subject.optimizers, subject.scalers)
    notes: list[str] = []
    decide = functools.partial(
        decide_global_batch,
        mode=global_batch,
        previous_accumulation=subject.previous_accumulation,
        devices=subject.world_size,
        target_global_batch_size=target_global_batch_size,
        optimizer_names=[[c.__name__ for c in type(o).__mro__] for o in subject.optimizers],
        lr_scaling=lr_scaling,
        lr_warmup_steps=lr_warmup_steps,
    )
    outcome, cap, limit = _search(
        subject,
        state,
        fetch,
        decide,
        notes,
        init_batch_size=init_batch_size,
        max_batch_size=max_batch_size,
        margin=margin,
        tolerance=tolerance,
        steps_per_trial=steps_per_trial,
        time_budget_s=time_budget_s,
    )
    if outcome.fastest is None:
        failed = min((t for t in outcome.trials if not t.fits), key=lambda t: t.batch_size)
        raise RuntimeError(
            f"no batch size fits: batch {failed.batch_size} already failed ({failed.error}); "
            "free memory (a smaller model, activation checkpointing, lower precision)"
        )
    if outcome.budget_exhausted:
        notes.append(f"the time budget of {time_budget_s:g} s ended the search early")
    decision = decide(
        previous_batch_size=subject.previous_batch_size,
        fastest=outcome.fastest,
        safe_max=outcome.safe_max,
    )
    plan = _plan(
        outcome,
        decision,
        subject,
        global_batch=global_batch,
        margin=margin,
        tolerance=tolerance,
        cap=cap,
        limit=limit,
        seconds=time.perf_counter() - start,
        notes=notes,
    )
    if verbose:
        _announce(plan, trainer)
    return plan


def _search(
    subject: Subject,
    state: TrainingState,
    fetch: Callable[[], Any] | None,
    decide: Callable[..., GlobalBatchDecision],
    notes: list[str],
    *,
    init_batch_size: int,
    max_batch_size: int,
    margin: float,
    tolerance: float,
    steps_per_trial: int,
    time_budget_s: float,
) -> tuple[SearchOutcome, int, int | None]:
    """Run the trials: the search's outcome, the cap it searched up to and the memory limit.

    The state before the search is restored afterwards, whatever happens; a cap from the data
    set's size is added to ``notes``.
    """
    import torch

    from lightning_maxtp.batch_size.oom import free_memory, frozen_heap
    from lightning_maxtp.batch_size.search import search_batch_size
    from lightning_maxtp.batch_size.subject import memory_limit
    from lightning_maxtp.batch_size.trial import TrialRunner

    try:
        with contextlib.ExitStack() as stack:
            for context in subject.contexts:
                stack.enter_context(context())
            stack.enter_context(torch.enable_grad())
            stack.enter_context(frozen_heap())
            if fetch is not None:
                subject.example = fetch()
            cap = max_batch_size
            if subject.dataset_length:
                per_rank = max(1, subject.dataset_length // subject.world_size)
                if per_rank < cap:
                    cap = per_rank
                    notes.append(f"capped at {cap}: the data set's samples per device")
            # Fail on impossible global-batch requests now, not after the search.
            decide(previous_batch_size=max(1, subject.previous_batch_size), fastest=1, safe_max=1)
            runner = TrialRunner(
                step=subject.step,
                example=subject.example,
                state=state,
                device=subject.device,
                steps_per_trial=steps_per_trial,
                distributed=subject.distributed,
                modules=subject.modules,
            )
            limit = memory_limit(subject)
            outcome = search_batch_size(
                runner,
                init=min(init_batch_size, cap),
                cap=cap,
                margin=margin,
                tolerance=tolerance,
                time_budget_s=time_budget_s,
                memory_limit_bytes=limit,
            )
    finally:
        state.restore()
        for restore in subject.restore_extra:
            restore()
        free_memory(subject.device, collect=False)  # each failed trial was collected already
    return outcome, cap, limit


def _plan(
    outcome: SearchOutcome,
    decision: GlobalBatchDecision,
    subject: Subject,
    *,
    global_batch: str,
    margin: float,
    tolerance: float,
    cap: int,
    limit: int | None,
    seconds: float,
    notes: list[str],
) -> BatchSizePlan:
    """The plan from the search's outcome and the global-batch decision."""
    fields: dict[str, Any] = dict(
        batch_size=decision.batch_size,
        accumulate_grad_batches=decision.accumulate_grad_batches,
        global_batch_size=decision.global_batch_size,
        previous_batch_size=subject.previous_batch_size,
        previous_accumulate_grad_batches=subject.previous_accumulation,
        previous_global_batch_size=decision.previous_global_batch_size,
        fastest_batch_size=outcome.fastest,
        best_batch_size=outcome.best,
        ceiling=outcome.ceiling,
        first_oom=outcome.first_oom,
        safe_max_batch_size=outcome.safe_max,
        bound=outcome.bound,
        trials=outcome.trials,
        global_batch=global_batch,
        lr_scales=decision.lr_scales,
        lr_rules=decision.lr_rules,
        lr_warmup_steps=decision.lr_warmup_steps,
        world_size=subject.world_size,
        device=str(subject.device),
        precision=subject.precision,
        margin=margin,
        tolerance=tolerance,
        max_batch_size=cap,
        memory_limit_bytes=limit,
        seconds=seconds,
        notes=(*notes, *decision.notes),
    )
    return BatchSizePlan(**fields, changes=plan_changes(fields))


def _announce(plan: BatchSizePlan, trainer: pl.Trainer | None) -> None:
    summary = str(plan).splitlines()[0]
    if trainer is None:
        log.info(prefixed(summary))
    else:
        rank_zero_info(summary)
