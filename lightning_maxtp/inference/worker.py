"""The worker process of ``BatchInferencePool``: one model copy, a thread pool for I/O, batches.

This module is what a spawned worker imports first, so it imports nothing heavy at module level:
torch is imported inside ``worker_main`` after ``CUDA_VISIBLE_DEVICES`` and the thread counts are
set, and lightning is never imported (8 s of start-up for nothing).

Protocol (pickled tuples over one duplex pipe, standard pickle so tensors travel as bytes and no
shared memory outlives a killed worker):

* coordinator -> worker: ``("batch", batch_id, [(index, item), ...])`` or ``("stop",)``;
* worker -> coordinator: ``("ready", info)``, ``("result", batch_id, [(index, output), ...],
  [ItemError, ...])``, or ``("fatal", traceback)`` when the model cannot be built.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from lightning_maxtp.inference.batching import default_collate, split_output, to_device, to_host
from lightning_maxtp.inference.records import ItemError, WorkerSpec

_Prepared = tuple[bool, Any]  # (ok, value or ItemError)


@dataclass
class _Launched:
    """A batch whose forward is queued on the device; its outputs are read in ``_finish``."""

    batch_id: int
    indices: list[int]
    output: Any
    event: Any
    errors: list[ItemError]


class _Rows(list[Any]):
    """Outputs already split per item (the one-by-one fallback), unlike a model's own list."""


def send(conn: Connection, message: tuple[Any, ...]) -> None:
    """Send one protocol message (standard pickle: no shared-memory handles)."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> tuple[Any, ...]:
    """Receive one protocol message."""
    message = pickle.loads(conn.recv_bytes())
    assert isinstance(message, tuple)
    return message


def worker_main(conn: Connection, spec: WorkerSpec, payload: bytes) -> None:
    """Entry point of a spawned worker: build the model, then serve batches until told to stop."""
    # Ctrl-C reaches the whole process group; the coordinator decides how workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.cuda_visible_devices is not None:
        # Before torch initialises CUDA: the worker then sees its one GPU as cuda:0.
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(spec.torch_threads)
    try:
        worker = _Worker(spec, payload)
    except BaseException:
        send(conn, ("fatal", traceback.format_exc()))
        return
    send(conn, ("ready", worker.info()))
    # EOF or a broken pipe: the coordinator went away, nothing left to serve.
    with contextlib.suppress(EOFError, BrokenPipeError, ConnectionResetError):
        worker.serve(conn)


class _Worker:
    def __init__(self, spec: WorkerSpec, payload: bytes) -> None:
        import torch

        torch.set_num_threads(spec.torch_threads)
        config = pickle.loads(payload)
        self.spec = spec
        self.load: Callable[[Any], Any] | None = config["load"]
        self.preprocess: Callable[[Any], Any] | None = config["preprocess"]
        self.collate: Callable[[list[Any]], Any] = config["collate"] or default_collate
        cuda = spec.device.startswith("cuda")
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        self.dtype = _autocast_dtype(config["precision"], self.device)
        model = config["model_factory"]()
        if isinstance(model, torch.nn.Module):
            model = model.to(self.device).eval()
        self.model: Callable[[Any], Any] = model

    def info(self) -> dict[str, Any]:
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

    def serve(self, conn: Connection) -> None:
        # A reader thread empties the pipe at once, so the coordinator never blocks sending a
        # batch while this worker is busy in a forward.
        inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        threading.Thread(target=_read, args=(conn, inbox), name="maxtp-inbox", daemon=True).start()
        pending: deque[tuple[int, list[tuple[int, Any]], list[Future[_Prepared]]]] = deque()
        launched: _Launched | None = None
        with ThreadPoolExecutor(self.spec.io_threads, thread_name_prefix="maxtp-io") as io:
            while True:
                # Take every batch already sent, so its items load while the model runs.
                block = not pending and launched is None
                while True:
                    try:
                        message = inbox.get(block=block)
                    except queue.Empty:
                        break
                    if message[0] == "stop":
                        io.shutdown(wait=False, cancel_futures=True)  # leave queued loads
                        return
                    _, batch_id, entries = message
                    futures = [io.submit(self._prepare, i, item) for i, item in entries]
                    pending.append((batch_id, entries, futures))
                    block = False
                current = self._launch(*pending.popleft()) if pending else None
                # The previous batch finishes while this one runs on the GPU.
                if launched is not None:
                    self._finish(conn, launched)
                launched = current

    def _prepare(self, index: int, item: Any) -> _Prepared:
        value = item
        for stage, fn in (("load", self.load), ("preprocess", self.preprocess)):
            if fn is None:
                continue
            try:
                value = fn(value)
            except Exception as error:
                return False, _item_error(index, stage, error, item)
        return True, value

    def _launch(
        self, batch_id: int, entries: list[tuple[int, Any]], futures: list[Future[_Prepared]]
    ) -> _Launched:
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
            return _Launched(batch_id, [], None, None, errors)
        items = dict(entries)
        try:
            return _Launched(batch_id, indices, *self._forward(values), errors)
        except Exception as error:
            if _is_fatal(error):
                raise  # a broken CUDA context: die, so the batch is retried on a fresh worker
            if len(values) == 1:
                errors.append(_item_error(indices[0], "forward", error, items[indices[0]]))
                return _Launched(batch_id, [], None, None, errors)
        # Some item breaks the batch: run them one by one to isolate it.
        outputs: list[Any] = []
        kept: list[int] = []
        for index, value in zip(indices, values, strict=True):
            try:
                out, event = self._forward([value])
                if event is not None:
                    event.synchronize()
                outputs.append(split_output(out, 1)[0])
                kept.append(index)
            except Exception as error:
                if _is_fatal(error):
                    raise
                errors.append(_item_error(index, "forward", error, items[index]))
        return _Launched(batch_id, kept, _Rows(outputs), None, errors)

    def _forward(self, values: list[Any]) -> tuple[Any, Any]:
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

    def _finish(self, conn: Connection, launched: _Launched) -> None:
        if launched.event is not None:
            launched.event.synchronize()  # the non-blocking copy to the host is complete now
        outputs: list[tuple[int, Any]] = []
        errors, indices, output = launched.errors, launched.indices, launched.output
        if indices:
            try:
                rows = output if isinstance(output, _Rows) else split_output(output, len(indices))
                outputs = list(zip(indices, rows, strict=True))
            except Exception as error:
                errors = errors + [_item_error(i, "forward", error, None) for i in indices]
        send(conn, ("result", launched.batch_id, outputs, errors))


def _read(conn: Connection, inbox: queue.Queue[tuple[Any, ...]]) -> None:
    try:
        while True:
            message = receive(conn)
            inbox.put(message)
            if message[0] == "stop":
                return
    except (EOFError, OSError):
        inbox.put(("stop",))  # the coordinator is gone


def _autocast_dtype(precision: str, device: Any) -> Any:
    import torch

    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    if precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def _is_fatal(error: Exception) -> bool:
    import torch

    if isinstance(error, torch.cuda.OutOfMemoryError):
        return False
    return "CUDA error" in str(error) or type(error).__name__ == "AcceleratorError"


def _item_error(index: int, stage: str, error: BaseException, item: Any) -> ItemError:
    return ItemError(
        index=index,
        stage=stage,
        error_type=type(error).__name__,
        message=str(error),
        traceback="".join(traceback.format_exception(error)),
        item_repr="" if item is None else repr(item)[:200],
    )
