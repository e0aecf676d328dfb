"""The Ray task of ``maxtp pack`` and its driver, without a Ray instance: how a task's end is
read, and what the task does on its node when something fails.

Ray's errors are the task's end (failed, lost, cancelled), each said in the job's log and
result; any other error is a bug of the runner and is raised, never taken for a job's end. The
runner on a real Ray instance is in ``test_ray_runner.py``.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_maxtp.pack import JobSpec, proc, ray_task
from lightning_maxtp.pack.progress import Book, Progress
from lightning_maxtp.pack.ray_placement import RayNode, plan_ray


class RayError(Exception):
    """Stands in for ``ray.exceptions.RayError``."""


class TaskCancelledError(RayError):
    pass


class RayTaskError(RayError):
    pass


class NodeDiedError(RayError):
    pass


class _Ray:
    """``ray.get`` of the task's ref raises ``error``."""

    exceptions = SimpleNamespace(
        RayError=RayError, TaskCancelledError=TaskCancelledError, RayTaskError=RayTaskError
    )

    def __init__(self, error: Exception) -> None:
        self.error = error

    def remote(self, fn: Any) -> Any:
        return SimpleNamespace()

    def get(self, ref: Any) -> Any:
        raise self.error


def _final(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception, *, cancelled: bool = False
) -> tuple[Book, Path]:
    """One started attempt of one job whose task's ref raises ``error``; its end taken."""
    monkeypatch.setattr(ray_task, "import_ray", lambda: _Ray(error))
    plan = plan_ray([JobSpec("true", name="a")], [RayNode("n", 2.0, 0.0, None)])
    book = Book(plan.jobs, ["a"], tmp_path, Progress(None, status_line=False), "ray")
    run = ray_task._RayRun(plan, book, fail_fast=False, retry_oom=False)
    job = run.jobs[0]
    _, job.path, header = book.next_attempt(0)
    job.path.write_text(header)
    job.ref, job.start, job.cancelled = "ref", {"host": "node-1", "gpus": []}, cancelled
    run._final(job, "ref")
    return book, job.path


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
    book, path = _final(monkeypatch, tmp_path, error)
    assert book.results[0].status == status and book.results[0].node == "node-1"
    assert line in path.read_text()


def test_an_error_that_is_not_rays_is_raised_not_taken_for_the_jobs_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(KeyError, match="a bug"):
        _final(monkeypatch, tmp_path, KeyError("a bug"))


def test_a_task_this_runner_cancelled_is_stopped_whatever_error_it_ends_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Seen on a worker that inherited SIGINT ignored: Ray's interrupt of the cancelled task
    # failed inside the task with a TypeError, reported as the task's own error.
    error = RayTaskError("TypeError: 'Handlers' object is not callable")
    book, path = _final(monkeypatch, tmp_path, error, cancelled=True)
    assert book.results[0].status == "stopped" and "# cancelled" in path.read_text()
    # The same error from a task nobody cancelled is the task's failure.
    book, _ = _final(monkeypatch, tmp_path, error)
    assert book.results[0].status == "failed"


def test_a_failed_sample_still_stops_the_job_then_is_raised() -> None:
    sent: list[signal.Signals] = []

    def sample() -> None:
        raise RuntimeError("a bug in the sampler")

    tree = SimpleNamespace(sample=sample, signal=sent.append)
    popen = SimpleNamespace(returncode=-15)
    child = SimpleNamespace(tree=tree, popen=popen, pid=-1)
    with pytest.raises(RuntimeError, match="a bug in the sampler"):
        proc.kill(child, grace_s=0.0)  # type: ignore[arg-type]
    assert sent == [signal.SIGTERM, signal.SIGKILL]


def test_a_worker_that_inherited_sigint_ignored_gets_python_s_handler_back() -> None:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ray_task._interruptible()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, own := lambda *_: None)  # a handler someone set: kept
        ray_task._interruptible()
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)
