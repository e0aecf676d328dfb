"""What a pool changes while it runs: its shape, its batch size, its copies per GPU.

``Adaptive`` is the part of ``BatchInferencePool`` that acts on measurements: the measured
plan's verdicts, the batch-size search (inline in the caller, or in the first worker process,
which reports back), and more model copies on a GPU once the first copy's memory is known.
Every change is recorded in ``pool.plan.decisions``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from lightning_maxtp._log import prefixed
from lightning_maxtp._units import format_bytes
from lightning_maxtp.inference.coordinator import Run, Slot, start_slot, stop_slots
from lightning_maxtp.inference.memory import CONTEXT_BYTES, extra_copies
from lightning_maxtp.inference.plan import MAX_WORKERS_PER_GPU, cpu_split
from lightning_maxtp.inference.records import InferencePlan, WorkerSpec
from lightning_maxtp.inference.shape import Verdict

log = logging.getLogger(__name__)

PROBE_BATCH = 32
"""Items of the first batch with ``batch_size="auto"``: the search's sample, then a batch."""
SEARCH_CPU = {"cap": 256, "time_budget_s": 3.0}
"""On a CPU a batch past a few hundred gains nothing, and the search must stay a small part of a
short job; on a GPU the search goes to 2048 within 20 s."""
SEARCH_GPU = {"cap": 2048, "time_budget_s": 20.0}


class Adaptive:
    """Mixin of ``BatchInferencePool``: the plan's changes (see the module docstring)."""

    plan: InferencePlan
    batch_size: int
    batch_choice: dict[str, Any] | None
    _shape: str | None
    _slots: list[Slot]
    _payload: bytes
    _runner: Any
    _grow: bool
    _free: dict[int, int | None]
    _config: dict[str, Any]
    _io_threads: int | None
    _cores: int
    _build_s: float
    _grown: set[str]
    _max_in_flight: int | None
    max_in_flight: int

    def _spawn(self) -> list[Slot]:
        import multiprocessing

        if self._slots:  # a trial's workers still starting, or running: use them
            return self._slots
        context = multiprocessing.get_context("spawn")
        for worker_id, spec in enumerate(self.plan.workers):
            slot = Slot(worker_id, spec)
            self._slots.append(slot)
            start_slot(context, slot, self._payload)
        return self._slots

    def _stop_workers(self) -> None:
        stop_slots(self._slots, timeout_s=5.0)
        self._slots = []

    def _build_inline(self) -> None:
        import torch

        from lightning_maxtp.inference.runner import BatchRunner

        first = self.plan.workers[0] if self.plan.workers else None
        device = "cpu" if first is None or first.device == "cpu" else first.device
        # One process's torch threads, as a plain loop has; loading overlaps on a few threads.
        io = self._io_threads or (first.io_threads if first is not None and device != "cpu" else 0)
        spec = WorkerSpec(device, None, torch.get_num_threads(), io or max(1, self._cores // 2))
        began = time.perf_counter()
        self._runner = BatchRunner(spec, self._config, device=device)
        self._build_s = time.perf_counter() - began

    def _decided(self, verdict: Verdict) -> None:
        # Only a trial's verdict lasts: a short input staying inline says nothing of the next.
        if verdict.mode in ("processes", "reverted"):
            self._shape = "processes" if verdict.mode == "processes" else "reverted"
        self.plan = dataclasses.replace(
            self.plan,
            decisions=_kept(self.plan.decisions, verdict.why),
            mode={"reverted": "inline"}.get(self._shape or "", self._shape or self.plan.mode),
        )
        log.info(prefixed("inference: %s"), verdict.why)

    def _search_options(self) -> dict[str, Any]:
        runner = self._runner
        cpu = runner.device.type == "cpu" if runner is not None else self.plan.devices == ("cpu",)
        return dict(SEARCH_CPU if cpu else SEARCH_GPU)

    def _search_inline(self, head: list[tuple[int, Any]]) -> None:
        from lightning_maxtp.inference.batch_search import search_inference_batch

        prepared = [f.result() for f in self._runner.submit(head)]
        values = [value for ok, value in prepared if ok]
        if values:
            try:
                choice = search_inference_batch(self._runner, values, **self._search_options())
            except Exception as error:  # nothing fit, or an item breaks the model: say why
                self._batch_chosen({"error": f"{type(error).__name__}: {error}"})
            else:
                self._batch_chosen(choice.to_dict())

    def _batch_chosen(self, choice: dict[str, Any]) -> None:
        if "error" in choice:
            choice = {
                "batch_size": self.batch_size,
                "reason": (f"the search failed ({choice['error']}); batch {self.batch_size} kept"),
            }
        self.batch_size = int(choice["batch_size"])
        self.plan = dataclasses.replace(
            self.plan,
            batch_size=self.batch_size,
            decisions=_kept(self.plan.decisions, f"batch size: {choice['reason']}"),
        )
        self.batch_choice = choice
        log.info(prefixed("inference: batch size %s"), choice["reason"])

    def _on_message(self, run: Run, slot: Slot, message: tuple[Any, ...]) -> None:
        if message[0] == "searched":
            if message[1] is None:  # every item of that batch failed: search on the next one
                run.search = self._search_options()
                return
            self._batch_chosen(message[1])
            run.batch_size = self.batch_size
            peak = message[1].get("peak_memory_bytes")
            if self._grow and peak:  # the copies must hold the searched size, not the probe's
                self._add_copies(run, slot, int(peak) + CONTEXT_BYTES)
        elif message[0] == "memory" and self._grow and self.plan.batch_size is not None:
            self._add_copies(run, slot, int(message[1]))

    def _add_copies(self, run: Run, slot: Slot, per_copy: int) -> None:
        """More copies of the model on ``slot``'s GPU, now that one copy's memory is known."""
        import multiprocessing

        if slot.spec.device in self._grown:  # once per GPU: later copies see the others' memory
            return
        self._grown.add(slot.spec.device)
        index = int(slot.spec.device.split(":")[1])
        running = sum(1 for s in self._slots if s.spec.device == slot.spec.device)
        extra = extra_copies(
            self._free, per_copy, {index: running}, max_copies=MAX_WORKERS_PER_GPU
        )[index]
        why = (
            f"cuda:{index}: one copy holds {format_bytes(per_copy)}; "
            f"{running + extra} cop{'y' if running + extra == 1 else 'ies'} run (the free memory "
            f"with 2.5 GiB headroom, at most {MAX_WORKERS_PER_GPU})"
        )
        self._decided(Verdict("copies", why))
        context = multiprocessing.get_context("spawn")
        # The new copies share the cores with every copy now planned: their own split, not the
        # first copy's (the copies already running keep theirs).
        copies = len(self._slots) + extra
        threads, io = cpu_split(self._cores, copies, self._io_threads)
        spec = dataclasses.replace(slot.spec, torch_threads=threads, io_threads=io)
        for _ in range(extra):
            new = Slot(len(self._slots), spec)
            self._slots.append(new)
            start_slot(context, new, self._payload)
            run.add_slot(new)
        self.plan = dataclasses.replace(self.plan, workers=tuple(s.spec for s in self._slots))
        if self._max_in_flight is None:  # keep 4 batches per copy in flight, as planned
            self.max_in_flight = run.max_in_flight = 4 * len(self._slots)


MAX_DECISIONS = 20
"""``plan.decisions`` keeps the first and the latest verdicts: a pool mapping many short inputs
would otherwise grow one line per call."""


def _kept(decisions: tuple[str, ...], why: str) -> tuple[str, ...]:
    """``decisions`` plus ``why``, at most ``MAX_DECISIONS``: the first half and the latest."""
    out = (*decisions, why)
    if len(out) <= MAX_DECISIONS:
        return out
    head = MAX_DECISIONS // 2
    return (*out[:head], *out[len(out) - (MAX_DECISIONS - head) :])
