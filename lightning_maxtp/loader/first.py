"""``first_loader``: the first torch ``DataLoader`` in what a Trainer holds as its train loaders."""

from __future__ import annotations

from typing import Any

__all__ = ["first_loader"]


def first_loader(loaders: Any) -> Any:
    """The first torch DataLoader in whatever ``trainer.train_dataloader`` holds (``None``: none).

    A single loader, a list, tuple or dict of them (nested), or a ``CombinedLoader``
    (its ``flattened`` loaders), searched breadth first.
    """
    from torch.utils.data import DataLoader

    stack = [loaders]
    while stack:
        item = stack.pop(0)
        if isinstance(item, DataLoader):
            return item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif hasattr(item, "flattened"):
            stack.extend(item.flattened)
    return None
