"""What ``maxtp pack`` shows while it runs, on either backend.

Event lines, the live status line, and where each attempt's log goes.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from lightning_maxtp._log import prefixed
from lightning_maxtp.pack.results import JobResult

__all__ = ["Progress", "attempt_log_path", "counts_text", "default_log_dir", "log_header"]

log = logging.getLogger(__name__)


def default_log_dir() -> Path:
    """``maxtp-pack-logs/<date-time>-<pid>`` under the current directory."""
    return Path("maxtp-pack-logs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def attempt_log_path(folder: Path, job: int, name: str, attempt: int) -> Path:
    """``<folder>/03-name.log`` for a job's first attempt, ``03-name.retry1.log`` for the next."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:60] or "job"
    suffix = "" if attempt == 1 else f".retry{attempt - 1}"
    return folder / f"{job + 1:02d}-{safe}{suffix}.log"


def log_header(name: str, attempt: int, command: str, **lines: str) -> str:
    """The ``# ...`` lines a job's log starts with (the job's own output follows)."""
    extra = "".join(f"# {key}: {value}\n" for key, value in lines.items())
    return f"# maxtp pack: {name} (attempt {attempt})\n# command: {command}\n{extra}"


def counts_text(running: int, queued: int, done: Iterable[JobResult], elapsed_s: float) -> str:
    """``[maxtp pack 12s] 2 running, 1 queued, 3 done (0 failed)``: the status line's head."""
    finished = list(done)
    failed = sum(j.failed for j in finished)
    return (
        f"[maxtp pack {elapsed_s:.0f}s] {running} running, {queued} queued, "
        f"{len(finished)} done ({failed} failed)"
    )


class Progress:
    """One line per event (job start, end, retry) and a live status line, on ``stream``.

    On a terminal the status line is rewritten in place; elsewhere a new one is written only
    when its counts change, so a log file does not fill with them.
    """

    def __init__(self, stream: IO[str] | None, *, status_line: bool) -> None:
        self.stream, self.status_line = stream, status_line
        self._tty = stream is not None and stream.isatty()
        self._last_counts = ""

    def event(self, text: str) -> None:
        """Log ``text`` and write it as its own line."""
        log.info(prefixed("pack: %s"), text)
        if self.stream is not None:
            clear = "\r\x1b[K" if self.status_line and self._tty else ""
            self.stream.write(f"{clear}[maxtp pack] {text}\n")
            self.stream.flush()

    def status(self, text: str) -> None:
        """Show the status line ``[maxtp pack 12s] counts | where``."""
        if not (self.status_line and self.stream is not None):
            return
        if self._tty:
            self.stream.write(f"\r\x1b[K{text}")
        else:
            counts = text.split("]", 1)[1]
            if counts != self._last_counts:
                self.stream.write(f"{text}\n")
            self._last_counts = counts
        self.stream.flush()

    def close(self) -> None:
        """End the status line on a terminal."""
        if self.status_line and self._tty and self.stream is not None:
            self.stream.write("\n")
