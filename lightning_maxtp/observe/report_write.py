"""Writing the report files atomically, and re-rendering a report folder from its ``report.json``.

A reader (a dashboard, a second ``maxtp report``, a sync to storage) never sees half a file:
each file is written under a temporary name in the same folder and moved into place with
``os.replace``. ``report.md`` and ``timeline.png`` are rendered from the data ``report.json``
holds, read back through JSON, so ``maxtp report DIR`` gives the files the fit wrote. The plot
is optional (matplotlib is the ``plot`` extra, and a figure can fail on odd data): without it
the other files are written with a note saying why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_maxtp.observe.report_md import PNG_MISSING, render_markdown

__all__ = ["Rendered", "load_report", "rerender", "write_atomic", "write_report"]

_log = logging.getLogger(__name__)

_NEEDED = ("windows", "bottleneck", "samples_per_s")
"""Keys every ``report.json`` the library wrote has (what tells one from another JSON file)."""


@dataclass(frozen=True)
class Rendered:
    """What a write or a re-render produced."""

    written: dict[str, Path] = field(default_factory=dict)
    """The files written, by name."""
    note: str | None = None
    """Why ``timeline.png`` was not written (``None``: it was)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {"written": {k: str(v) for k, v in self.written.items()}, "note": self.note}


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then move it onto ``path``.

    The temporary name is unique (pid and random) and created by ``write`` itself, so the file
    gets the permissions any file the process creates gets.

    Raises:
        Whatever ``write`` or the move raise; the temporary file is removed then.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def _write_text(path: Path, text: str) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "x", encoding="utf-8") as out:
            out.write(text)

    write_atomic(path, write)


def _plot(data: Mapping[str, Any], png: Path) -> str | None:
    """Draw ``timeline.png``; on failure the reason, as a note, and no file (old or half)."""
    from lightning_maxtp.observe import timeline  # looked up now: tests replace it

    try:
        write_atomic(png, lambda tmp: timeline.plot_timeline(data, tmp))
        return None
    except ImportError:
        return f"{PNG_MISSING}: install the `plot` extra (matplotlib)"
    except Exception as err:  # the plot is optional, the report is not
        _log.debug("timeline.png failed", exc_info=True)
        return f"{PNG_MISSING}: {type(err).__name__}: {err}"


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as ``report.json`` will read back (tuples as lists, keys as strings)."""
    plain: dict[str, Any] = json.loads(json.dumps(data, default=str, allow_nan=False))
    return plain


def write_report(data: Mapping[str, Any], folder: str | Path) -> Rendered:
    """Write ``report.json``, ``report.md`` and (with matplotlib) ``timeline.png`` for ``data``.

    Args:
        data: ``ThroughputReport.to_dict()`` (strict JSON: no NaN).
        folder: Created when missing.

    Returns:
        The files written, and why the plot was not, when it was not (also a note in both
        ``report.json`` and ``report.md``).
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    plain = _plain(data)
    png = out / "timeline.png"
    note = _plot(plain, png)
    written: dict[str, Path] = {} if note else {"timeline.png": png}
    if note is not None:
        plain["notes"] = [*(plain.get("notes") or []), note]
        with contextlib.suppress(OSError):  # an earlier run's plot would pass for this one's
            png.unlink(missing_ok=True)
    _write_text(out / "report.json", json.dumps(plain, indent=2, allow_nan=False))
    _write_text(out / "report.md", render_markdown(plain))
    written["report.json"], written["report.md"] = out / "report.json", out / "report.md"
    return Rendered(written, note)


def load_report(folder: str | Path) -> dict[str, Any]:
    """``folder/report.json``, checked to be a report the library wrote.

    Raises:
        ValueError: The folder or the file is missing, unreadable, not JSON or not a report;
            the message names the folder and what to pass instead.
    """
    where = Path(folder)
    fix = "pass the report_dir a fit wrote (the folder that holds report.json)"
    if not where.exists():
        raise ValueError(f"{str(where)!r}: no such folder; {fix}")
    if not where.is_dir():
        raise ValueError(f"{str(where)!r}: a file, not a folder; {fix}")
    path = where / "report.json"
    if not path.is_file():
        raise ValueError(f"{str(where)!r}: no report.json in it; {fix}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{str(where)!r}: report.json cannot be read ({err}); {fix}") from None
    except ValueError as err:  # json.JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{str(where)!r}: report.json is not JSON ({err}); {fix}") from None
    missing = [k for k in _NEEDED if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(
            f"{str(where)!r}: report.json is not a maxtp report (no {', '.join(missing)}); {fix}"
        )
    report: dict[str, Any] = data
    return report


def rerender(folder: str | Path) -> Rendered:
    """Render ``report.md`` and ``timeline.png`` again from ``folder/report.json``.

    ``report.json`` is left as it is. When the plot fails, a ``timeline.png`` already there is
    kept (it was drawn from the same data) and ``report.md`` still links it.

    Raises:
        ValueError: ``folder`` holds no report (``load_report``).
        OSError: The files cannot be written there.
    """
    out = Path(folder)
    data = load_report(out)
    # A note that the fit's plot failed is about that attempt, not this one.
    data["notes"] = [n for n in data.get("notes") or [] if not str(n).startswith(PNG_MISSING)]
    png = out / "timeline.png"
    note = _plot(data, png)
    written: dict[str, Path] = {} if note else {"timeline.png": png}
    if note is not None and not png.exists():
        data["notes"] = [*data["notes"], note]
    _write_text(out / "report.md", render_markdown(data))
    written["report.md"] = out / "report.md"
    return Rendered(written, note)
