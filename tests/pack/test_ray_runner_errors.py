"""How the Ray runner of ``maxtp pack`` reads a task that raised, with a stand-in for Ray.

Ray's errors are the task's end (failed, lost, cancelled), each said in the job's log and
result; any other error is a bug of the runner and is raised, never taken for a job's end. The
runner on a real Ray instance is in ``test_ray_runner.py``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_maxtp.pack import JobSpec, ray_runner
from lightning_maxtp.pack.progress import Progress
from lightning_maxtp.pack.ray_placement import RayNode, plan_ray


class RayError(Exception):
    """Stands in for ``ray.exceptions.RayError``."""


class GetTimeoutError(RayError):
    pass


class TaskCancelledError(RayError):
    pass


class RayTaskError(RayError):
    pass


class NodeDiedError(RayError):
    pass


class _Ray:
    """``ray.get`` of the task's next ref raises ``error``."""

    exceptions = SimpleNamespace(
        RayError=RayError,
        GetTimeoutError=GetTimeoutError,
        TaskCancelledError=TaskCancelledError,
        RayTaskError=RayTaskError,
    )

    def __init__(self, error: Exception) -> None:
        self.error = error

    def remote(self, fn: Any) -> Any:
        return SimpleNamespace()

    def get(self, ref: Any, timeout: float) -> Any:
        raise self.error


def _drain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception, *, cancelled: bool = False
) -> tuple[Any, Path]:
    """One started attempt of one job whose task's next ref raises ``error``; drained."""
    monkeypatch.setattr(ray_runner, "import_ray", lambda: _Ray(error))
    monkeypatch.setattr(ray_runner, "next_ready_ref", lambda task: "ref")
    plan = plan_ray([JobSpec("true", name="a")], [RayNode("n", 2.0, 0.0, None)])
    run = ray_runner._RayRun(
        plan,
        tmp_path,
        fail_fast=False,
        retry_oom=False,
        progress=Progress(None, status_line=False),
        max_parallel=None,
    )
    path = tmp_path / "01-a.log"
    log = open(path, "wb")  # noqa: SIM115 - closed by the runner, or below
    attempt = ray_runner._Attempt(plan.demands[0], 1, object(), path, log, 0)
    attempt.start, attempt.started = {"host": "node-1"}, 0.0
    attempt.cancelled = cancelled
    run.tasks[0] = attempt
    try:
        run._drain(attempt)
    finally:
        log.close()
    return run, path


@pytest.mark.parametrize(
    ("error", "status", "line"),
    [
        (RayTaskError("ValueError: boom"), "failed", "# the Ray task failed: ValueError: boom"),
        (NodeDiedError(""), "lost", "# the Ray task was lost: NodeDiedError: "),
        (NodeDiedError("node 1 died\nmore"), "lost", "was lost: NodeDiedError: node 1 died\n"),
    ],
    ids=["task-raised", "node-died-without-a-word", "node-died"],
)
def test_a_ray_error_is_the_jobs_end_and_its_log_says_which(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception, status: str, line: str
) -> None:
    run, path = _drain(monkeypatch, tmp_path, error)
    assert run.results[0].status == status and not run.tasks
    assert line in path.read_text()


def test_an_error_that_is_not_rays_is_raised_not_taken_for_the_jobs_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(KeyError, match="a bug"):
        _drain(monkeypatch, tmp_path, KeyError("a bug"))


def test_a_task_this_runner_cancelled_is_stopped_whatever_error_it_ends_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Seen on a worker that inherited SIGINT ignored: Ray's interrupt of the cancelled task
    # failed inside the task with a TypeError, reported as the task's own error.
    error = RayTaskError("TypeError: 'Handlers' object is not callable")
    run, path = _drain(monkeypatch, tmp_path, error, cancelled=True)
    assert run.results[0].status == "stopped" and "# cancelled" in path.read_text()
    # The same error from a task nobody cancelled is the task's failure.
    run, _ = _drain(monkeypatch, tmp_path, error)
    assert run.results[0].status == "failed"
