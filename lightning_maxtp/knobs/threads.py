"""``intra_op_threads``: the training process's intra-op pools (torch's, and BLAS's).

On a CPU device they share the cores with busy DataLoader workers, so their size is a same-math
knob, tried from the diagnosis's recommendation like the loader's knobs (not from ``allow``).
It is process state: ``MainThreads`` puts the pools back when the fit ends.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from typing_extensions import override

from lightning_maxtp.knobs.base import FitView
from lightning_maxtp.knobs.main_threads import MainThreads
from lightning_maxtp.knobs.setting import SettingKnob

__all__ = ["THREADS", "IntraOpThreads", "MainThreads"]


class IntraOpThreads(SettingKnob):
    """The main process's intra-op pool size (``MainThreads``, held by the fit's view)."""

    name = "intra_op_threads"
    reason = "the step's threads leave the cores the loading needs"
    changes = (
        "``torch.set_num_threads`` and the BLAS pools (``threadpoolctl``) of the training "
        "process, put back when the fit ends"
    )
    holder: ClassVar[Literal["loader", "process"]] = "process"
    # On a GPU the step's threads only launch kernels: the diagnosis sizes them on CPUs only.
    devices: ClassVar[frozenset[str] | None] = frozenset({"cpu"})

    @override
    def current(self, fit: FitView) -> int:
        return MainThreads.current()

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        assert fit.threads is not None, "the fit's view holds no main threads"
        fit.threads.set(int(value))

    @override
    def restore(self, fit: FitView) -> None:
        if fit.threads is not None:
            fit.threads.restore()

    @override
    def reported(self, fit: FitView) -> dict[str, Any]:
        """Its size once changed (until the fit's end put the original back)."""
        threads = fit.threads
        if threads is None:
            return {}
        if threads.changed:
            return {self.name: threads.current()}
        if threads.restored_from is not None:  # in force until the fit ended
            return {self.name: threads.restored_from}
        return {}


THREADS = IntraOpThreads.name
"""The knob name of the main process's intra-op pool size."""
