"""Build the Lightning strategy a ``StrategyPlan`` names, configured as ``AutoMaxTP`` was."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from lightning.pytorch.plugins.precision import (
    FSDPPrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
)
from lightning.pytorch.strategies import (
    DDPStrategy,
    FSDPStrategy,
    SingleDeviceStrategy,
    Strategy,
)

from lightning_maxtp._compat.lightning_strategy import IS_INTERACTIVE, ddp_settings, finish_strategy
from lightning_maxtp.strategy.devices import Devices
from lightning_maxtp.strategy.model_size import FSDP_MIN_UNIT_PARAMS
from lightning_maxtp.strategy.plan import StrategyPlan

__all__ = ["build_strategy", "devices_flag", "fsdp_precision"]


def build_strategy(
    plan: StrategyPlan, template: DDPStrategy, fsdp_kwargs: dict[str, Any] | None = None
) -> Strategy:
    """The Lightning strategy for ``plan``, set up as Lightning set up ``template``.

    Args:
        plan: What to build.
        template: The strategy Lightning configured (``AutoMaxTP``): its accelerator, precision,
            cluster environment, checkpoint IO, DDP arguments and layer sync are kept.
        fsdp_kwargs: Extra ``FSDPStrategy`` arguments, used when the plan is FSDP.
    """
    if plan.accelerator == "cuda":
        devices = [torch.device("cuda", i) for i in plan.devices]
    else:
        devices = [torch.device("cpu")] * plan.num_processes
    settings = ddp_settings(template)
    common = {"accelerator": template.accelerator, "checkpoint_io": settings.pop("checkpoint_io")}
    precision = settings.pop("precision_plugin")
    if plan.strategy == "single_device":
        return SingleDeviceStrategy(device=devices[0], precision_plugin=precision, **common)
    parallel = {
        "parallel_devices": devices,
        "cluster_environment": template.cluster_environment,
        "process_group_backend": settings.pop("process_group_backend"),
        "timeout": settings.pop("timeout"),
        **common,
    }
    strategy: DDPStrategy | FSDPStrategy
    if plan.strategy == "ddp":
        start = settings.pop("start_method")
        strategy = DDPStrategy(
            precision_plugin=precision,
            start_method="fork" if start == "popen" and IS_INTERACTIVE else start,
            **parallel,
            **settings,
        )
    else:
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

        kwargs: dict[str, Any] = {
            "auto_wrap_policy": partial(
                size_based_auto_wrap_policy, min_num_params=FSDP_MIN_UNIT_PARAMS
            ),
            **(fsdp_kwargs or {}),
            "cpu_offload": plan.cpu_offload,
        }
        strategy = FSDPStrategy(precision_plugin=fsdp_precision(precision), **parallel, **kwargs)
    strategy.num_nodes = template.num_nodes
    finish_strategy(strategy, template)
    return strategy


def fsdp_precision(plugin: Precision | None) -> FSDPPrecision:
    """The FSDP precision plugin for the one Lightning chose for a non-FSDP strategy.

    Raises:
        ValueError: For a custom precision plugin FSDP cannot take over.
    """
    if plugin is None:
        return FSDPPrecision("32-true")
    if isinstance(plugin, FSDPPrecision):
        return plugin
    if type(plugin) in (Precision, MixedPrecision, HalfPrecision):
        return FSDPPrecision(plugin.precision)  # type: ignore[arg-type]
    raise ValueError(
        f"strategy='auto_maxtp' chose FSDP, which needs an FSDPPrecision plugin, but the Trainer "
        f"has {type(plugin).__name__}; pass `precision=` instead of a precision plugin, or "
        "choose the strategy yourself (strategy='ddp') to keep it"
    )


def devices_flag(indices: list[int], visible: list[int]) -> Devices:
    """Lightning's parsed CUDA device list, read back as the request it most likely came from.

    Lightning hands a strategy only the parsed list: all visible GPUs reads as ``"auto"``,
    ``[0, .., k-1]`` as a count ``k`` (taken from the free GPUs), anything else as a list.
    """
    if sorted(indices) == sorted(visible):
        return "auto"
    if indices == list(range(len(indices))):
        return len(indices)
    return indices
