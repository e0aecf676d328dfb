"""lightning_maxtp: run PyTorch Lightning jobs at the machine's limit without hand-tuning.

The public API is imported lazily (PEP 562), so ``import lightning_maxtp`` and the ``maxtp`` CLI
stay fast: nothing here imports torch or lightning until a name that needs it is used. The one
side effect is registering ``Trainer(strategy="auto_maxtp")``, deferred until lightning itself
is imported (``lightning_maxtp/_register.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_maxtp import _register

__version__ = "0.1.0.dev0"

_LAZY = {
    "AutoMaxTP": "lightning_maxtp._auto_maxtp",
    "ModelSize": "lightning_maxtp.strategy",
    "Resources": "lightning_maxtp.resources",
    "StrategyPlan": "lightning_maxtp.strategy",
    "inspect_resources": "lightning_maxtp.resources",
    "plan_strategy": "lightning_maxtp.strategy",
}

__all__ = [
    "AutoMaxTP",
    "ModelSize",
    "Resources",
    "StrategyPlan",
    "__version__",
    "inspect_resources",
    "plan_strategy",
]

if TYPE_CHECKING:
    from lightning_maxtp._auto_maxtp import AutoMaxTP
    from lightning_maxtp.resources import Resources, inspect_resources
    from lightning_maxtp.strategy import ModelSize, StrategyPlan, plan_strategy


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_maxtp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


_register.install()
