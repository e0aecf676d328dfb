"""``LoaderPlan``: DataLoader settings chosen by measurement, with the evidence and the reason.

``tune_dataloader`` (in ``tune``) returns one; ``apply_loader_plan`` (in ``apply``) makes a
Trainer rebuild its loaders with it, and outside Lightning ``plan.build(loader)`` or
``DataLoader(dataset, ..., **plan.dataloader_kwargs())`` give a loader with everything the plan
measured, the workers' thread limit included. Plain data: importing this imports neither torch
nor lightning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING, Any

from lightning_maxtp._units import format_bytes
from lightning_maxtp.loader.budget import LoaderBudget
from lightning_maxtp.loader.candidate import LOADER_KNOBS, TARGET_MARGIN, LoaderCandidate, rate_text
from lightning_maxtp.loader.worker_limits import WorkerThreadLimit
from lightning_maxtp.observe.data_path import DataPathAdvice

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = ["LoaderPlan"]

_mib = partial(format_bytes, unit="MiB", digits=0)


@dataclass(frozen=True)
class LoaderPlan:
    """DataLoader settings chosen by measurement, with the evidence and the reason.

    Attributes:
        num_workers: Worker processes to use.
        prefetch_factor: Batches each worker loads ahead (``None`` without workers).
        pin_memory: Page-locked batches (only when training on a CUDA GPU).
        persistent_workers: Keep workers alive between epochs.
        worker_threads: Thread-pool limit inside each worker (0 without workers).
        samples_per_s: The chosen setting's measured rate, loader alone.
        startup_s: The chosen setting's start-up: workers plus the first batch.
        consumption_rate: Samples/s the device consumes, when it was given.
        target_met: Whether the loader reaches 1.25x the consumption rate (``None``: unknown).
        shortfall: When even the best setting is slower than the consumption rate, the share
            missing (0.3: the loader delivers 70 % of what the device could take).
        reason: Why these settings, in a sentence or two.
        diagnosis_kind: ``"data_pipeline"`` when the loader cannot keep up, else ``None``.
        recommendations: What to change next, most direct first.
        budget: The limits respected.
        candidates: Every setting measured, in the order measured.
        before: The loader's own settings.
        elapsed_s: Wall time of the tuning.
        notes: Caveats about this loader.
        data_path: When the loader falls short, the data path that fits (uint8 to the device,
            GPU decode, pre-encoding) with the numbers behind it; its lines lead the
            recommendations.
        user_worker_init_fn: The measured loader's own ``worker_init_fn``, run after the thread
            limit in ``dataloader_kwargs()``'s.
        forked_workers: Whether the measured loader's workers are forked (torch's and OpenMP's
            pools then stay at one thread in them; see ``WorkerThreadLimit``).
    """

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    worker_threads: int
    samples_per_s: float
    startup_s: float
    consumption_rate: float | None
    target_met: bool | None
    shortfall: float | None
    reason: str
    diagnosis_kind: str | None
    recommendations: tuple[str, ...]
    budget: LoaderBudget
    candidates: tuple[LoaderCandidate, ...]
    before: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    notes: tuple[str, ...] = ()
    data_path: DataPathAdvice | None = None
    user_worker_init_fn: Callable[[int], Any] | None = field(
        default=None, repr=False, compare=False
    )
    forked_workers: bool = False

    @property
    def target_rate(self) -> float | None:
        """1.25x the consumption rate, when known."""
        return None if self.consumption_rate is None else TARGET_MARGIN * self.consumption_rate

    def settings(self) -> dict[str, Any]:
        """The four DataLoader settings it chose: workers, prefetch, pinning, persistence."""
        return {k: getattr(self, k) for k in LOADER_KNOBS}

    def dataloader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a plain ``DataLoader``: the settings, the workers' thread limit.

        With workers it holds the ``worker_init_fn`` that applies the limit the plan measured
        with. Without the limit every worker would run BLAS/OpenMP with one thread per CPU, and a
        numpy-heavy dataset loads many times slower than measured. The returned
        ``worker_init_fn`` runs the measured loader's own one after the limit; pass the rest
        (dataset, batch size, sampler, collate) as before::

            loader = DataLoader(dataset, batch_size=64, shuffle=True, **plan.dataloader_kwargs())
        """
        kwargs = self.settings()
        if self.num_workers:
            kwargs["worker_init_fn"] = WorkerThreadLimit(
                self.worker_threads, self.user_worker_init_fn, forked=self.forked_workers
            )
        return kwargs

    def build(self, loader: DataLoader[Any]) -> DataLoader[Any]:
        """A new ``DataLoader`` like ``loader`` with everything the plan measured.

        Dataset, sampler (or batch sampler), collate function, batch size, generator, timeout
        and start method are ``loader``'s; workers, prefetch, pinning, persistence and the
        workers' thread limit (run before ``loader``'s own ``worker_init_fn``) are the plan's.
        ``loader`` itself is not changed. Inside Lightning, ``apply_loader_plan`` does this for
        the Trainer's loaders.
        """
        from lightning_maxtp.loader.measure import candidate_loader

        return candidate_loader(
            loader,
            num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor,
            pin_memory=self.pin_memory,
            threads=max(1, self.worker_threads),
            persistent_workers=self.persistent_workers,
        )

    def changes(self) -> list[str]:
        """``"num_workers: 0 -> 4"`` for each setting that differs from the loader's own."""
        return [
            f"{k}: {self.before.get(k)!r} -> {v!r}"
            for k, v in self.settings().items()
            if k in self.before and self.before[k] != v
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        # Read field by field: ``asdict`` would deep-copy the user's ``worker_init_fn`` (and a
        # bound method's whole dataset with it) only to leave it out.
        skip = ("budget", "candidates", "data_path", "user_worker_init_fn")
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        data["before"] = dict(self.before)
        return {
            **data,
            "target_rate": self.target_rate,
            "changes": self.changes(),
            "recommendations": list(self.recommendations),
            "notes": list(self.notes),
            "budget": self.budget.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
            "data_path": None if self.data_path is None else self.data_path.to_dict(),
        }

    def __str__(self) -> str:
        """A readable summary: settings, rate vs target, why, budget, then every candidate."""
        changes = ", ".join(self.changes()) or "no change"
        threads = f", {self.worker_threads} thread(s) per worker" if self.num_workers else ""
        lines = [f"LoaderPlan: {changes} (pin_memory={self.pin_memory}{threads})"]
        rate = f"  measured {rate_text(self.samples_per_s)} samples/s alone"
        if self.num_workers:
            rate += f", workers start in {self.startup_s:.2f} s"
        if self.consumption_rate is not None:
            status = "reached" if self.target_met else "not reached"
            if self.shortfall is not None:
                status = f"{self.shortfall:.0%} short of consumption"
            rate += (
                f"; consumption {rate_text(self.consumption_rate)}/s, target "
                f"{rate_text(self.target_rate or 0)}/s: {status}"
            )
        b = self.budget
        mem, shm = _mib(b.memory_bytes), _mib(b.shm_bytes)
        per = (
            ""
            if b.worker_memory_bytes is None
            else f" (largest worker {_mib(b.worker_memory_bytes)})"
        )
        lines += [
            rate,
            f"  why: {self.reason}",
            f"  budget: {b.max_workers} worker(s), limited by {b.limited_by} ({b.cpu_source}); "
            f"RAM for workers {mem}{per}, /dev/shm {shm}; tuned in {self.elapsed_s:.1f} s of "
            f"{b.time_budget_s:g} s",
        ]
        if self.diagnosis_kind:
            lines.append(f"  diagnosis: {self.diagnosis_kind}")
            lines += [f"    - {r}" for r in self.recommendations]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(
            f"  {'workers':>7} {'prefetch':>8} {'samples/s':>10} {'expected/s':>10} "
            f"{'start s':>7} {'batches':>7} {'worker MiB':>10}  note"
        )
        for c in self.candidates:
            mib = _mib(c.worker_memory_bytes, missing="-", suffix=False)
            chosen = (c.num_workers, c.prefetch_factor) == (self.num_workers, self.prefetch_factor)
            lines.append(
                f"  {c.num_workers:>7} {c.prefetch_factor or '-':>8} "
                f"{rate_text(c.samples_per_s):>10} {rate_text(c.expected_rate):>10} "
                f"{c.startup_s:>7.2f} {c.timed_batches:>7} {mib:>10}  {c.note}"
                f"{' <-' if chosen else ''}"
            )
        return "\n".join(lines)
