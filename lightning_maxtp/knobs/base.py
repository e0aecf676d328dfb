"""The ``Knob`` protocol: what one knob declares and does, and the fit it acts on.

A knob is a class: its class attributes say what it is (``name``, what it is tried for, whether
it is guarded, the devices it has an effect on, ...), and one instance per fit reads, offers,
applies and restores its value on that fit (``FitView``). ``registry.KNOBS`` lists them; every
set the loop needs (the ``allow`` names, the guarded ones, the order per bottleneck, the
device-limited ones) is derived from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

    from lightning_maxtp.knobs.main_threads import MainThreads
    from lightning_maxtp.loader.switchable import SwitchableLoader

__all__ = ["BaseKnob", "FitView", "Knob", "NotOffered", "Offer"]


@dataclass(frozen=True)
class Offer:
    """A change a knob can try on this fit: from ``current`` to ``proposed``, and why it may pay."""

    current: Any
    proposed: Any
    why: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {"current": self.current, "proposed": self.proposed, "why": self.why}


@dataclass(frozen=True)
class NotOffered:
    """Why a knob cannot be tried on this fit.

    ``quiet`` ones are not worth a note in the report ("already on", a device it has no effect
    on).
    """

    reason: str
    quiet: bool = False

    def __str__(self) -> str:
        return self.reason

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {"reason": self.reason, "quiet": self.quiet}


ALREADY_ON = NotOffered("already on", quiet=True)


class FitView:
    """The running fit as the knobs see it: the Trainer, its device, module and strategy.

    Args:
        trainer: The fit's Trainer (``None``: the setting knobs' view, before it is bound).
        loader: The fit's switchable train loader (``None``: none the loop can switch).
        threads: The main process's intra-op pools, as the fit started them.
    """

    def __init__(
        self,
        trainer: pl.Trainer | None,
        *,
        loader: SwitchableLoader | None = None,
        threads: MainThreads | None = None,
    ) -> None:
        self._trainer = trainer
        self.loader = loader
        self.threads = threads

    @property
    def trainer(self) -> pl.Trainer:
        """The fit's Trainer (a view with none is the setting knobs', which never ask)."""
        assert self._trainer is not None, "a knob asked for the Trainer of a view without one"
        return self._trainer

    @property
    def module(self) -> pl.LightningModule:
        """The LightningModule being trained."""
        return self.trainer.lightning_module

    @property
    def device(self) -> str:
        """The device type of the root device: ``cuda``, ``cpu``, ``mps``..."""
        return str(self.trainer.strategy.root_device.type)

    def submodules(self) -> list[torch.nn.Module]:
        """The module's children that hold parameters (the module itself when none does)."""
        children = [c for c in self.module.children() if any(True for _ in c.parameters())]
        return children or [self.module]

    def sharded_by(self) -> str | None:
        """Why the strategy keeps the module's parameters to itself (FSDP, DeepSpeed...).

        ``None`` for single-device and DDP, where a knob may change the module in place.
        """
        from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

        strategy = self.trainer.strategy
        if isinstance(strategy, SingleDeviceStrategy | DDPStrategy):
            return None
        return f"{type(strategy).__name__} wraps the module's parameters"


class Knob(Protocol):
    """One knob of the closed loop (see the module docstring); ``BaseKnob`` has the defaults."""

    name: ClassVar[str]
    """The name ``allow`` takes, the trials and the report use, and the advice recommends."""
    reason: ClassVar[str]
    """What it is tried for, in the words of a trial's reason."""
    changes: ClassVar[str]
    """What it changes on the fit and what is put back when the fit ends, in a phrase (literals
    in double backticks). The docs' knob table shows it (``docs/hooks.py``) beside what is
    rendered from the other attributes (the guard, the devices, the budget), so it need not
    repeat those."""
    preset: ClassVar[Literal["safe", "all"]]
    """``"safe"``: same math, allowed by default; ``"all"``: opt-in (``allow="all"`` or by name)."""
    guarded: ClassVar[bool]
    """Its kernels round differently: its trial runs under the numerics guard."""
    deterministic: ClassVar[bool]
    """Its effect is the same run to run (``False``: it picks kernels by timing them)."""
    watched: ClassVar[bool]
    """Once kept it stays watched by the guard, and is undone when training goes non-finite."""
    devices: ClassVar[frozenset[str] | None]
    """The device types it has an effect on (``None``: every one)."""
    tried_for: ClassVar[Mapping[str, int]]
    """Bottleneck kinds it is tried for, each with its rank (lower first; equal ranks in the
    registry's order)."""
    settle_steps: ClassVar[int]
    """Least steps after switching before a window starts."""
    settles_until_steady: ClassVar[bool]
    """Its settle goes on while a step runs far slower than the reference (a compile and its
    recompiles), up to ``tuning.tuning_loop.MAX_EXTRA_SETTLE`` more steps."""
    min_budget_s: ClassVar[float]
    """Least tuning budget left (seconds) for its trial to be worth starting."""
    before_fit: ClassVar[bool]
    """Chosen before training, not tried mid-fit (the batch size)."""
    context_field: ClassVar[str | None]
    """The ``JobContext`` field its value is diagnosed as (``None``: not diagnosed)."""
    named_only: ClassVar[bool]
    """Tried only when the top diagnosis recommends it by name: its bottleneck kind has other
    causes it cannot help (``gc`` for a ``host_overhead`` made of collections, not syncs)."""

    def current(self, fit: FitView) -> Any:
        """Its value now."""
        ...

    def offer(self, fit: FitView) -> Offer | NotOffered:
        """The change to try on this fit, or why there is none."""
        ...

    def apply(self, fit: FitView, value: Any) -> None:
        """Switch to ``value``: the next step runs with it."""
        ...

    def choose(self, fit: FitView) -> Any:
        """A knob chosen before the fit (``before_fit``): measure, and return what to apply."""
        ...

    def restore(self, fit: FitView) -> None:
        """The fit ended: put back what is process-wide or the Trainer's (idempotent)."""
        ...


class BaseKnob:
    """Defaults for a ``Knob``: a boolean switch, opt-in, unguarded, on every device."""

    name: ClassVar[str] = ""
    reason: ClassVar[str] = ""
    changes: ClassVar[str] = ""
    preset: ClassVar[Literal["safe", "all"]] = "all"
    guarded: ClassVar[bool] = False
    deterministic: ClassVar[bool] = True
    watched: ClassVar[bool] = False
    devices: ClassVar[frozenset[str] | None] = None
    tried_for: ClassVar[Mapping[str, int]] = {}
    settle_steps: ClassVar[int] = 0
    settles_until_steady: ClassVar[bool] = False
    min_budget_s: ClassVar[float] = 0.0
    before_fit: ClassVar[bool] = False
    context_field: ClassVar[str | None] = None
    named_only: ClassVar[bool] = False

    def current(self, fit: FitView) -> Any:
        """Its value now."""
        raise NotImplementedError

    def why_not(self, fit: FitView) -> str | None:
        """Why it cannot be tried on this fit (``None``: it can)."""
        return None

    def why_off(self, fit: FitView) -> str | None:
        """Why switching it off may pay on this fit, when it is on (``None``: leave it on).

        The loop never offers to undo a change it kept itself, so this is about a value the
        user set by hand: the knob moves down as well as up, judged like any trial.
        """
        return None

    def offer(self, fit: FitView) -> Offer | NotOffered:
        """A boolean switch: ``False -> True`` unless ``why_not`` says no.

        When it is on: ``True -> False`` if ``why_off`` gives a reason, else it is on already.
        """
        if self.current(fit):
            why_off = self.why_off(fit)
            return ALREADY_ON if why_off is None else Offer(True, False, why_off)
        why = self.why_not(fit)
        if why is not None:
            return NotOffered(why)
        return Offer(False, True, self.reason)

    def apply(self, fit: FitView, value: Any) -> None:
        """Switch to ``value``."""
        raise NotImplementedError

    def choose(self, fit: FitView) -> Any:
        """Only a knob chosen before the fit measures its value this way."""
        raise NotImplementedError(f"{self.name} is tried mid-fit, not chosen before it")

    def restore(self, fit: FitView) -> None:
        """Nothing process-wide to put back."""
