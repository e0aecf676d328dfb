"""Global batch arithmetic: gradient accumulation and learning-rate scaling (pure, no torch).

The global batch is ``micro-batch x devices x accumulation``. Two semantics, chosen by the user:

* ``"keep"``: the global batch stays exactly as it was (or as requested); the fastest
  micro-batch is reached by gradient accumulation when it is smaller. The optimization math is
  unchanged (apart from BatchNorm statistics, which see micro-batches).
* ``"grow"``: the micro-batch is the fastest one and the global batch may grow (never shrink)
  to it; the learning rate follows the global batch, linearly for SGD-like optimizers and by
  the square root for Adam-like ones, with a linear warm-up from the old rate when it grows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["GlobalBatchDecision", "LrRule", "decide_global_batch", "lr_rule_for"]

GlobalBatchMode = Literal["keep", "grow"]
LrRule = Literal["none", "linear", "sqrt"]
LrScaling = Literal["auto", "none", "linear", "sqrt"]

_NONE: tuple[LrRule] = ("none",)
DEFAULT_WARMUP_STEPS = 100
"""Optimizer steps of linear warm-up when ``"grow"`` raises the learning rate."""

# Most specific first; matched against the lower-cased class names of the optimizer's MRO.
_ADAPTIVE: tuple[str, ...] = ("adamw", "adam", "adamax", "nadam", "radam", "sparseadam", "lamb")
_ADAPTIVE += ("adafactor", "adagrad", "adadelta", "rmsprop")
_SGD_LIKE = ("sgd", "asgd", "lars")


def lr_rule_for(optimizer_names: Sequence[str], lr_scaling: LrScaling) -> LrRule:
    """The scaling rule for one optimizer, from its class names (most derived first).

    Raises:
        ValueError: If ``lr_scaling="auto"`` and the optimizer is neither SGD- nor Adam-like.
    """
    if lr_scaling != "auto":
        return lr_scaling
    for name in (n.lower() for n in optimizer_names):
        if name in _SGD_LIKE:
            return "linear"
        if name in _ADAPTIVE or "adam" in name:
            return "sqrt"
    raise ValueError(
        f"`lr_scaling='auto'` cannot tell how to scale the learning rate of "
        f"{optimizer_names[0] if optimizer_names else 'this optimizer'!r}: it is neither "
        "SGD-like (linear) nor Adam-like (square root); pass lr_scaling='linear', 'sqrt' or "
        "'none'"
    )


@dataclass(frozen=True)
class GlobalBatchDecision:
    """Micro-batch, accumulation and learning-rate factors for one global-batch semantics."""

    batch_size: int
    accumulate_grad_batches: int
    global_batch_size: int
    previous_global_batch_size: int
    lr_scales: tuple[float, ...]
    """One factor per optimizer (1.0: unchanged)."""
    lr_rules: tuple[LrRule, ...]
    lr_warmup_steps: int
    notes: tuple[str, ...]


def _check_target(target: int, devices: int) -> int:
    if target < devices:
        raise ValueError(
            f"`target_global_batch_size` must be at least one sample per device, got {target} "
            f"for {devices} devices; pass a value >= {devices}"
        )
    if target % devices:
        lower, upper = target - target % devices, target - target % devices + devices
        raise ValueError(
            f"`target_global_batch_size` must be divisible by the number of devices, got "
            f"{target} for {devices} devices; pass {lower} or {upper}"
        )
    return target // devices


def _keep_micro_batch(per_device: int, fastest: int, safe_max: int) -> int:
    """A divisor of ``per_device``: the smallest >= ``fastest`` that fits, else the largest."""
    if per_device <= fastest:
        return per_device
    small = [d for d in range(1, math.isqrt(per_device) + 1) if per_device % d == 0]
    divisors = sorted({*small, *(per_device // d for d in small)})
    above = [d for d in divisors if fastest <= d <= safe_max]
    return min(above) if above else max(d for d in divisors if d <= fastest)


def decide_global_batch(
    *,
    mode: GlobalBatchMode,
    fastest: int,
    safe_max: int,
    previous_batch_size: int,
    previous_accumulation: int,
    devices: int,
    target_global_batch_size: int | None,
    optimizer_names: Sequence[Sequence[str]],
    lr_scaling: LrScaling,
    lr_warmup_steps: int | None,
) -> GlobalBatchDecision:
    """Turn the fastest micro-batch into ``(micro-batch, accumulation, LR factors)``.

    Args:
        mode: ``"keep"`` or ``"grow"`` (see the module docstring).
        fastest: The search's pick (per device).
        safe_max: Largest per-device batch the search allows.
        previous_batch_size: The per-device batch before the search.
        previous_accumulation: Gradient accumulation before the search.
        devices: Data-parallel processes (world size).
        target_global_batch_size: The global batch to keep (``"keep"``) or the smallest one
            allowed (``"grow"``); defaults to ``previous_batch_size * devices *
            previous_accumulation``.
        optimizer_names: Per optimizer, its class names (MRO), for ``lr_scaling="auto"``.
        lr_scaling: ``"auto"``, ``"linear"``, ``"sqrt"`` or ``"none"`` (``"grow"`` only).
        lr_warmup_steps: Warm-up when the rate grows; ``None``: ``DEFAULT_WARMUP_STEPS``.

    Raises:
        ValueError: For requests no micro-batch can satisfy.
    """
    if mode not in ("keep", "grow"):
        raise ValueError(f"`global_batch` must be 'keep' or 'grow', got {mode!r}")
    if lr_scaling not in ("auto", "none", "linear", "sqrt"):
        raise ValueError(
            f"`lr_scaling` must be one of ('auto', 'none', 'linear', 'sqrt'), got {lr_scaling!r}"
        )
    if lr_warmup_steps is not None and lr_warmup_steps < 0:
        raise ValueError(f"`lr_warmup_steps` must be >= 0 or None, got {lr_warmup_steps}")
    previous_global = previous_batch_size * devices * previous_accumulation
    target = previous_global if target_global_batch_size is None else target_global_batch_size
    per_device = _check_target(target, devices)
    notes: list[str] = []
    n_opt = len(optimizer_names)
    if mode == "keep":
        if target != previous_global:
            notes.append(
                f"global batch {previous_global} -> {target} as requested; the learning rate "
                "is left as it is"
            )
        micro = _keep_micro_batch(per_device, fastest, safe_max)
        if micro < fastest and per_device > fastest:
            notes.append(
                f"per-device batch {per_device} has no divisor between the fastest micro-batch "
                f"{fastest} and the safe maximum {safe_max}; using {micro}"
            )
        if per_device < fastest:
            notes.append(
                f"the fastest micro-batch {fastest} is larger than the per-device batch "
                f"{per_device} that global_batch='keep' preserves; pass global_batch='grow' to "
                "train at it with a scaled learning rate"
            )
        accumulation = per_device // micro
        return GlobalBatchDecision(
            micro,
            accumulation,
            target,
            previous_global,
            (1.0,) * n_opt,
            _NONE * n_opt,
            0,
            tuple(notes),
        )
    accumulation = max(1, math.ceil(per_device / fastest))
    new_global = fastest * devices * accumulation
    # The learning rate was tuned for the previous global batch, so it follows from there.
    ratio = new_global / previous_global
    rules = tuple(lr_rule_for(names, lr_scaling) for names in optimizer_names)
    scales = tuple({"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule] for rule in rules)
    grows = any(s > 1.0 for s in scales)
    warmup = (DEFAULT_WARMUP_STEPS if lr_warmup_steps is None else lr_warmup_steps) * grows
    if ratio != 1.0 and all(r == "none" for r in rules):
        notes.append(
            f"global batch {previous_global} -> {new_global} without learning-rate scaling "
            "(lr_scaling='none')"
        )
    return GlobalBatchDecision(
        fastest, accumulation, new_global, previous_global, scales, rules, warmup, tuple(notes)
    )
