"""Every private Lightning API the DataLoader plan needs, in one place.

Checked on the Lightning releases ``pyproject.toml`` allows, 2.6.6 up to 2.7
(``CHECKED_LIGHTNING``: a newer 2.6 patch release gets no warning, any other release one
warning per process); ``tests/loader/test_lightning_private.py`` fails loudly if a name below
moves. What is used, and why:

* ``lightning.pytorch.utilities.data._get_dataloader_init_args_and_kwargs(dl, sampler)``: the
  arguments a DataLoader was built with (recorded by Lightning for loaders made inside
  ``*_dataloader()`` hooks, else read from its attributes), with its sampler resolved. This is
  how Lightning itself injects a ``DistributedSampler``, so a rebuild keeps it.
* ``lightning.fabric.utilities.data._reinstantiate_wrapped_cls(dl, *args, **kwargs)``: builds
  the same class again and replays recorded ``setattr`` calls.
* The hook point is public: ``Strategy.process_dataloader(dl)`` is called by
  ``data_connector._process_dataloader`` for every loader, after the distributed sampler is
  injected and before ``iter()`` starts workers. We override it on the strategy *instance*, and
  read ``trainer.state.stage`` (set before each loop's ``setup_data``) to tell train from val.
* ``PL_SEED_WORKERS`` and ``pl_worker_init_function``: Lightning adds its worker seeding only to
  loaders without a ``worker_init_fn``; ours has one, so we compose Lightning's in ourselves.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from functools import cache, partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

__all__ = [
    "CHECKED_LIGHTNING",
    "DataLoaderTransform",
    "dataloader_transform",
    "install_dataloader_transform",
    "lightning_checked",
    "lightning_worker_seeding",
    "rebuild_dataloader",
    "stage_name",
]

CHECKED_LIGHTNING = ((2, 6, 6), (2, 7))
"""The Lightning releases the helpers below are checked on: at least the first, below the second."""

DataLoaderTransform = Callable[[object, str | None, "pl.Trainer"], object]
"""``(dataloader, stage, trainer) -> dataloader``; stage is ``train``, ``val``, ``test``..."""

_STAGES = {
    "train": "train",
    "sanity_check": "val",
    "validate": "val",
    "test": "test",
    "predict": "predict",
}


def lightning_checked(version: str) -> bool:
    """Whether Lightning ``version`` is in ``CHECKED_LIGHTNING`` (by release: ``2.6.7.dev1`` is)."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release
    except InvalidVersion:
        return False
    low, high = CHECKED_LIGHTNING
    return low <= release < high


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
    from lightning.fabric.utilities.data import _reinstantiate_wrapped_cls
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.utilities.data import _get_dataloader_init_args_and_kwargs

    cls = type(dataloader)
    try:
        args, saved = _get_dataloader_init_args_and_kwargs(dataloader, dataloader.sampler)
    except MisconfigurationException as exc:
        raise ValueError(
            f"cannot rebuild the `{cls.__name__}` to apply the loader plan: {exc} Create the "
            "loader inside the `*_dataloader()` hook (Lightning then records its arguments) or "
            "apply `plan.dataloader_kwargs()` yourself."
        ) from exc
    kwargs = dict(saved)
    arg_names: tuple[str, ...] = getattr(dataloader, "__pl_saved_arg_names", ())
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
                "apply `plan.dataloader_kwargs()` yourself."
            )
    rebuilt: DataLoader[Any] = _reinstantiate_wrapped_cls(dataloader, *positional, **kwargs)
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
    import lightning

    strategy = trainer.strategy
    current = strategy.__dict__.get("process_dataloader")
    if isinstance(current, _ProcessDataloaderHook):
        current.transform = transform
        return
    if not lightning_checked(lightning.__version__):
        _warn_unchecked(lightning.__version__)
    strategy.process_dataloader = _ProcessDataloaderHook(strategy, current, transform)  # type: ignore[method-assign]


@cache
def _warn_unchecked(version: str) -> None:
    """Once per process and version: the private helpers were not checked on this Lightning."""
    from lightning_maxtp._log import rank_zero_warn

    low, high = (".".join(map(str, v)) for v in CHECKED_LIGHTNING)
    rank_zero_warn(
        f"DataLoaders are rebuilt with private Lightning helpers checked on Lightning "
        f">={low},<{high}; found {version}. If a DataLoader fails to rebuild, install "
        f"lightning>={low},<{high}."
    )


def dataloader_transform(trainer: pl.Trainer) -> DataLoaderTransform | None:
    """The transform installed on ``trainer``, if any."""
    current = trainer.strategy.__dict__.get("process_dataloader")
    return current.transform if isinstance(current, _ProcessDataloaderHook) else None
