"""A running job's live status, published for ``maxtp triage --pid``: written and read safely.

From outside, a process waiting for its loader and one computing can look alike (its CPU use
includes thread pools that spin while they wait). A job with a monitor knows which: each closed
window, the monitor writes its step time, data wait, loader settings and bottleneck to
``<dir>/<pid>.json``, where ``<dir>`` is ``$XDG_RUNTIME_DIR/lightning_maxtp`` or
``/tmp/lightning_maxtp-<uid>``.

Written safely: the folder is made owner-only (0700) and used only when it is a real folder of
this user; the file is written owner-only (0600) under a temporary name opened with
``O_EXCL | O_NOFOLLOW`` and moved into place with an atomic ``os.replace``, so a reader never sees
half a file and a planted symlink is never followed. Read safely: a status is trusted only when
it is a regular file (not a symlink) owned by the target process's user, names that pid, and
was written by that process (its start time, so a pid reused after a crash is not fooled).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

__all__ = ["read_status", "remove_status", "status_dir", "status_path", "write_status"]


def status_dir(uid: int | None = None) -> Path:
    """Where statuses of ``uid``'s jobs live (default: this process's user)."""
    uid = os.getuid() if uid is None else uid
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and uid == os.getuid():
        return Path(runtime) / "lightning_maxtp"
    return Path(tempfile.gettempdir()) / f"lightning_maxtp-{uid}"


def status_path(pid: int, uid: int | None = None) -> Path:
    """The status file of process ``pid`` (owned by ``uid``)."""
    return status_dir(uid) / f"{pid}.json"


def _own_dir() -> Path | None:
    """The status folder, made owner-only; ``None`` when it is not safely ours."""
    folder = status_dir()
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700, parents=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return None  # a symlink or someone else's folder: never write through it
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(folder, 0o700)
    return folder


def write_status(data: dict[str, Any]) -> Path | None:
    """Publish ``data`` (with this pid and the time) as this process's status.

    Returns:
        The file written, or ``None`` when the folder is not safely this user's (nothing is
        written then; a status is advisory).
    """
    try:
        folder = _own_dir()
        if folder is None:
            return None
        started = psutil.Process().create_time()
        body = json.dumps({**data, "pid": os.getpid(), "started": started, "updated": time.time()})
        tmp = folder / f".{os.getpid()}.{time.monotonic_ns()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(tmp, flags, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(body)
            final = folder / f"{os.getpid()}.json"
            os.replace(tmp, final)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return final
    except (OSError, psutil.Error):
        return None


def remove_status() -> None:
    """Remove this process's status (its job ended)."""
    with contextlib.suppress(OSError):
        os.unlink(status_path(os.getpid()))


def _candidates(pid: int, uid: int) -> list[Path]:
    """Where process ``pid`` may have written its status, most specific first.

    Its ``XDG_RUNTIME_DIR`` (read from its environment, when this user may), ours when it is our
    user, and the ``/tmp`` folder.
    """
    found = []
    with contextlib.suppress(OSError):
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        runtime = [e[len(b"XDG_RUNTIME_DIR=") :] for e in env if e.startswith(b"XDG_RUNTIME_DIR=")]
        if runtime and runtime[0]:
            found.append(Path(os.fsdecode(runtime[0])) / "lightning_maxtp" / f"{pid}.json")
    found.append(status_path(pid, uid))
    found.append(Path(tempfile.gettempdir()) / f"lightning_maxtp-{uid}" / f"{pid}.json")
    return list(dict.fromkeys(found))


def read_status(pid: int, uid: int) -> tuple[dict[str, Any] | None, str]:
    """Process ``pid``'s status, when it can be trusted, and why (not).

    Args:
        pid: The target process.
        uid: The target process's user (real uid): the file must be that user's.

    Returns:
        ``(status, why)``: the status, or ``None`` with the reason it was not used.
    """
    path = next((c for c in _candidates(pid, uid) if os.path.lexists(c)), None)
    if path is None:
        return None, "the job publishes no live status (no monitor, or it has not run a window)"
    if not stat.S_ISREG(os.lstat(path).st_mode):
        return None, f"{path} is not a regular file: not trusted"
    try:  # no symlink, no blocking on a FIFO swapped in since; checked again once open
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(path, flags), encoding="utf-8") as src:
            info = os.fstat(src.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None, f"{path} is not a regular file: not trusted"
            if info.st_uid != uid:
                return (
                    None,
                    f"{path} belongs to uid {info.st_uid}, not the job's {uid}: not trusted",
                )
            data = json.load(src)
    except (OSError, ValueError) as err:
        return None, f"{path} could not be read ({type(err).__name__})"
    if not isinstance(data, dict) or data.get("pid") != pid:
        return None, f"{path} names another process: not trusted"
    with contextlib.suppress(psutil.Error):
        if abs(float(data.get("started") or 0) - psutil.Process(pid).create_time()) > 1.0:
            return None, f"{path} was left by an earlier process with pid {pid}: not trusted"
    updated = data.get("updated")
    age = f"{time.time() - updated:.0f} s old" if isinstance(updated, int | float) else "undated"
    return data, f"live status published by the job ({age})"
