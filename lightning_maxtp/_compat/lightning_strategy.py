"""Lightning's private strategy and launcher API behind ``strategy="auto_maxtp"``.

* ``DDPStrategy._configure_launcher`` (called by the accelerator connector once the strategy is
  set up) and ``_launcher``: ``LauncherOverride`` puts our planning launcher there.
* ``_Launcher`` and ``_SubprocessScriptLauncher`` (``lightning.pytorch.strategies.launchers``):
  the launcher base class, and the default DDP launcher that re-runs the script.
* ``lightning.fabric.utilities.imports._IS_INTERACTIVE``: whether we run in a notebook (only
  fork-based launchers work there).
* ``trainer._accelerator_connector.strategy``: the one attribute ``Trainer.strategy`` reads,
  where the chosen strategy replaces ``AutoMaxTP``; ``Strategy._lightning_module``: the model
  ``Trainer.fit`` attached to ``AutoMaxTP``, attached to the chosen one.
* The settings ``DDPStrategy.__init__`` stores privately (``_checkpoint_io``,
  ``_precision_plugin``, ``_start_method``, ``_ddp_kwargs``, ``_ddp_comm_*``,
  ``_model_averaging_period``, ``_process_group_backend``, ``_timeout``) and ``_layer_sync``
  (``Trainer(sync_batchnorm=True)``): read from ``AutoMaxTP`` to build the chosen strategy as
  Lightning configured ``AutoMaxTP``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.fabric.utilities.imports import _IS_INTERACTIVE
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, Strategy
from lightning.pytorch.strategies.launchers.launcher import _Launcher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from typing_extensions import override

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.trainer.connectors.signal_connector import _SIGNUM

    Signal = _SIGNUM
else:
    Signal = Any

__all__ = [
    "IS_INTERACTIVE",
    "DDPSettings",
    "Launcher",
    "LauncherOverride",
    "Signal",
    "SubprocessScriptLauncher",
    "ddp_settings",
    "finish_strategy",
    "install_strategy",
]

IS_INTERACTIVE: bool = _IS_INTERACTIVE
"""Whether this process runs in a notebook or a REPL, as Lightning decides it."""

Launcher = _Launcher
"""Lightning's launcher base class: ``launch(function, *args, trainer=, **kwargs)``, ``kill``."""

SubprocessScriptLauncher = _SubprocessScriptLauncher
"""The default DDP launcher, which starts the other ranks by running the script again."""

DDPSettings = dict[str, Any]
"""What a ``DDPStrategy`` was given: its keyword arguments by their ``DDPStrategy`` names."""


class LauncherOverride(DDPStrategy):
    """A ``DDPStrategy`` whose launcher is ``make_launcher()``, where Lightning asks for one."""

    def make_launcher(self) -> Launcher:
        """The launcher this strategy uses; subclasses return theirs."""
        raise NotImplementedError

    @override
    def _configure_launcher(self) -> None:
        self._launcher = self.make_launcher()


def ddp_settings(strategy: DDPStrategy) -> DDPSettings:
    """The ``DDPStrategy`` arguments ``strategy`` was built and configured with."""
    return {
        "checkpoint_io": strategy._checkpoint_io,
        "precision_plugin": strategy._precision_plugin,
        "start_method": strategy._start_method,
        "ddp_comm_state": strategy._ddp_comm_state,
        "ddp_comm_hook": strategy._ddp_comm_hook,
        "ddp_comm_wrapper": strategy._ddp_comm_wrapper,
        "model_averaging_period": strategy._model_averaging_period,
        "process_group_backend": strategy._process_group_backend,
        "timeout": strategy._timeout,
        **strategy._ddp_kwargs,
    }


def finish_strategy(strategy: DDPStrategy | FSDPStrategy, template: DDPStrategy) -> None:
    """Finish a parallel strategy built by hand as Lightning's connector does.

    It takes ``template``'s layer sync (``sync_batchnorm``), sets the world ranks and makes the
    launcher.
    """
    strategy._layer_sync = template._layer_sync
    strategy.set_world_ranks()
    strategy._configure_launcher()


def install_strategy(trainer: pl.Trainer, strategy: Strategy) -> None:
    """Make ``strategy`` the trainer's, with the model attached to the one it replaces."""
    strategy._lightning_module = trainer.strategy.lightning_module
    trainer._accelerator_connector.strategy = strategy
