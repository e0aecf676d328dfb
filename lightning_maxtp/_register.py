"""Register ``Trainer(strategy="auto_maxtp")`` without importing lightning.

Lightning has no entry point for strategies (only for callbacks, and those load after the
strategy is chosen), so the name exists only once code has called
``StrategyRegistry.register``. ``import lightning_maxtp`` must not import lightning (8 s here;
the CLI and spawned workers stay fast), so ``install()`` registers at the right moment instead:

* ``lightning.pytorch`` already imported: register now;
* otherwise: put a finder first on ``sys.meta_path`` that, when ``lightning.pytorch`` is
  imported, wraps its loader so the registration runs right after the module's body has run.
  The finder then removes itself, and the module gets its real loader back (``reload``,
  ``importlib.resources`` and ``inspect`` see the usual one).

Both paths are idempotent, and a DDP child that re-runs the script (or a spawned one that
re-imports ``__main__``) goes through the same ``import lightning_maxtp`` and registers in its
turn. The standalone ``pytorch_lightning`` package has its own registry and is not covered.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

__all__ = ["STRATEGY_NAME", "install"]

log = logging.getLogger(__name__)

STRATEGY_NAME = "auto_maxtp"
_TARGET = "lightning.pytorch"
_MARK = "_lightning_maxtp_hook"


def install() -> None:
    """Register the strategy name now, or as soon as ``lightning.pytorch`` has been imported."""
    if _TARGET in sys.modules:
        _register_or_warn()
        return
    if not any(getattr(finder, _MARK, False) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def _register() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    if STRATEGY_NAME not in StrategyRegistry:
        StrategyRegistry.register(
            STRATEGY_NAME,
            _make_strategy,
            description="lightning_maxtp: single device, DDP or FSDP chosen from the free GPUs "
            "and the model's size when the model is known",
        )


def _register_or_warn() -> None:
    try:
        _register()
    except Exception as err:  # never break the user's `import lightning`
        warnings.warn(
            f"lightning_maxtp could not register strategy={STRATEGY_NAME!r}: {err!r}; pass "
            "strategy=lightning_maxtp.AutoMaxTP() instead",
            RuntimeWarning,
            stacklevel=2,
        )


def _make_strategy(**kwargs: Any) -> Any:
    """The registry's factory: imports the strategy (and its torch/lightning) only when used."""
    from lightning_maxtp.strategy.auto_maxtp import AutoMaxTP

    return AutoMaxTP(**kwargs)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands ``lightning.pytorch``'s real spec back with a wrapped loader."""

    _lightning_maxtp_hook = True

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != _TARGET:
            return None
        spec: ModuleSpec | None = None
        for finder in list(sys.meta_path):
            if getattr(finder, _MARK, False):
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is not None:
                spec = find_spec(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            log.debug("%s: no loader to wrap; strategy %r not registered", _TARGET, STRATEGY_NAME)
            return spec
        spec.loader = _RegisteringLoader(spec.loader, self)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    """Delegates to the real loader and registers once the module has executed."""

    def __init__(self, loader: importlib.abc.Loader, finder: _PostImportFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self._finder)
        _register_or_warn()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
