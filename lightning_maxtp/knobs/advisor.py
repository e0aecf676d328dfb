"""``ADVICE``: the knobs' recommendations as the diagnosis asks for them, and ``diagnose``.

The diagnosis (``observe.diagnosis``) names what limits the steps without naming a knob; it
asks an ``observe.recommendation.Advisor`` what to change for each finding. This is the one the
callback (whose report carries its answers) and ``lightning_maxtp.diagnose`` use: ``advice``
and ``advice_loader`` hold the recommendations, each knob named by its class.
"""

from __future__ import annotations

from lightning_maxtp.knobs import advice, advice_loader
from lightning_maxtp.observe.diagnosis import Diagnosis
from lightning_maxtp.observe.diagnosis import diagnose as _diagnose
from lightning_maxtp.observe.recommendation import Advisor
from lightning_maxtp.observe.window import Window

__all__ = ["ADVICE", "diagnose"]


ADVICE = Advisor(
    data_pipeline=advice_loader.data_pipeline,
    storage=advice_loader.storage,
    compute=advice.compute,
    modelled=advice.modelled,
    vram=advice.vram,
    kernel_launch=advice.kernel_launch,
    host_overhead=advice.host_overhead,
    collections=advice.collections,
    busy_host=advice.busy_host,
    under_occupied=advice.under_occupied,
)
"""The knobs' recommendations, as the diagnosis asks for them (each rule in ``advice``)."""


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
