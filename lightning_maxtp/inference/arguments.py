"""Argument checks of ``BatchInferencePool``: each error names the argument, the value, the fix."""

from __future__ import annotations

import pickle

from lightning_maxtp._checks import COUNT, SECONDS, refuse_bool

ON_ERROR = ("raise", "skip", "return")
PRECISIONS = ("auto", "32", "fp32", "bf16", "fp16")
MODES = ("auto", "processes", "inline")
BACKENDS = ("local", "ray")


def check_arguments(
    *,
    batch_size: object,
    max_retries: object,
    max_in_flight: object,
    on_error: str,
    precision: str,
    mode: str,
    backend: str,
    start_timeout_s: float,
    workers_per_device: object = "auto",
    io_threads: object = None,
    model_bytes: object = None,
) -> None:
    """Raise ``ValueError`` naming the first argument of the pool that is out of range."""
    refuse_bool("workers_per_device", workers_per_device, f"{COUNT} >= 1 or 'auto'", 2)
    refuse_bool("io_threads", io_threads, f"{COUNT} >= 1 or None", 4)
    refuse_bool("model_bytes", model_bytes, f"{COUNT} of bytes > 0 or None", 2**30)
    refuse_bool("start_timeout_s", start_timeout_s, SECONDS, 600)
    if batch_size != "auto":
        _check_int("batch_size", batch_size, 1, 64, "or 'auto'")
    _check_int("max_retries", max_retries, 0, 2)
    if max_in_flight is not None:
        _check_int("max_in_flight", max_in_flight, 1, 8)
    for name, value, allowed in (
        ("on_error", on_error, ON_ERROR),
        ("precision", str(precision), PRECISIONS),
        ("mode", mode, MODES),
        ("backend", backend, BACKENDS),
    ):
        if value not in allowed:
            raise ValueError(f"`{name}` must be one of {allowed}, got {value!r}")
    if start_timeout_s <= 0:
        raise ValueError(f"`start_timeout_s` must be > 0, got {start_timeout_s!r}")


def _check_int(name: str, value: object, minimum: int, example: int, alternative: str = "") -> None:
    other = f" {alternative}" if alternative else ""
    refuse_bool(name, value, f"{COUNT} >= {minimum}{other}", example)
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}{other}, got {value!r}")


def check_picklable(name: str, fn: object) -> None:
    """Raise ``ValueError`` if ``fn`` cannot reach a spawned worker."""
    try:
        pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        raise ValueError(
            f"`{name}` must be picklable to reach the spawned worker processes, got {fn!r} "
            f"({type(error).__name__}: {error}); define it as a module-level function (`def`, "
            "not a lambda or a nested function) or pass functools.partial(module_level_fn, ...)"
        ) from error
