"""Run a transform on every DataLoader a Trainer sets up: the hook behind the loader plan.

The hook point is public: ``Strategy.process_dataloader(dl)`` is called by
``data_connector._process_dataloader`` for every loader, after the distributed sampler is
injected and before ``iter()`` starts workers. We override it on the strategy *instance*, and
read ``trainer.state.stage`` (set before each loop's ``setup_data``) to tell train from val.
``rebuild_dataloader`` builds the same loader with other settings through Lightning's own
private helpers (``lightning_maxtp._compat.lightning_data``). ``PL_SEED_WORKERS`` and
``pl_worker_init_function``: Lightning adds its worker seeding only to loaders without a
``worker_init_fn``; ours has one, so we compose Lightning's in ourselves.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from lightning_maxtp._compat.version import warn_if_lightning_unchecked

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

__all__ = [
    "DataLoaderTransform",
    "dataloader_transform",
    "install_dataloader_transform",
    "lightning_worker_seeding",
    "rebuild_dataloader",
    "stage_name",
]

DataLoaderTransform = Callable[[object, str | None, "pl.Trainer"], object]
"""``(dataloader, stage, trainer) -> dataloader``; stage is ``train``, ``val``, ``test``..."""

_STAGES = {
    "train": "train",
    "sanity_check": "val",
    "validate": "val",
    "test": "test",
    "predict": "predict",
}


def stage_name(trainer: pl.Trainer) -> str | None:
    """``train``, ``val`` (sanity check included), ``test``, ``predict`` or ``None``."""
    stage = trainer.state.stage
    return None if stage is None else _STAGES.get(str(stage.value))


def rebuild_dataloader(dataloader: DataLoader[Any], **overrides: Any) -> DataLoader[Any]:
    """The same DataLoader (class, dataset, sampler, everything else) with ``overrides`` set.

    Raises:
        ValueError: If the loader's class cannot take one of the overrides, or Lightning cannot
            recover its constructor arguments.
    """
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from lightning_maxtp._compat.lightning_data import (
        dataloader_init_args,
        reinstantiate_dataloader,
    )

    cls = type(dataloader)
    try:
        args, kwargs, arg_names = dataloader_init_args(dataloader)
    except MisconfigurationException as exc:
        raise ValueError(
            f"cannot rebuild the `{cls.__name__}` to apply the loader plan: {exc} Create the "
            "loader inside the `*_dataloader()` hook (Lightning then records its arguments) or "
            "build it with `plan.build(loader)` yourself."
        ) from exc
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    positional = list(args)
    for key, value in overrides.items():
        if key in arg_names:
            positional[arg_names.index(key)] = value
        elif key in params or takes_any:
            kwargs[key] = value
        else:
            raise ValueError(
                f"cannot set `{key}={value!r}` on `{cls.__name__}`: its `__init__` takes no "
                f"`{key}` argument; accept `**kwargs` and pass them to `DataLoader.__init__`, or "
                "build it with `plan.build(loader)` yourself."
            )
    rebuilt: DataLoader[Any] = reinstantiate_dataloader(dataloader, *positional, **kwargs)
    return rebuilt


def lightning_worker_seeding(trainer: pl.Trainer) -> Callable[[int], None] | None:
    """The ``worker_init_fn`` Lightning would add under ``seed_everything(workers=True)``."""
    from lightning.fabric.utilities.seed import pl_worker_init_function

    if int(os.environ.get("PL_SEED_WORKERS", "0")):
        return partial(pl_worker_init_function, rank=trainer.global_rank)
    return None


class _ProcessDataloaderHook:
    """Stands in for ``strategy.process_dataloader`` on one strategy instance (picklable)."""

    def __init__(self, strategy: Any, previous: Any, transform: DataLoaderTransform) -> None:
        self.strategy, self.previous, self.transform = strategy, previous, transform

    def __call__(self, dataloader: object) -> object:
        if self.previous is not None:
            dataloader = self.previous(dataloader)
        else:
            dataloader = type(self.strategy).process_dataloader(self.strategy, dataloader)
        module = self.strategy.lightning_module
        try:
            trainer = module.trainer if module is not None else None
        except RuntimeError:  # not attached to a Trainer
            trainer = None
        if trainer is None:
            return dataloader
        return self.transform(dataloader, stage_name(trainer), trainer)


def install_dataloader_transform(trainer: pl.Trainer, transform: DataLoaderTransform) -> None:
    """Run ``transform`` on every DataLoader the trainer sets up, after Lightning's own changes.

    Installing again replaces the transform (hooks never stack).
    """
    strategy = trainer.strategy
    current = strategy.__dict__.get("process_dataloader")
    if isinstance(current, _ProcessDataloaderHook):
        current.transform = transform
        return
    warn_if_lightning_unchecked()
    strategy.process_dataloader = _ProcessDataloaderHook(strategy, current, transform)  # type: ignore[method-assign]


def dataloader_transform(trainer: pl.Trainer) -> DataLoaderTransform | None:
    """The transform installed on ``trainer``, if any."""
    current = trainer.strategy.__dict__.get("process_dataloader")
    return current.transform if isinstance(current, _ProcessDataloaderHook) else None
