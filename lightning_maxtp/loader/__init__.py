"""The DataLoader, measured alone: ``tune_dataloader(loader) -> LoaderPlan``, applied to a Trainer.

``tune`` runs the ``search`` over candidate settings, each built and timed by ``measure`` within
the ``budget`` (CPUs, RAM, ``/dev/shm``, time), keeps sample ``order`` and random state, checks
``pickling`` for spawned workers and limits thread pools in workers (``worker_limits``);
``explain`` puts the result in words; ``apply`` rebuilds a Trainer's loaders through the hook in
``lightning_hook`` (Lightning's private helpers it needs are in ``lightning_maxtp._compat``);
``switchable`` is the train loader whose knobs change mid-epoch without losing a sample.
Importing it imports neither torch nor lightning.
"""

from lightning_maxtp.loader.apply import apply_loader_plan
from lightning_maxtp.loader.budget import LoaderBudget
from lightning_maxtp.loader.candidate import LOADER_KNOBS, LoaderCandidate
from lightning_maxtp.loader.plan import LoaderPlan
from lightning_maxtp.loader.tune import tune_dataloader

__all__ = [
    "LOADER_KNOBS",
    "LoaderBudget",
    "LoaderCandidate",
    "LoaderPlan",
    "apply_loader_plan",
    "tune_dataloader",
]
