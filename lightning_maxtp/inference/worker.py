"""The worker process of ``BatchInferencePool``: one model copy, a thread pool for I/O, batches.

This module is what a spawned worker imports first, so it imports nothing heavy at module level:
torch is imported inside ``worker_main``, and lightning is never imported (8 s of start-up for
nothing). ``CUDA_VISIBLE_DEVICES`` and the thread counts are in the environment the parent
started the process with (``coordinator.child_environment``).

Protocol (pickled tuples over one duplex pipe, standard pickle so tensors travel as bytes and no
shared memory outlives a killed worker):

* coordinator -> worker: ``("batch", batch_id, [(index, item), ...], search)`` (``search``:
  ``None``, or the batch-size search's options: run it on this batch's items first) or
  ``("stop",)``;
* worker -> coordinator: ``("ready", info)``, ``("result", batch_id, [(index, output), ...],
  [ItemError, ...])``, ``("searched", InferenceBatchChoice.to_dict())``, ``("memory", bytes)``
  (one model copy's device memory, after the first batch on a GPU), or ``("fatal", traceback)``
  when the model cannot be built.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import signal
import threading
import traceback
from collections import deque
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from lightning_maxtp.inference.memory import copy_bytes
from lightning_maxtp.inference.records import WorkerSpec
from lightning_maxtp.inference.runner import BatchRunner, Entries, Launched


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
    # CUDA_VISIBLE_DEVICES and the thread counts came with the environment the parent started
    # this process in (``coordinator.child_environment``): set before this module was imported.
    try:
        runner = BatchRunner(spec, pickle.loads(payload))
    except BaseException:
        send(conn, ("fatal", traceback.format_exc()))
        return
    send(conn, ("ready", runner.info()))
    # EOF or a broken pipe: the coordinator went away, nothing left to serve.
    with contextlib.suppress(EOFError, BrokenPipeError, ConnectionResetError):
        _serve(conn, runner)


def _serve(conn: Connection, runner: BatchRunner) -> None:
    # A reader thread empties the pipe at once, so the coordinator never blocks sending a
    # batch while this worker is busy in a forward.
    inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
    threading.Thread(target=_read, args=(conn, inbox), name="maxtp-inbox", daemon=True).start()
    pending: deque[tuple[int, Entries, list[Future[Any]]]] = deque()
    launched: Launched | None = None
    reported = False
    try:
        while True:
            # Take every batch already sent, so its items load while the model runs.
            block = not pending and launched is None
            while True:
                try:
                    message = inbox.get(block=block)
                except queue.Empty:
                    break
                if message[0] == "stop":
                    return
                _, batch_id, entries, search = message
                futures = runner.submit(entries)
                if search is not None:
                    send(conn, ("searched", _search(runner, futures, search)))
                pending.append((batch_id, entries, futures))
                block = False
            current = runner.launch(*pending.popleft()) if pending else None
            # The previous batch finishes while this one runs on the GPU.
            if launched is not None:
                send(conn, ("result", launched.batch_id, *runner.complete(launched)))
                if not reported and runner.device.type == "cuda":
                    reported = True
                    send(conn, ("memory", copy_bytes(runner.device, runner.used_before)))
            launched = current
    finally:
        runner.close()


def _search(runner: BatchRunner, futures: list[Future[Any]], options: dict[str, Any]) -> Any:
    """The batch-size search on the prepared items of the first batch (None if all failed)."""
    from lightning_maxtp.inference.batch_search import search_inference_batch

    values = [value for ok, value in (f.result() for f in futures) if ok]
    if not values:
        return None
    try:
        return search_inference_batch(runner, values, **options).to_dict()
    except Exception as error:  # the pool keeps its probe size and says why
        return {"error": f"{type(error).__name__}: {error}"}


def _read(conn: Connection, inbox: queue.Queue[tuple[Any, ...]]) -> None:
    try:
        while True:
            message = receive(conn)
            inbox.put(message)
            if message[0] == "stop":
                return
    except (EOFError, OSError):
        inbox.put(("stop",))  # the coordinator is gone
