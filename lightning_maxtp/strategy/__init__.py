"""Single device, DDP or FSDP: ``plan_strategy`` (pure) and ``Trainer(strategy="auto_maxtp")``.

``plan`` chooses from the free GPUs (``devices``) and the model's training memory (``memory``,
over ``model_size``); ``auto_maxtp`` is the registered Lightning strategy that plans when ``fit``
starts and ``build``-s the strategy the plan names. Importing this package imports neither torch
nor lightning; ``AutoMaxTP`` (which needs lightning) is loaded when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_maxtp.strategy.memory import MemoryEstimate, estimate_memory
from lightning_maxtp.strategy.model_size import ModelSize
from lightning_maxtp.strategy.plan import StrategyPlan, plan_strategy

if TYPE_CHECKING:
    from lightning_maxtp.strategy.auto_maxtp import AutoMaxTP

__all__ = [
    "AutoMaxTP",
    "MemoryEstimate",
    "ModelSize",
    "StrategyPlan",
    "estimate_memory",
    "plan_strategy",
]


def __getattr__(name: str) -> Any:
    if name == "AutoMaxTP":
        from lightning_maxtp.strategy.auto_maxtp import AutoMaxTP

        return AutoMaxTP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
