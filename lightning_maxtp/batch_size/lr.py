"""Scaling an optimizer's learning rates in place: the one rule ``apply`` and plain users share."""

from __future__ import annotations

from typing import Any

__all__ = ["LR_KEYS", "scale_param_groups"]

LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
"""Param-group keys that hold a learning rate (schedulers add ``initial_lr``/``max_lr``...)."""


def scale_param_groups(optimizer: Any, scale: float) -> None:
    """Multiply every learning rate in ``optimizer``'s param groups by ``scale``."""
    if scale == 1.0:
        return
    for group in optimizer.param_groups:
        for key in LR_KEYS:
            if isinstance(group.get(key), float | int):
                group[key] = group[key] * scale
