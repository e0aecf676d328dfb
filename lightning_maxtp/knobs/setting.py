"""``SettingKnob``: a setting of the job itself, tried from the diagnosis, never from ``allow``.

The train loader's settings (``loader_settings``) and the main process's intra-op pools
(``threads``) are same-math knobs like the others, behind the same protocol, with what the loop
needs to know of them declared here instead of tested by name: who holds the setting (the
loader switches at its next batch boundary, the process at once), whether it means anything
without workers, and which one counts the workers (the user's ``max_workers`` caps it). The
advice (``advice``) recommends their values from the job model, so they offer nothing of their
own.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from typing_extensions import override

from lightning_maxtp.knobs.base import BaseKnob, FitView, NotOffered, Offer

__all__ = ["SettingKnob"]

FROM_DIAGNOSIS = NotOffered("tried when the diagnosis recommends a value", quiet=True)


class SettingKnob(BaseKnob):
    """A knob that is one of the fit's own settings (see the module docstring).

    Its ``context_field`` is its name, and a loader setting's ``changes`` says it is switched
    at a batch boundary, unless the subclass says otherwise.
    """

    preset: ClassVar[Literal["safe", "all"]] = "safe"
    holder: ClassVar[Literal["loader", "process"]] = "loader"
    """``"loader"``: a setting of the train loader, switched at its next batch boundary (and
    taken by the validation loaders that follow it); ``"process"``: the main process's, at once."""
    needs_workers: ClassVar[bool] = False
    """It means nothing for a loader without workers (prefetch, persistence)."""
    counts_workers: ClassVar[bool] = False
    """Its value is the loader's worker count (the user's ``max_workers`` caps its growth)."""
    queue_depth: ClassVar[bool] = False
    """Its value is the batches each worker keeps ready (what a new worker's queue holds)."""
    epoch_start_only: ClassVar[bool] = False
    """On, it changes only what an epoch's start costs: the same steps run, and it pays from
    the next epoch's start on (never in the fit's last epoch)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # What every setting shares, declared once: windows are diagnosed with its value under
        # its own name, and a loader setting changes the same way as the others.
        super().__init_subclass__(**kwargs)
        if "context_field" not in cls.__dict__:
            cls.context_field = cls.name
        if cls.holder == "loader" and "changes" not in cls.__dict__:
            cls.changes = f"the train loader's ``{cls.name}``, switched at a batch boundary"

    def held(self, fit: FitView) -> bool:
        """Whether this fit has the setting to change (a loader the loop can switch)."""
        if self.holder == "process":
            return True
        return fit.loader is not None and self.name in fit.loader.settings()

    @override
    def current(self, fit: FitView) -> Any:
        assert fit.loader is not None, f"{self.name}: no switchable loader"
        return fit.loader.settings().get(self.name)

    @override
    def offer(self, fit: FitView) -> Offer | NotOffered:
        return FROM_DIAGNOSIS

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        # Requests merge: several settings asked for before the next batch switch together.
        assert fit.loader is not None, f"{self.name}: no switchable loader"
        fit.loader.request(**{self.name: value})

    def reported(self, fit: FitView) -> dict[str, Any]:
        """Its value for the report's settings in force (the loader's: always)."""
        return {self.name: self.current(fit)} if self.held(fit) else {}
