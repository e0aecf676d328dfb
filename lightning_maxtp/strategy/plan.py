"""``plan_strategy``: single device, DDP or FSDP, chosen from the free GPUs and the model's size.

Pure: plain data in (the probe's ``Resources``, a ``ModelSize`` or a parameter count, precision,
optimizer, devices, nodes), a ``StrategyPlan`` out, and no torch or lightning import. The
memory formula is in ``memory``; the Lightning strategy that applies
a plan, ``AutoMaxTP`` (``Trainer(strategy="auto_maxtp")``), is in ``auto_maxtp``.

The rules, in order:

1. CPU (no GPU visible, or ``accelerator="cpu"``): one process, or DDP over gloo when several
   are asked for; a warning when the processes together need more than the available RAM.
2. GPUs busy with other jobs (foreign processes, or memory in use that no process of ours
   explains) are skipped and named. ``devices="auto"`` takes every free GPU, a count takes that
   many free GPUs (which ones is a knob the library may choose), an explicit list is used as
   given (a busy GPU in it warns). More GPUs than are free, or no free GPU, is an error.
3. One GPU: single device. When the model does not fit: FSDP with CPU offload if host RAM holds
   the model state (slower, and warned), else single device with a warning; never silently.
4. Several GPUs: DDP when a full copy fits on one GPU with headroom; FSDP ``FULL_SHARD`` when
   it does not but a shard does; then FSDP with CPU offload; else FSDP with a warning.
5. ``num_nodes > 1``: FSDP shards over every rank of every node; the devices are those given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lightning_maxtp._checks import COUNT, refuse_bool
from lightning_maxtp._units import GIB, format_bytes
from lightning_maxtp.resources.probe import DEFAULT_HEADROOM_BYTES, Resources
from lightning_maxtp.strategy.devices import Devices, choose_gpus, gpu_budget
from lightning_maxtp.strategy.memory import MemoryEstimate, estimate_memory
from lightning_maxtp.strategy.model_size import ModelSize

__all__ = ["MemoryEstimate", "ModelSize", "StrategyPlan", "plan_strategy"]

StrategyName = Literal["single_device", "ddp", "fsdp"]

_LABELS = {"single_device": "single device", "ddp": "DDP", "fsdp": "FSDP (FULL_SHARD)"}


@dataclass(frozen=True)
class StrategyPlan:
    """Which strategy to run on which devices, and why (the numbers are in ``reason``)."""

    strategy: StrategyName
    accelerator: Literal["cpu", "cuda"]
    devices: tuple[int, ...]
    """CUDA ordinals used on each node; empty on the CPU."""
    num_processes: int
    """Processes per node (1 for a single device)."""
    num_nodes: int
    cpu_offload: bool
    """FSDP keeps parameters, gradients and optimizer state in host RAM."""
    need_bytes: int
    """Estimated memory per device (per process on the CPU) under the chosen strategy."""
    budget_bytes: int | None
    """Memory per device the plan may use; ``None`` when unknown."""
    fits: bool | None
    reason: str
    skipped: tuple[str, ...]
    """GPUs left out, each with why."""
    warnings: tuple[str, ...]
    memory: MemoryEstimate

    @property
    def world_size(self) -> int:
        """Processes over all nodes."""
        return self.num_processes * self.num_nodes

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (``from_dict`` reads it back)."""
        return {
            "strategy": self.strategy,
            "accelerator": self.accelerator,
            "devices": list(self.devices),
            "num_processes": self.num_processes,
            "num_nodes": self.num_nodes,
            "cpu_offload": self.cpu_offload,
            "need_bytes": self.need_bytes,
            "budget_bytes": self.budget_bytes,
            "fits": self.fits,
            "reason": self.reason,
            "skipped": list(self.skipped),
            "warnings": list(self.warnings),
            "memory": self.memory.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StrategyPlan:
        """Inverse of ``to_dict`` (how DDP child processes receive the launching process's plan)."""
        return cls(
            strategy=data["strategy"],
            accelerator=data["accelerator"],
            devices=tuple(data["devices"]),
            num_processes=data["num_processes"],
            num_nodes=data["num_nodes"],
            cpu_offload=data["cpu_offload"],
            need_bytes=data["need_bytes"],
            budget_bytes=data["budget_bytes"],
            fits=data["fits"],
            reason=data["reason"],
            skipped=tuple(data["skipped"]),
            warnings=tuple(data["warnings"]),
            memory=MemoryEstimate.from_dict(data["memory"]),
        )

    def __str__(self) -> str:
        label = _LABELS[self.strategy] + (" + CPU offload" if self.cpu_offload else "")
        if self.accelerator == "cpu":
            where = (
                "1 CPU process"
                if self.num_processes == 1
                else f"{self.num_processes} CPU processes"
            )
        else:
            where = f"GPU{'s' if len(self.devices) > 1 else ''} {list(self.devices)}"
        nodes = f" x {self.num_nodes} nodes" if self.num_nodes > 1 else ""
        return (
            f"maxtp: strategy: {label} on {where}{nodes}. {self.reason} [{self.memory.breakdown()}]"
        )


def plan_strategy(
    resources: Resources,
    model: ModelSize | int,
    *,
    precision: str | int = "32-true",
    optimizer: str | int = "adam",
    activation_bytes: int | None = None,
    training: bool = True,
    accelerator: Literal["auto", "cpu", "cuda"] = "auto",
    devices: Devices = "auto",
    num_nodes: int = 1,
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
    memory_budget_bytes: int | None = None,
    memory_basis: Literal["free", "total"] = "free",
    cpu_offload: bool = True,
) -> StrategyPlan:
    """Choose single device, DDP or FSDP for a model on this machine (rules: module docstring).

    Args:
        resources: The probe's result (``inspect_resources()``); GPUs, their free memory and
            foreign processes, and host RAM are read from it.
        model: ``ModelSize.from_module(model)``, or a parameter count (fp32, all trainable).
        precision: Lightning's precision name; decides bytes per parameter.
        optimizer: ``"adam"``, ``"adamw"``, ``"sgd"``, ``"sgd_momentum"``, ... or the number of
            optimizer states per parameter.
        activation_bytes: Measured activation memory per device; ``None`` estimates it.
        training: ``False`` to plan validate/test/predict (weights and activations only).
        accelerator: ``"auto"`` (GPUs when any is visible), ``"cpu"`` or ``"cuda"``.
        devices: ``"auto"``, a count (``-1``: all), or a list of CUDA ordinals used as given.
        num_nodes: Nodes in the job; each runs the same devices.
        headroom_bytes: Memory kept free on each GPU (CUDA context, allocator fragmentation).
        memory_budget_bytes: Optional cap on the memory per GPU the plan may use.
        memory_basis: ``"free"`` (memory free now) or ``"total"`` (the same on every rank,
            for processes that each plan on their own).
        cpu_offload: Allow FSDP with CPU offload when nothing else fits.

    Returns:
        The ``StrategyPlan``; its ``warnings`` say when the request cannot be met as asked.

    Raises:
        ValueError: For an argument out of range, or a device request the free GPUs cannot meet.
    """
    _validate(accelerator, num_nodes, headroom_bytes, memory_budget_bytes, memory_basis)
    memory = estimate_memory(
        model,
        precision=precision,
        optimizer=optimizer,
        activation_bytes=activation_bytes,
        training=training,
    )
    if accelerator == "cpu" or (accelerator == "auto" and not resources.gpus):
        return _plan_cpu(resources, memory, devices, num_nodes)
    if not resources.gpus:
        raise ValueError(
            "`accelerator='cuda'` but no GPU is visible to this process "
            f"(CUDA_VISIBLE_DEVICES={resources.cuda_visible_devices!r}); pass accelerator='cpu'"
        )
    chosen, skipped, warnings = choose_gpus(resources, devices)
    budget = gpu_budget(resources, chosen, memory_basis, headroom_bytes, memory_budget_bytes)
    ram = resources.memory.effective_available_bytes
    plan = _plan_gpus(
        memory,
        gpus=len(chosen),
        num_nodes=num_nodes,
        budget=budget,
        ram=ram,
        allow_offload=cpu_offload,
    )
    strategy, need, fits, offload, why, more = plan
    usable = (
        f"{format_bytes(budget)} usable per GPU ({memory_basis} memory - "
        f"{format_bytes(headroom_bytes)} headroom"
        + (f", capped at {format_bytes(memory_budget_bytes)}" if memory_budget_bytes else "")
        + ")"
    )
    reason = f"{why}; {usable}" if budget is not None else why
    if skipped:
        reason += "; skipped " + "; ".join(skipped)
    return StrategyPlan(
        strategy=strategy,
        accelerator="cuda",
        devices=tuple(chosen),
        num_processes=1 if strategy == "single_device" else len(chosen),
        num_nodes=num_nodes,
        cpu_offload=offload,
        need_bytes=need,
        budget_bytes=budget,
        fits=fits,
        reason=reason,
        skipped=tuple(skipped),
        warnings=(*warnings, *more),
        memory=memory,
    )


def _validate(
    accelerator: str, num_nodes: int, headroom: int, budget: int | None, basis: str
) -> None:
    if accelerator not in ("auto", "cpu", "cuda"):
        raise ValueError(f"`accelerator` must be 'auto', 'cpu' or 'cuda', got {accelerator!r}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"`num_nodes` must be an int >= 1, got {num_nodes!r}")
    refuse_bool("headroom_bytes", headroom, f"{COUNT} of bytes >= 0", 2 * GIB)
    refuse_bool("memory_budget_bytes", budget, f"{COUNT} of bytes > 0 or None", 8 * GIB)
    if headroom < 0:
        raise ValueError(f"`headroom_bytes` must be >= 0, got {headroom!r}")
    if budget is not None and budget <= 0:
        raise ValueError(
            f"`memory_budget_bytes` must be None or > 0, got {budget!r}; pass e.g. 8 * 2**30"
        )
    if basis not in ("free", "total"):
        raise ValueError(f"`memory_basis` must be 'free' or 'total', got {basis!r}")


def _plan_cpu(
    resources: Resources, memory: MemoryEstimate, devices: Devices, num_nodes: int
) -> StrategyPlan:
    if devices == "auto":
        count = 1
    elif isinstance(devices, int) and not isinstance(devices, bool):
        count = resources.cpu.effective if devices == -1 else devices
    elif isinstance(devices, Sequence) and not isinstance(devices, str):
        count = len(devices)
    else:
        count = 0
    if count < 1:
        raise ValueError(
            f"`devices` must be 'auto', an int >= 1 (or -1) or a non-empty list, got {devices!r}"
        )
    parallel = count > 1 or num_nodes > 1
    need = memory.ddp_bytes() if parallel else memory.single_device_bytes()
    ram = resources.memory.effective_available_bytes
    fits = None if ram is None else count * need <= ram
    head = "no GPU visible" if not resources.gpus else "accelerator='cpu'"
    total = f"{format_bytes(count * need)} of {format_bytes(ram)} RAM available"
    if parallel:
        why = (
            f"{head}, {count} processes per node asked for: DDP over gloo; ~{format_bytes(need)} "
            f"per process, {count} x = {total}"
        )
    else:
        why = f"{head}: one CPU process; needs ~{total}"
    warnings: tuple[str, ...] = ()
    if fits is False:
        warnings = (
            f"maxtp: {count} CPU process(es) need ~{format_bytes(count * need)} of host RAM "
            f"but only {format_bytes(ram)} is available; expect swapping or an out-of-memory "
            "kill. Fix: "
            "fewer devices, a smaller batch (activations), or precision='bf16-true'",
        )
    return StrategyPlan(
        strategy="ddp" if parallel else "single_device",
        accelerator="cpu",
        devices=(),
        num_processes=count,
        num_nodes=num_nodes,
        cpu_offload=False,
        need_bytes=need,
        budget_bytes=ram,
        fits=fits,
        reason=why,
        skipped=(),
        warnings=warnings,
        memory=memory,
    )


def _plan_gpus(
    memory: MemoryEstimate,
    *,
    gpus: int,
    num_nodes: int,
    budget: int | None,
    ram: int | None,
    allow_offload: bool,
) -> tuple[StrategyName, int, bool | None, bool, str, list[str]]:
    """``(strategy, need per GPU, fits, cpu_offload, why, warnings)`` for ``gpus`` per node."""
    world = gpus * num_nodes
    full = memory.ddp_bytes() if world > 1 else memory.single_device_bytes()
    copy = f"a full copy needs ~{format_bytes(full)} per GPU"
    if budget is None:
        why = (
            f"GPU memory is unknown, so whether a full copy (~{format_bytes(full)} per GPU) fits "
            "cannot be checked: Lightning's default"
        )
        return (
            ("single_device" if world == 1 else "ddp"),
            full,
            None,
            False,
            why,
            [f"maxtp: {why}"],
        )
    if full <= budget:
        why = f"{copy} and fits"
        return ("single_device" if world == 1 else "ddp"), full, True, False, why, []
    shard = memory.fsdp_bytes(world)
    if world > 1 and shard <= budget:
        return (
            "fsdp",
            shard,
            True,
            False,
            f"{copy}; sharded over {world} GPUs ~{format_bytes(shard)}",
            [],
        )
    offload = memory.fsdp_bytes(world, cpu_offload=True)
    host = gpus * memory.fsdp_host_bytes(world)
    sharded = f"; sharded over {world} GPUs ~{format_bytes(shard)}" if world > 1 else ""
    if allow_offload and offload <= budget and ram is not None and host <= ram:
        why = (
            f"{copy}{sharded}; with CPU offload ~{format_bytes(offload)} per GPU and "
            f"{format_bytes(host)} of {format_bytes(ram)} host RAM"
        )
        warn = (
            "maxtp: the model does not fit on the GPU(s), so FSDP keeps parameters, "
            "gradients and optimizer state in host RAM (CPU offload): expect steps several times "
            "slower. Faster fixes: more GPUs, precision='bf16-true', an optimizer with fewer "
            "states (SGD), activation checkpointing or a smaller batch"
        )
        return "fsdp", offload, True, True, why, [warn]
    need = shard if world > 1 else full
    why = f"{copy}{sharded}: it does not fit even so"
    warn = (
        f"maxtp: the model needs ~{format_bytes(need)} per GPU but only {format_bytes(budget)} "
        f"is usable on {world} GPU(s); it will likely run out of memory. Fix: "
        + ("more free GPUs (FSDP shards over them), " if world == 1 else "more GPUs, ")
        + "precision='bf16-true', an optimizer with fewer states (SGD), activation "
        "checkpointing or a smaller batch"
    )
    return ("fsdp" if world > 1 else "single_device"), need, False, False, why, [warn]
