"""lightning_maxtp: run PyTorch Lightning jobs at the machine's limit without hand-tuning.

The public API is imported lazily (PEP 562), so ``import lightning_maxtp`` and the ``maxtp`` CLI
stay fast: nothing here imports torch or lightning until a name that needs it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

_LAZY = {
    "Resources": "lightning_maxtp.resources",
    "inspect_resources": "lightning_maxtp.resources",
}

__all__ = ["Resources", "__version__", "inspect_resources"]

if TYPE_CHECKING:
    from lightning_maxtp.resources import Resources, inspect_resources


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_maxtp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
