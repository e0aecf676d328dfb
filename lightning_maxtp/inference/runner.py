"""One model copy and its I/O threads: what a worker process, the inline mode and Ray run.

``BatchRunner`` builds the model once (moved to its device, eval mode), runs ``load`` and
``preprocess`` on a thread pool, and turns a batch of ``(index, item)`` entries into
``(index, output)`` pairs and ``ItemError``s: an item that fails is isolated (the batch is run
one by one) and never takes the others with it. Nothing heavy is imported at module level: a
spawned worker sets ``CUDA_VISIBLE_DEVICES`` and thread counts before torch is imported.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from lightning_maxtp.inference.batching import default_collate, split_output, to_device, to_host
from lightning_maxtp.inference.memory import used_bytes
from lightning_maxtp.inference.records import ItemError, WorkerSpec

Entries = list[tuple[int, Any]]
"""A batch as sent: ``(index in the input, item)`` pairs."""
Outcome = tuple[list[tuple[int, Any]], list[ItemError]]
"""A batch's result: ``(index, output)`` pairs and the items that failed."""
_Prepared = tuple[bool, Any]  # (ok, value or ItemError)


@dataclass
class Launched:
    """A batch whose forward is queued on the device; ``complete`` reads its outputs."""

    batch_id: int
    indices: list[int]
    output: Any
    event: Any
    errors: list[ItemError]


class _Rows(list[Any]):
    """Outputs already split per item (the one-by-one fallback), unlike a model's own list."""


class BatchRunner:
    """One model copy on one device, with ``spec.io_threads`` threads for ``load``/``preprocess``.

    Args:
        spec: Where it runs and with how many threads (``torch.set_num_threads`` is applied).
        config: ``model_factory``, ``load``, ``preprocess``, ``collate`` and ``precision``, as
            ``BatchInferencePool`` checked them.
        device: Overrides the device: by default ``cuda:0`` for a CUDA spec (the worker sees its
            one GPU through ``CUDA_VISIBLE_DEVICES``), else the CPU.
    """

    def __init__(self, spec: WorkerSpec, config: Mapping[str, Any], *, device: Any = None) -> None:
        import torch

        if spec.torch_threads != torch.get_num_threads():
            torch.set_num_threads(spec.torch_threads)
        self.spec = spec
        self.load: Callable[[Any], Any] | None = config["load"]
        self.preprocess: Callable[[Any], Any] | None = config["preprocess"]
        self.collate: Callable[[list[Any]], Any] = config["collate"] or default_collate
        cuda = spec.device.startswith("cuda")
        if device is None:
            device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is not None:
            # Events, streams and the bf16 check use the current device: make it this one.
            torch.cuda.set_device(self.device)
        self.dtype = autocast_dtype(config["precision"], self.device)
        self.used_before: int | None = None
        """CUDA: the device's memory in use once this copy's context exists, before its model
        (``memory.copy_bytes`` measures the copy from there)."""
        if self.device.type == "cuda":
            self.used_before = used_bytes(self.device)
        model = config["model_factory"]()
        if isinstance(model, torch.nn.Module):
            model = model.to(self.device).eval()
        self.model: Callable[[Any], Any] = model
        self.io = ThreadPoolExecutor(spec.io_threads, thread_name_prefix="maxtp-io")

    def info(self) -> dict[str, Any]:
        """What this copy runs with (pid, device, threads, autocast, ...), JSON-safe."""
        import torch

        return {
            "pid": os.getpid(),
            "device": self.spec.device,
            "torch_threads": torch.get_num_threads(),
            "io_threads": self.spec.io_threads,
            "autocast": str(self.dtype) if self.dtype is not None else None,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "lightning_imported": "lightning" in sys.modules,
        }

    def close(self) -> None:
        """Stop the I/O threads, leaving queued loads undone."""
        self.io.shutdown(wait=False, cancel_futures=True)

    def submit(self, entries: Entries) -> list[Future[_Prepared]]:
        """Start ``load``/``preprocess`` of every entry on the I/O threads."""
        return [self.io.submit(self._prepare, index, item) for index, item in entries]

    def run(self, entries: Entries) -> Outcome:
        """One batch, start to end: load, forward, outputs on the host."""
        return self.complete(self.launch(0, entries, self.submit(entries)))

    def stream(self, batches: Iterable[Entries]) -> Iterator[tuple[Entries, Outcome]]:
        """Run ``batches`` in order, loading the next while the current one runs."""
        iterator = iter(batches)
        ahead: tuple[Entries, list[Future[_Prepared]]] | None = None
        while True:
            if ahead is None:
                entries = next(iterator, None)
                if entries is None:
                    return
                ahead = (entries, self.submit(entries))
            entries, futures = ahead
            following = next(iterator, None)
            ahead = None if following is None else (following, self.submit(following))
            yield entries, self.complete(self.launch(0, entries, futures))
            if ahead is None:
                return

    def _prepare(self, index: int, item: Any) -> _Prepared:
        value = item
        for stage, fn in (("load", self.load), ("preprocess", self.preprocess)):
            if fn is None:
                continue
            try:
                value = fn(value)
            except Exception as error:
                return False, item_error(index, stage, error, item)
        return True, value

    def launch(self, batch_id: int, entries: Entries, futures: list[Future[_Prepared]]) -> Launched:
        """Wait for the entries' loads and queue the forward (CUDA runs it asynchronously)."""
        indices: list[int] = []
        values: list[Any] = []
        errors: list[ItemError] = []
        for (index, _), future in zip(entries, futures, strict=True):
            ok, value = future.result()
            if ok:
                indices.append(index)
                values.append(value)
            else:
                errors.append(value)
        if not values:
            return Launched(batch_id, [], None, None, errors)
        items = dict(entries)
        try:
            return Launched(batch_id, indices, *self.forward(values), errors)
        except Exception as error:
            if is_fatal(error):
                raise  # a broken CUDA context: die, so the batch is retried on a fresh worker
            if len(values) == 1:
                errors.append(item_error(indices[0], "forward", error, items[indices[0]]))
                return Launched(batch_id, [], None, None, errors)
        # Some item breaks the batch: run them one by one to isolate it.
        outputs: list[Any] = []
        kept: list[int] = []
        for index, value in zip(indices, values, strict=True):
            try:
                out, event = self.forward([value])
                if event is not None:
                    event.synchronize()
                outputs.append(split_output(out, 1)[0])
                kept.append(index)
            except Exception as error:
                if is_fatal(error):
                    raise
                errors.append(item_error(index, "forward", error, items[index]))
        return Launched(batch_id, kept, _Rows(outputs), None, errors)

    def forward(self, values: list[Any]) -> tuple[Any, Any]:
        """Collate, copy to the device, run the model; the output's host copy and its event."""
        import torch

        batch = self.collate(values)
        cuda = self.device.type == "cuda"
        batch = to_device(batch, self.device, pin=cuda)
        with (
            torch.inference_mode(),
            torch.autocast(self.device.type, self.dtype or torch.float32, self.dtype is not None),
        ):
            output = self.model(batch)
        output = to_host(output, non_blocking=cuda, upcast=self.dtype is not None)
        if not cuda:
            return output, None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return output, event

    def complete(self, launched: Launched) -> Outcome:
        """Wait for the host copy, split the output per item."""
        if launched.event is not None:
            launched.event.synchronize()  # the non-blocking copy to the host is complete now
        outputs: list[tuple[int, Any]] = []
        errors, indices, output = launched.errors, launched.indices, launched.output
        if indices:
            try:
                rows = output if isinstance(output, _Rows) else split_output(output, len(indices))
                outputs = list(zip(indices, rows, strict=True))
            except Exception as error:
                errors = errors + [item_error(i, "forward", error, None) for i in indices]
        return outputs, errors


def autocast_dtype(precision: str, device: Any) -> Any:
    """The autocast dtype for ``precision`` on ``device`` (``None``: no autocast)."""
    import torch

    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    if precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def is_fatal(error: Exception) -> bool:
    """Whether ``error`` broke the device (the process must die), not just this batch."""
    import torch

    if isinstance(error, torch.cuda.OutOfMemoryError):
        return False
    return "CUDA error" in str(error) or type(error).__name__ == "AcceleratorError"


def item_error(index: int, stage: str, error: BaseException, item: Any) -> ItemError:
    """The ``ItemError`` of one item that failed in ``stage``."""
    return ItemError(
        index=index,
        stage=stage,
        error_type=type(error).__name__,
        message=str(error),
        traceback="".join(traceback.format_exception(error)),
        item_repr="" if item is None else repr(item)[:200],
    )
