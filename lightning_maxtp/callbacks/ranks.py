"""Under DDP, one window across ranks: a few numbers per rank gathered to rank zero.

At each window every rank contributes its step time, data wait share, samples/s and GPU
utilization (one small ``all_gather``); rank zero keeps them as a ``RankSpread`` and names the
straggler.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_maxtp.observe.window import Window

__all__ = ["RankSpread", "gather_spread"]

_SPREAD_FIELDS = ("step_time_s", "data_wait_share", "samples_per_s", "gpu_util_percent")


@dataclass(frozen=True)
class RankSpread:
    """One window's summary across DDP ranks (rank zero's view)."""

    first_step: int
    per_rank: dict[str, list[float]]
    """Metric name -> one value per rank (NaN where a rank had no reading)."""
    straggler_rank: int
    """The rank that waits longest for its own data (ties: the longest step); the other ranks
    wait for it inside all-reduce."""

    def stats(self, metric: str) -> dict[str, float]:
        """Min / median / max of one metric over ranks (NaN readings left out)."""
        values = [v for v in self.per_rank[metric] if not math.isnan(v)]
        if not values:
            return {"min": float("nan"), "median": float("nan"), "max": float("nan")}
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view with the per-metric min/median/max."""
        data = asdict(self)
        data["stats"] = {m: self.stats(m) for m in self.per_rank}
        return data

    def __str__(self) -> str:
        st, dw = self.stats("step_time_s"), self.stats("data_wait_share")
        return (
            f"{len(self.per_rank['step_time_s'])} ranks: step {st['min'] * 1e3:.1f}/"
            f"{st['median'] * 1e3:.1f}/{st['max'] * 1e3:.1f} ms (min/median/max), data wait "
            f"{dw['min']:.0%}..{dw['max']:.0%}, straggler rank {self.straggler_rank}"
        )


def gather_spread(trainer: pl.Trainer, window: Window) -> RankSpread | None:
    """Every rank's numbers of ``window`` (call on every rank); rank zero gets the spread."""
    import torch

    util = window.sampler.mean_gpu_util
    values = [window.median_step_s, window.data_wait_share, window.samples_per_s, util]
    local = torch.tensor(
        [float("nan") if v is None else v for v in values],
        dtype=torch.float64,
        device=trainer.strategy.root_device,
    )
    gathered = trainer.strategy.all_gather(local)
    if trainer.global_rank != 0:
        return None
    table = gathered.reshape(trainer.world_size, len(values)).cpu().tolist()
    per_rank = {name: [row[i] for row in table] for i, name in enumerate(_SPREAD_FIELDS)}
    steps = per_rank["step_time_s"]
    waits = per_rank["data_wait_share"]
    # Synchronous DDP makes every rank's step equally long; the straggler is the rank that
    # spends most of its step on its own work (data wait) rather than waiting in all-reduce.
    own = [w * s for w, s in zip(waits, steps, strict=True)]
    straggler = max(range(len(own)), key=lambda i: (own[i], steps[i]))
    return RankSpread(window.first_step, per_rank, straggler)
