"""Rebuilding a DataLoader with Lightning's own private helpers.

* ``lightning.pytorch.utilities.data._get_dataloader_init_args_and_kwargs(dl, sampler)``: the
  arguments a DataLoader was built with (recorded by Lightning for loaders made inside
  ``*_dataloader()`` hooks, else read from its attributes), with its sampler resolved. This is
  how Lightning itself injects a ``DistributedSampler``, so a rebuild keeps it.
* ``lightning.fabric.utilities.data._reinstantiate_wrapped_cls(dl, *args, **kwargs)``: builds
  the same class again and replays recorded ``setattr`` calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = ["dataloader_init_args", "reinstantiate_dataloader"]


def dataloader_init_args(
    dataloader: DataLoader[Any],
) -> tuple[tuple[Any, ...], dict[str, Any], tuple[str, ...]]:
    """The positional and keyword arguments ``dataloader`` was built with, and the arg names.

    Raises:
        lightning.fabric.utilities.exceptions.MisconfigurationException: When Lightning cannot
            recover them (a loader built outside its hooks with arguments it cannot read back).
    """
    from lightning.pytorch.utilities.data import _get_dataloader_init_args_and_kwargs

    args, kwargs = _get_dataloader_init_args_and_kwargs(dataloader, dataloader.sampler)
    names: tuple[str, ...] = getattr(dataloader, "__pl_saved_arg_names", ())
    return tuple(args), dict(kwargs), names


def reinstantiate_dataloader(dataloader: DataLoader[Any], *args: Any, **kwargs: Any) -> Any:
    """A new ``dataloader`` of the same class from these arguments, recorded setattrs replayed."""
    from lightning.fabric.utilities.data import _reinstantiate_wrapped_cls

    return _reinstantiate_wrapped_cls(dataloader, *args, **kwargs)
