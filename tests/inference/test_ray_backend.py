"""The Ray backend's clean-up calls (``ray.kill``, ``ray.cancel``) with a stand-in for Ray.

An actor or call that is gone already, or a Ray that has shut down, is nothing left to stop:
no error. Anything else is a bug and is raised. The backend on a real Ray instance is in
``test_ray.py``.
"""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_maxtp.inference.ray_backend import RayBackend, _Actor, _RayRun
from lightning_maxtp.inference.records import WorkerSpec


class RayError(Exception):
    """Stands in for ``ray.exceptions.RayError``."""


class RaySystemError(RayError):
    pass


class RayActorError(RayError):
    actor_init_failed = False


class ActorUnschedulableError(RayError):
    pass


class _Ray:
    """``ray.kill`` and ``ray.cancel`` record what they were given, and raise ``fails[it]``."""

    exceptions = SimpleNamespace(
        RayError=RayError,
        RayActorError=RayActorError,
        ActorUnschedulableError=ActorUnschedulableError,
    )

    def __init__(self, fails: dict[str, Exception]) -> None:
        self.fails = fails
        self.stopped: list[str] = []

    def is_initialized(self) -> bool:
        return False

    def _stop(self, what: str) -> None:
        self.stopped.append(what)
        if what in self.fails:
            raise self.fails[what]

    def kill(self, handle: str) -> None:
        self._stop(handle)

    def cancel(self, ref: str) -> None:
        self._stop(ref)


def _backend(monkeypatch: pytest.MonkeyPatch, fails: dict[str, Exception]) -> Any:
    """A backend with two actors, handles ``"h0"`` and ``"h1"``, under a stand-in Ray."""
    ray = _Ray(fails)
    monkeypatch.setitem(sys.modules, "ray", ray)
    backend = RayBackend({})
    spec = WorkerSpec("cpu", None, 1, 1)
    backend._actors = [_Actor(i, spec, handle=f"h{i}", ready=True) for i in range(2)]
    relaunched = SimpleNamespace(info=SimpleNamespace(remote=lambda: "ready"))
    backend._remote = SimpleNamespace(
        options=lambda **_: SimpleNamespace(remote=lambda spec, config: relaunched)
    )
    return backend, ray


GONE = [
    RayActorError("the actor is dead"),
    RaySystemError("Ray has not been started yet"),
    ValueError("the actor is not known (older Rays)"),
]


@pytest.mark.parametrize("error", GONE, ids=lambda e: type(e).__name__)
def test_close_kills_every_actor_past_one_that_is_gone(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    backend, ray = _backend(monkeypatch, {"h0": error})
    backend.close()
    assert ray.stopped == ["h0", "h1"]
    assert all(a.handle is None for a in backend._actors)


def test_close_raises_what_is_no_gone_actor(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _ = _backend(monkeypatch, {"h0": TypeError("a bug")})
    with pytest.raises(TypeError, match="a bug"):
        backend.close()


def _run(backend: Any) -> _RayRun:
    run = _RayRun(backend, 1, 2, "raise", 0.0)
    run.where = {"r0": (backend._actors[0], 0), "r1": (backend._actors[1], 1)}
    return run


@pytest.mark.parametrize("error", GONE, ids=lambda e: type(e).__name__)
def test_abandon_cancels_every_call_past_one_that_is_gone(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    backend, ray = _backend(monkeypatch, {"r0": error})
    run = _run(backend)
    run.abandon()
    assert ray.stopped == ["r0", "r1"] and not run.where


def test_abandon_raises_what_is_no_finished_call(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _ = _backend(monkeypatch, {"r0": TypeError("a bug")})
    with pytest.raises(TypeError, match="a bug"):
        _run(backend).abandon()


@pytest.mark.parametrize("error", GONE, ids=lambda e: type(e).__name__)
def test_a_dead_actor_that_cannot_be_killed_is_replaced_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    backend, ray = _backend(monkeypatch, {"h0": error})
    actor = backend._actors[0]
    with caplog.at_level(logging.WARNING, logger="lightning_maxtp"):
        _run(backend)._died(actor, RayActorError("The actor died unexpectedly"))
    assert ray.stopped == ["h0"] and actor.restarts == 1 and actor.ready_ref == "ready"
    assert "Ray actor #0 died (RayActorError: The actor died unexpectedly)" in caplog.text


def test_a_dead_actor_whose_kill_fails_otherwise_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _ = _backend(monkeypatch, {"h0": TypeError("a bug")})
    with pytest.raises(TypeError, match="a bug"):
        _run(backend)._died(backend._actors[0], RayActorError("The actor died unexpectedly"))
