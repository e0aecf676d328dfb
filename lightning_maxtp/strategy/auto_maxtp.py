"""``AutoMaxTP``: the strategy behind ``Trainer(strategy="auto_maxtp")``.

**When the model is known.** Lightning fixes the strategy object in ``Trainer.__init__``, before
any model exists, and calls a registered name's factory without the accelerator or devices.
``AutoMaxTP`` is therefore a stand-in that Lightning configures like any DDP strategy
(accelerator, precision plugin, cluster environment, devices, ranks), and its launcher does the
planning: every ``fit``/``validate``/``test``/``predict`` starts with
``trainer.strategy.launcher.launch(...)`` (``trainer/call.py: _call_and_handle_interrupt``),
after ``Trainer.fit`` has attached the model to the strategy and before any process is
started. There ``plan_strategy`` runs on the model's size, the precision plugin, the probe and
Lightning's device list; the chosen Lightning strategy (``SingleDeviceStrategy``,
``DDPStrategy`` or ``FSDPStrategy``) is built with the same accelerator, precision, cluster
environment and checkpoint IO; it replaces ``AutoMaxTP`` in the trainer
(the one attribute ``Trainer.strategy`` reads, through ``lightning_maxtp._compat``); and its own
launcher starts the processes. From there on it is plain Lightning.

**All ranks agree because one process decides.** The launching process plans. Children of
Lightning's default DDP launcher (which re-runs the script) receive that plan in the
``LIGHTNING_MAXTP_PLAN`` environment variable and use it only if their parent wrote it;
spawn/fork children receive the chosen strategy pickled. Processes that something else started
(torchrun, SLURM, LSF, MPI: the cluster environment says so) and multi-node jobs plan each on
their own, from inputs that are the same on every rank: the model and the GPUs' *total* memory,
with Lightning's devices and cluster environment used unchanged, so the world size stays what
the launcher made it.

**Which GPUs.** A strategy never sees the ``devices`` argument, only Lightning's parsed list. A
list covering every visible GPU (``devices="auto"``, ``-1`` or the full count) means "the free
ones"; ``[0, .., k-1]`` means "k GPUs", taken from the free ones; any other list is used as given.

**What the user sees.** One rank-zero info line with the plan and its reason, e.g.
``maxtp: strategy: DDP on GPUs [0, 1, 3]. a full copy needs ~3.1 GiB per GPU and fits; ...;
skipped GPU 2 (busy: 1 foreign process(es): pid 4242 (bob) 20.0 GiB) [...]``, and a warning
for anything that cannot be met as asked. ``AutoMaxTP.plan`` keeps the ``StrategyPlan``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import TYPE_CHECKING, Any, Literal

from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.model_helpers import is_overridden
from typing_extensions import override

from lightning_maxtp._compat.lightning_strategy import (
    IS_INTERACTIVE,
    Launcher,
    LauncherOverride,
    Signal,
    SubprocessScriptLauncher,
    install_strategy,
)
from lightning_maxtp._compat.version import warn_if_lightning_unchecked
from lightning_maxtp._log import prefixed, rank_zero_info, rank_zero_warn
from lightning_maxtp.resources.probe import DEFAULT_HEADROOM_BYTES, inspect_resources
from lightning_maxtp.strategy.build import build_strategy, devices_flag
from lightning_maxtp.strategy.devices import Devices
from lightning_maxtp.strategy.memory import PRECISION_BYTES, estimate_memory
from lightning_maxtp.strategy.model_size import ModelSize, optimizer_name
from lightning_maxtp.strategy.plan import StrategyPlan, plan_strategy

if TYPE_CHECKING:
    from collections.abc import Callable

    import lightning.pytorch as pl

__all__ = ["PLAN_ENV", "AutoMaxTP"]

log = logging.getLogger(__name__)

PLAN_ENV = "LIGHTNING_MAXTP_PLAN"
"""Environment variable through which the launching process hands its plan to DDP children."""


class AutoMaxTP(LauncherOverride):
    """Single device, DDP or FSDP, chosen when the model is known (see the module docstring).

    ``import lightning_maxtp`` registers it as ``Trainer(strategy="auto_maxtp")``; Lightning has
    no entry point for strategies, so the import is what makes the name exist. Pass an instance
    to set arguments: ``Trainer(strategy=AutoMaxTP(optimizer="sgd"))``.

    Args:
        optimizer: The optimizer the model uses, for the memory estimate: ``"auto"`` reads it
            from ``configure_optimizers()`` (Adam, the most common and the largest, when it
            cannot), or ``"adam"``, ``"adamw"``, ``"sgd"``, ``"sgd_momentum"``, ... or the
            number of states per parameter.
        activation_bytes: Measured activation memory per device; ``None`` estimates it.
        num_params: Parameter count to plan with, for models whose parameters a
            ``configure_model`` hook creates (they do not exist when the plan is made).
        headroom_bytes: Memory kept free on each GPU.
        memory_budget_bytes: Optional cap on the memory per GPU the plan may use.
        cpu_offload: Allow FSDP with CPU offload when the model fits no other way (slower;
            warned when chosen).
        fsdp_kwargs: Extra ``FSDPStrategy`` arguments used when FSDP is chosen (the default
            wraps with a size-based policy of ``FSDP_MIN_UNIT_PARAMS`` parameters per unit).
        verbose: Log the plan (rank zero); ``False`` logs nothing (warnings still warn).
        **ddp_kwargs: ``DDPStrategy`` arguments used when DDP is chosen (``start_method``,
            ``process_group_backend``, ``timeout``, ``find_unused_parameters``, ...);
            ``process_group_backend`` and ``timeout`` apply to FSDP too.
    """

    strategy_name = "auto_maxtp"

    def __init__(
        self,
        *,
        optimizer: str | int = "auto",
        activation_bytes: int | None = None,
        num_params: int | None = None,
        headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
        memory_budget_bytes: int | None = None,
        cpu_offload: bool = True,
        fsdp_kwargs: dict[str, Any] | None = None,
        verbose: bool = True,
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__(**ddp_kwargs)
        checked = "adam" if optimizer == "auto" else optimizer
        estimate_memory(0, optimizer=checked, activation_bytes=activation_bytes)  # validates
        if num_params is not None:
            ModelSize.from_count(num_params)  # validates
        if headroom_bytes < 0:
            raise ValueError(f"`headroom_bytes` must be >= 0, got {headroom_bytes!r}")
        if fsdp_kwargs and "cpu_offload" in fsdp_kwargs:
            raise ValueError(
                "`fsdp_kwargs` must not set 'cpu_offload': the plan decides it; pass "
                "AutoMaxTP(cpu_offload=False) to never offload"
            )
        if memory_budget_bytes is not None and memory_budget_bytes <= 0:
            raise ValueError(
                f"`memory_budget_bytes` must be None or > 0, got {memory_budget_bytes!r}"
            )
        self._optimizer = optimizer
        self._activation_bytes = activation_bytes
        self._num_params = num_params
        self._headroom_bytes = headroom_bytes
        self._memory_budget_bytes = memory_budget_bytes
        self._cpu_offload = cpu_offload
        self._fsdp_kwargs = dict(fsdp_kwargs or {})
        self.verbose = verbose
        self.plan: StrategyPlan | None = None
        """The plan made at the first ``fit``/``validate``/... (``None`` before)."""

    @override
    def make_launcher(self) -> Launcher:
        return _PlanningLauncher(self)

    def resolve(self, trainer: pl.Trainer) -> Strategy:
        """Plan, build the chosen Lightning strategy and put it in the trainer's place.

        Called by the launcher at the start of each trainer entry point; public so that a
        caller holding a Trainer can see the choice before running anything.
        """
        model = trainer.lightning_module
        training = trainer.state.fn == TrainerFn.FITTING
        plan, fingerprint = self._plan(model, training)
        warn_if_lightning_unchecked()
        chosen = build_strategy(plan, self, self._fsdp_kwargs)
        install_strategy(trainer, chosen)
        self.plan = plan
        if self.verbose:
            rank_zero_info(str(plan))
        for warning in plan.warnings:
            rank_zero_warn(warning)
        env = self.cluster_environment
        if isinstance(chosen.launcher, SubprocessScriptLauncher) and not (
            env is not None and env.creates_processes_externally
        ):
            # The popen launcher copies os.environ into the children it starts next.
            os.environ[PLAN_ENV] = json.dumps(
                {"pid": os.getpid(), "fingerprint": fingerprint, "plan": plan.to_dict()}
            )
        return chosen

    def _plan(
        self, model: pl.LightningModule | None, training: bool
    ) -> tuple[StrategyPlan, list[Any]]:
        accelerator = self._accelerator_name()
        size = self._model_size(model)
        precision = self._precision_name()
        fingerprint = [size.num_params, size.trainable_params, precision, training]
        inherited = _inherited_plan()
        if inherited is not None and inherited["fingerprint"] == fingerprint:
            return StrategyPlan.from_dict(inherited["plan"]), fingerprint
        env = self.cluster_environment
        external = (
            inherited is not None
            or self.num_nodes > 1
            or bool(env is not None and env.creates_processes_externally)
        )
        resources = inspect_resources()
        lightning_devices = list(self.parallel_devices or [])
        devices: Devices
        if inherited is not None:
            old = inherited["plan"]
            devices = old["devices"] if accelerator == "cuda" else old["num_processes"]
        elif accelerator == "cpu":
            devices = len(lightning_devices)
        else:
            indices = [d.index or 0 for d in lightning_devices]
            visible = [g.index for g in resources.gpus]
            devices = indices if external else devices_flag(indices, visible)
        plan = plan_strategy(
            resources,
            size,
            precision=precision,
            optimizer=self._optimizer_of(model),
            activation_bytes=self._activation_bytes,
            training=training,
            accelerator=accelerator,
            devices=devices,
            num_nodes=self.num_nodes,
            headroom_bytes=self._headroom_bytes,
            memory_budget_bytes=self._memory_budget_bytes,
            memory_basis="total" if external else "free",
            cpu_offload=self._cpu_offload,
        )
        return plan, fingerprint

    def _optimizer_of(self, model: pl.LightningModule | None) -> str | int:
        if self._optimizer != "auto":
            return self._optimizer
        name, why = optimizer_name(model) if model is not None else (None, "no model yet")
        if name is None:
            rank_zero_warn(
                f"optimizer state sized as Adam's (2 per parameter): {why}; pass "
                "AutoMaxTP(optimizer=...) to size it exactly"
            )
            return "adam"
        return name

    def _accelerator_name(self) -> Literal["cpu", "cuda"]:
        if isinstance(self.accelerator, CPUAccelerator):
            return "cpu"
        if isinstance(self.accelerator, CUDAAccelerator):
            return "cuda"
        raise ValueError(
            f"strategy='auto_maxtp' plans CPU and CUDA runs, got accelerator "
            f"{type(self.accelerator).__name__}; use strategy='auto' there"
        )

    def _model_size(self, model: pl.LightningModule | None) -> ModelSize:
        if self._num_params is not None:
            return ModelSize.from_count(self._num_params)
        if model is None:
            return ModelSize.from_count(0)
        size = ModelSize.from_module(model)
        if is_overridden("configure_model", model):
            rank_zero_warn(
                f"`{type(model).__name__}.configure_model` creates parameters after "
                f"the plan is made; planning with the {size.num_params} that exist now. Pass "
                "AutoMaxTP(num_params=...) to plan with the real count"
            )
        if "auto_wrap_policy" in self._fsdp_kwargs:
            # A custom policy's units are unknown: assume one unit, the upper bound.
            size = dataclasses.replace(size, largest_unit_params=size.num_params)
        return size

    def _precision_name(self) -> str:
        name = str(self.precision_plugin.precision)
        if name in PRECISION_BYTES:
            return name
        rank_zero_warn(
            f"precision {name!r} is not in the memory table; estimating as "
            "'32-true', an upper bound for the half-precision formats"
        )
        return "32-true"


class _PlanningLauncher(Launcher):
    """Plans when the trainer launches, then hands over to the chosen strategy's launcher."""

    def __init__(self, strategy: AutoMaxTP) -> None:
        self._strategy = strategy
        self._inner: Launcher | None = None

    @property
    @override
    def is_interactive_compatible(self) -> bool:
        return True  # the chosen strategy's launcher is picked for notebooks (fork)

    @override
    def launch(
        self,
        function: Callable[..., Any],
        *args: Any,
        trainer: pl.Trainer | None = None,
        **kwargs: Any,
    ) -> Any:
        if trainer is None:
            raise RuntimeError("strategy='auto_maxtp' plans at launch and needs the Trainer")
        chosen = self._strategy.resolve(trainer)
        launcher = chosen.launcher
        if launcher is None:
            return function(*args, **kwargs)
        assert isinstance(launcher, Launcher)
        if IS_INTERACTIVE and not launcher.is_interactive_compatible:
            raise RuntimeError(
                f"strategy='auto_maxtp' chose {type(chosen).__name__}, which cannot start its "
                "processes from a notebook; run the code as a script"
            )
        self._inner = launcher
        return launcher.launch(function, *args, trainer=trainer, **kwargs)

    @override
    def kill(self, signum: Signal) -> None:
        if self._inner is not None:
            self._inner.kill(signum)


def _inherited_plan() -> dict[str, Any] | None:
    """The plan our parent (or this process, for a later Trainer) wrote, if any."""
    raw = os.environ.get(PLAN_ENV)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        log.warning(prefixed("ignoring %s: not JSON"), PLAN_ENV)
        return None
    if not isinstance(data, dict) or data.get("pid") not in (os.getpid(), os.getppid()):
        return None
    return data
