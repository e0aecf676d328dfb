"""Device memory a model needs to train: the formula behind ``plan_strategy`` (pure).

Bytes per parameter, by precision (``w`` weight, ``g`` gradient, ``s`` one optimizer state,
``c`` autocast copy, ``b`` the dtype the forward pass computes in):

=====================  ===  ===  ===  ===  ===
precision               w    g    s    c    b
=====================  ===  ===  ===  ===  ===
32-true                 4    4    4    0    4
16-mixed, bf16-mixed    4    4    4    2    2
16-true, bf16-true      2    2    2    0    2
64-true                 8    8    8    0    8
=====================  ===  ===  ===  ===  ===

Mixed precision (AMP) keeps the parameters in fp32: they are the master weights, so gradients
and optimizer states are fp32 too, and autocast makes a half-precision copy of every weight it
casts, which autograd keeps until the backward pass has used it. Mixed precision therefore
needs *more* memory for the model state than fp32, not less; only activations shrink. ``*-true``
precisions hold everything, optimizer states included, in the half-precision dtype.

With ``N`` parameters of which ``T`` are trainable, ``k`` optimizer states per parameter
(``OPTIMIZER_STATES``: Adam/AdamW 2, SGD with momentum 1, plain SGD 0) and activations ``A``:

* model state ``S = N*w + T*g + T*k*s`` (gradients and optimizer state only when training);
* one device holding a full copy: ``S + N*c + A``;
* DDP, per GPU: the same plus ``T*g`` for DDP's gradient buckets (a second copy of the
  gradients that the all-reduce works on; Lightning does not turn on
  ``gradient_as_bucket_view``). Outside ``fit`` Lightning does not wrap the model, so no buckets;
* FSDP ``FULL_SHARD`` over ``W`` ranks, per GPU: ``S / W + 3*U*b + A``, where ``U`` is the
  largest FSDP unit (``ModelSize.largest_unit_params``): two units of gathered parameters (the
  one computing and the one prefetched) and one unit of unsharded gradients before the
  reduce-scatter (``2*U*b`` outside ``fit``). FSDP gathers parameters already in ``b``, so no
  autocast copies;
* FSDP with CPU offload: the GPU holds ``3*U*b + A``; each process keeps ``S / W`` in host RAM.

``A`` is measured when the caller passes it (``activation_bytes``: the peak memory of a real
step minus the model state), else estimated as ``ACTIVATION_SHARE`` of ``S + N*c``. That share
is a guess for moderate batches: activations grow with batch size and sequence length, and a
convolutional network at a large batch can need many times its model state. The plan says which.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lightning_maxtp._units import format_bytes
from lightning_maxtp.strategy.model_size import ModelSize

__all__ = [
    "ACTIVATION_SHARE",
    "OPTIMIZER_STATES",
    "PRECISION_BYTES",
    "MemoryEstimate",
    "estimate_memory",
    "normalize_precision",
]

PRECISION_BYTES: dict[str, tuple[int, int, int, int, int]] = {
    "32-true": (4, 4, 4, 0, 4),
    "16-mixed": (4, 4, 4, 2, 2),
    "bf16-mixed": (4, 4, 4, 2, 2),
    "16-true": (2, 2, 2, 0, 2),
    "bf16-true": (2, 2, 2, 0, 2),
    "64-true": (8, 8, 8, 0, 8),
}
"""``(w, g, s, c, b)`` bytes per parameter for each of Lightning's precision names."""

_PRECISION_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}

OPTIMIZER_STATES: dict[str, int] = {
    "adam": 2,
    "adamw": 2,
    "sgd": 0,
    "sgd_momentum": 1,
    "rmsprop": 1,
    "adagrad": 1,
}
"""Optimizer states kept per parameter (Adam: ``exp_avg`` and ``exp_avg_sq``; SGD with
momentum: the momentum buffer)."""

ACTIVATION_SHARE = 0.25
"""Activations as a share of the model state (``S + N*c``) when no measurement is given."""


def normalize_precision(precision: str | int) -> str:
    """Lightning's precision name for ``precision`` (``"bf16"`` -> ``"bf16-mixed"``, 32 -> ...).

    Raises:
        ValueError: If the precision is not in ``PRECISION_BYTES`` (or an alias of one).
    """
    name = _PRECISION_ALIASES.get(str(precision), str(precision))
    if name not in PRECISION_BYTES:
        raise ValueError(
            f"`precision` must be one of {sorted(PRECISION_BYTES)}, got {precision!r}; pass the "
            "name Lightning uses, e.g. precision='bf16-mixed'"
        )
    return name


@dataclass(frozen=True)
class MemoryEstimate:
    """The terms of the memory formula for one model, precision and optimizer (bytes)."""

    model: ModelSize
    precision: str
    optimizer: str
    optimizer_states: int
    training: bool
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    autocast_bytes: int
    activation_bytes: int
    activation_measured: bool
    compute_bytes_per_param: int

    @property
    def state_bytes(self) -> int:
        """``S``: weights, gradients and optimizer state."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    def single_device_bytes(self) -> int:
        """One device holding a full copy: ``S + N*c + A``."""
        return self.state_bytes + self.autocast_bytes + self.activation_bytes

    def ddp_bytes(self) -> int:
        """Per GPU under DDP: a full copy plus the gradient buckets (when training)."""
        return self.single_device_bytes() + self.grad_bytes

    def fsdp_bytes(self, world_size: int, *, cpu_offload: bool = False) -> int:
        """Per GPU under FSDP ``FULL_SHARD`` over ``world_size`` ranks."""
        units = (3 if self.training else 2) * self.model.largest_unit_params
        gathered = units * self.compute_bytes_per_param
        sharded = 0 if cpu_offload else math.ceil(self.state_bytes / world_size)
        return sharded + gathered + self.activation_bytes

    def fsdp_host_bytes(self, world_size: int) -> int:
        """Host RAM per process under FSDP with CPU offload: the shard of the model state."""
        return math.ceil(self.state_bytes / world_size)

    def breakdown(self) -> str:
        """The terms as one short phrase, for the plan's reason."""
        how = "measured" if self.activation_measured else f"est. {ACTIVATION_SHARE:.0%} of state"
        terms = [f"weights {format_bytes(self.weight_bytes)}"]
        if self.training:
            terms.append(f"grads {format_bytes(self.grad_bytes)}")
            terms.append(f"{self.optimizer} state {format_bytes(self.optimizer_bytes)}")
        if self.autocast_bytes:
            terms.append(f"autocast copies {format_bytes(self.autocast_bytes)}")
        terms.append(f"activations {format_bytes(self.activation_bytes)} ({how})")
        return f"{self.model}, {self.precision}: " + " + ".join(terms)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view, with the per-device totals."""
        data = asdict(self)
        data["state_bytes"] = self.state_bytes
        data["single_device_bytes"] = self.single_device_bytes()
        data["ddp_bytes"] = self.ddp_bytes()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryEstimate:
        """Inverse of ``to_dict`` (derived keys are ignored)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["model"] = ModelSize(**data["model"])
        return cls(**fields)

    def __str__(self) -> str:
        return f"~{format_bytes(self.single_device_bytes())} on one device = {self.breakdown()}"


def estimate_memory(
    model: ModelSize | int,
    *,
    precision: str | int = "32-true",
    optimizer: str | int = "adam",
    activation_bytes: int | None = None,
    training: bool = True,
) -> MemoryEstimate:
    """Evaluate the module docstring's formula for one model.

    Args:
        model: A ``ModelSize`` (``ModelSize.from_module(model)``) or a parameter count.
        precision: Lightning's precision name (``"32-true"``, ``"bf16-mixed"``, ...).
        optimizer: A name from ``OPTIMIZER_STATES`` or the number of states per parameter.
        activation_bytes: Measured activation memory per device; ``None`` estimates it.
        training: ``False`` for validate/test/predict: no gradients, optimizer state or buckets.

    Raises:
        ValueError: For an unknown precision or optimizer, or negative activation bytes.
    """
    size = model if isinstance(model, ModelSize) else ModelSize.from_count(model)
    name = normalize_precision(precision)
    w, g, s, c, b = PRECISION_BYTES[name]
    if isinstance(optimizer, int) and not isinstance(optimizer, bool) and optimizer >= 0:
        states, label = optimizer, f"{optimizer}-state optimizer"
    elif isinstance(optimizer, str) and optimizer.lower() in OPTIMIZER_STATES:
        states, label = OPTIMIZER_STATES[optimizer.lower()], optimizer.lower()
    else:
        raise ValueError(
            f"`optimizer` must be one of {sorted(OPTIMIZER_STATES)} or the number of states per "
            f"parameter (an int >= 0), got {optimizer!r}"
        )
    if activation_bytes is not None and activation_bytes < 0:
        raise ValueError(f"`activation_bytes` must be None or >= 0, got {activation_bytes!r}")
    trainable = size.trainable_params if training else 0
    weights = size.num_params * w
    grads = trainable * g
    opt = trainable * states * s
    autocast = size.num_params * c
    if activation_bytes is None:
        activations = math.ceil(ACTIVATION_SHARE * (weights + grads + opt + autocast))
    else:
        activations = activation_bytes
    return MemoryEstimate(
        model=size,
        precision=name,
        optimizer=label,
        optimizer_states=states,
        training=training,
        weight_bytes=weights,
        grad_bytes=grads,
        optimizer_bytes=opt,
        autocast_bytes=autocast,
        activation_bytes=activations,
        activation_measured=activation_bytes is not None,
        compute_bytes_per_param=b,
    )
