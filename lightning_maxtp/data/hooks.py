"""Steps added to a Lightning batch hook without changing the user's classes.

Lightning calls ``on_before_batch_transfer`` and ``on_after_batch_transfer`` on the DataModule
when it overrides them, else on the LightningModule. A ``BatchSteps`` object replaces the hook
on that instance: it calls the original, then each added step in order. Several users of the
same hook (the device transform, the channels_last knob) each add and remove their own step by
name, in any order, and the original comes back when the last one leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["BatchSteps", "add_batch_step", "has_batch_step", "hook_owner", "remove_batch_step"]

HOOKS = ("on_before_batch_transfer", "on_after_batch_transfer")


class BatchSteps:
    """A batch hook that calls the original, then the steps in ``order``."""

    def __init__(self, original: Callable[[Any, int], Any], own: bool) -> None:
        self.__wrapped__ = original  # so Lightning's is_overridden sees the original hook
        self.own = own
        """Whether the original was an attribute of the instance (put back on removal)."""
        self.steps: dict[str, tuple[int, Callable[[Any], Any]]] = {}

    def __call__(self, batch: Any, dataloader_idx: int = 0) -> Any:
        """The hook: the original, then each step."""
        batch = self.__wrapped__(batch, dataloader_idx)
        for _, step in sorted(self.steps.values(), key=lambda s: s[0]):
            batch = step(batch)
        return batch


def hook_owner(trainer: pl.Trainer, hook: str) -> Any:
    """The object whose ``hook`` Lightning calls: an overriding DataModule, else the module."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and is_overridden(hook, datamodule):
        return datamodule
    return trainer.lightning_module


def add_batch_step(
    owner: Any, hook: str, name: str, step: Callable[[Any], Any], order: int
) -> None:
    """Run ``step(batch)`` after ``owner.hook``, lower ``order`` first (same name: replaced)."""
    assert hook in HOOKS, hook
    chain = vars(owner).get(hook)
    if not isinstance(chain, BatchSteps):
        chain = BatchSteps(getattr(owner, hook), own=hook in vars(owner))
        setattr(owner, hook, chain)
    chain.steps[name] = (order, step)


def remove_batch_step(owner: Any, hook: str, name: str) -> bool:
    """Remove the step ``name``; the hook is the original again once no step is left.

    Returns:
        Whether a step of that name was there.
    """
    chain = vars(owner).get(hook)
    if not isinstance(chain, BatchSteps) or name not in chain.steps:
        return False
    del chain.steps[name]
    if not chain.steps:
        if chain.own:
            setattr(owner, hook, chain.__wrapped__)
        else:
            delattr(owner, hook)
    return True


def has_batch_step(owner: Any, hook: str, name: str) -> bool:
    """Whether ``owner.hook`` runs the step ``name``."""
    chain = vars(owner).get(hook)
    return isinstance(chain, BatchSteps) and name in chain.steps
