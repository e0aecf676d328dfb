"""``ADVICE``: the knobs' recommendations as the diagnosis asks for them, and ``diagnose``.

The diagnosis (``observe.diagnosis``) names what limits the steps without naming a knob; it
asks an ``observe.recommendation.Advisor`` what to change for each finding. This is the one the
callback (whose report carries its answers) and ``lightning_maxtp.diagnose`` use: ``advice``
and ``advice_loader`` hold the recommendations, each knob named by its class.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_maxtp.knobs import advice, advice_loader
from lightning_maxtp.observe.diagnosis import Diagnosis
from lightning_maxtp.observe.diagnosis import diagnose as _diagnose
from lightning_maxtp.observe.recommendation import Advisor, Recommendation
from lightning_maxtp.observe.window import Window

__all__ = ["ADVICE", "KnobAdvice", "diagnose"]


class KnobAdvice:
    """The knobs' answer to each finding (``Advisor``; see ``advice`` for each rule)."""

    def data_pipeline(self, window: Window) -> Sequence[Recommendation]:
        """More workers (the job model's count), then prefetch, then pre-encoding."""
        return advice_loader.data_pipeline(window)

    def storage(self, window: Window) -> Sequence[Recommendation]:
        """More reads in flight, then local copies and shards."""
        return advice_loader.storage(window)

    def compute(self, window: Window) -> Sequence[Recommendation]:
        """Fewer busy workers, threads sized to the cores left, a leaner loader; the opt-ins."""
        return advice.compute(window)

    def modelled(self, window: Window) -> Sequence[Recommendation]:
        """The job model's worker change; fewer workers bring the leaner loader with them."""
        found = advice.modelled_workers(window)
        if not isinstance(found, Recommendation):
            return ()
        if int(found.proposed) > int(found.current):
            return (found,)
        return (found, *advice.leaner_loader(window))

    def vram(self, window: Window) -> Sequence[Recommendation]:
        """Same effective batch with half the activations, then checkpointing."""
        return advice.vram(window)

    def kernel_launch(self, window: Window) -> Sequence[Recommendation]:
        """Fewer, larger kernels: batch, CUDA graphs, more jobs per GPU."""
        return advice.kernel_launch(window)

    def host_overhead(self, window: Window) -> Sequence[Recommendation]:
        """Collections, pinned memory and persistent workers first, then per-step syncs."""
        return advice.host_overhead(window)

    def collections(self, window: Window) -> Sequence[Recommendation]:
        """The ``gc`` knob."""
        return advice.collections(window)

    def busy_host(self, window: Window) -> Sequence[Recommendation]:
        """Fewer workers, when they take the host's CPUs."""
        found = advice.fewer_workers(window)
        return () if found is None else (found,)

    def under_occupied(self, window: Window) -> Sequence[Recommendation]:
        """Use the idle GPUs, or pack jobs."""
        return advice.under_occupied(window)


ADVICE: Advisor = KnobAdvice()
"""The knobs' recommendations, as the diagnosis asks for them."""


def diagnose(window: Window) -> list[Diagnosis]:
    """Name what limits the steps in ``window``, most confident first, with the knobs' advice.

    ``observe.diagnosis.diagnose`` with ``ADVICE``: the findings and their evidence, each with
    what to change, in order.

    Args:
        window: The steps to judge.

    Returns:
        Findings ordered by confidence; ``healthy`` is included when no finding reaches
        ``thresholds.HEALTHY_BELOW``. Empty when the window has fewer than
        ``thresholds.MIN_STEPS`` steps (not enough data to say anything).
    """
    return _diagnose(window, ADVICE)
