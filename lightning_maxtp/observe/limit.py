"""How far a run is from the machine's limit, in one line: the report's headline distance.

A compute-bound run is measured against the device: its FLOP/s over the device's measured peak
for the dtype in force (MFU, ``observe.flops``). A data-bound run is limited by its loader: what
the loader delivers against what the device could take when never kept waiting (the windows'
step time without the data wait). Both come from the windows under the settings in force.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lightning_maxtp.observe.flops import Utilization, share_text
from lightning_maxtp.observe.shares import loader_rates
from lightning_maxtp.observe.window import Window, combined_rate

__all__ = ["DATA_KINDS", "Limit", "distance"]

DATA_KINDS = ("data_pipeline", "storage")
"""Bottleneck kinds whose limit is the loader, not the device."""


@dataclass(frozen=True)
class Limit:
    """The limit a run is held by and the share of it reached."""

    limit: Literal["device", "loader"]
    share: float | None
    """For ``device``: MFU (0..1); for ``loader``: loader rate over device rate (0..1);
    ``None`` when it cannot be given (no FLOP count or peak, a count above the peak)."""
    text: str
    utilization: Utilization | None = None
    loader_samples_per_s: float | None = None
    device_samples_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "limit": self.limit,
            "share": self.share,
            "text": self.text,
            "utilization": None if self.utilization is None else self.utilization.to_dict(),
            "loader_samples_per_s": self.loader_samples_per_s,
            "device_samples_per_s": self.device_samples_per_s,
        }

    def __str__(self) -> str:
        return self.text


def _weighted(rates: list[tuple[int, float]]) -> float | None:
    """Samples over the seconds each window's rate gives them."""
    seconds = sum(n / r for n, r in rates if r > 0)
    return sum(n for n, r in rates if r > 0) / seconds if seconds > 0 else None


def distance(windows: Sequence[Window], bottleneck: str) -> Limit | None:
    """The limit of the run the ``windows`` measured, named by its ``bottleneck`` kind.

    ``None`` without windows.
    """
    if not windows:
        return None
    rate = combined_rate(list(windows)) or 0.0
    util = windows[-1].context.utilization_at(rate)
    if bottleneck in DATA_KINDS:
        pairs = [loader_rates(w) for w in windows]
        counts = [sum(w.samples) for w in windows]
        device = _weighted([(n, d) for n, (d, _) in zip(counts, pairs, strict=True)])
        loader = _weighted([(n, lo) for n, (_, lo) in zip(counts, pairs, strict=True)])
        if device and loader:
            if loader < device:
                share = loader / device
                text = (
                    f"the loader gives {loader:,.0f} samples/s, the device could take "
                    f"{device:,.0f}: loading is the limit at {share_text(share)}"
                )
            else:  # fast enough alone, but loading in the main process runs in series
                share = min(1.0, rate / device)
                text = (
                    f"loading runs in series with the step: the loader alone gives "
                    f"{loader:,.0f} samples/s and the device could take {device:,.0f}, together "
                    f"{rate:,.0f}: at {share_text(share)} of the device's rate"
                )
            if util is not None and util.mfu is not None:
                mfu = share_text(util.mfu)
                text += f" (the device at {mfu} of its measured {util.dtype} peak)"
            return Limit("loader", share, text, util, loader, device)
    if util is None:
        text = "MFU unknown: no FLOP count (pass `flops_per_batch=` to the callback)"
        return Limit("device", None, text)
    return Limit("device", util.mfu, str(util), util)
