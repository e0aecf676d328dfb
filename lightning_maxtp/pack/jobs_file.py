"""Jobs files for ``maxtp pack``: one shell command per line, JSON, or YAML (if PyYAML is there).

Text files: one job per line; blank lines and lines starting with ``#`` are skipped. JSON and
YAML files hold a list of jobs (or ``{"jobs": [...]}``); a job is a command string or an object
with the fields of ``JobSpec``. YAML needs PyYAML, which lightning_maxtp does not depend on.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from lightning_maxtp.pack.spec import JOB_FIELDS, JobSpec

__all__ = ["load_jobs", "parse_jobs"]


def load_jobs(path: str | Path) -> tuple[JobSpec, ...]:
    """Read a jobs file (format chosen by extension: ``.json``, ``.yaml``/``.yml``, else text).

    Raises:
        ValueError: If the file is missing, empty, malformed, or a job has an unknown field or a
            bad value; the message names the file, the job (line or position) and the fix.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"jobs file {str(path)!r} cannot be read: {err.strerror or err}") from err
    suffix = path.suffix.lower()
    kind = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(suffix)
    if kind is None:
        kind = "json" if text.lstrip()[:1] in ("[", "{") else "text"
    return parse_jobs(text, kind=kind, source=str(path))


def parse_jobs(text: str, *, kind: str = "text", source: str = "jobs") -> tuple[JobSpec, ...]:
    """Parse jobs from a string; ``kind`` is ``"text"``, ``"json"`` or ``"yaml"``.

    Raises:
        ValueError: As ``load_jobs``.
    """
    if kind == "text":
        jobs = tuple(
            JobSpec(line.strip(), name=f"job{n}", where=f"{source} line {lineno}")
            for n, (lineno, line) in enumerate(_command_lines(text), start=1)
        )
    elif kind in ("json", "yaml"):
        jobs = _structured(_load_structured(text, kind, source), source)
    else:
        raise ValueError(f"`kind` must be one of ('text', 'json', 'yaml'), got {kind!r}")
    if not jobs:
        raise ValueError(
            f"{source}: no jobs found (the file is empty or only has comments); "
            "write one command per line, or a JSON list of jobs"
        )
    names = [job.name for job in jobs]
    dupes = sorted({n for n in names if n is not None and names.count(n) > 1})
    if dupes:
        raise ValueError(
            f"{source}: job names must be unique (they name the log files), "
            f"got {dupes[0]!r} more than once; rename one"
        )
    return jobs


def _command_lines(text: str) -> list[tuple[int, str]]:
    return [
        (lineno, line)
        for lineno, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _load_structured(text: str, kind: str, source: str) -> Any:
    if not text.strip():
        return []
    if kind == "yaml":
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise ValueError(
                f"{source}: reading YAML needs PyYAML, which is not installed; "
                "`pip install pyyaml`, or write the jobs as JSON"
            ) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"{source}: not valid YAML: {err}") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{source}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}"
        ) from err


def _structured(data: Any, source: str) -> tuple[JobSpec, ...]:
    if isinstance(data, dict) and set(data) == {"jobs"}:
        data = data["jobs"]
    if data is None:
        data = []
    if not isinstance(data, list):
        raise ValueError(
            f'{source}: expected a list of jobs (or {{"jobs": [...]}}), got a {type(data).__name__}'
        )
    jobs = []
    for n, item in enumerate(data, start=1):
        where = f"{source} job {n}"
        if isinstance(item, str):
            jobs.append(JobSpec(item, name=f"job{n}", where=where))
            continue
        if not isinstance(item, dict):
            raise ValueError(
                f"{where}: a job must be a command string or an object with a `command`, "
                f"got {item!r}"
            )
        unknown = sorted(set(item) - set(JOB_FIELDS))
        if unknown:
            field = unknown[0]
            close = difflib.get_close_matches(field, JOB_FIELDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"{where}: unknown field {field!r}; {hint}known fields: {', '.join(JOB_FIELDS)}"
            )
        if "command" not in item:
            raise ValueError(f"{where}: missing field 'command'; add the command line to run")
        fields = {**item, "name": item.get("name") or f"job{n}"}
        if not isinstance(fields["name"], str):
            raise ValueError(f"{where}: `name` must be a string, got {fields['name']!r}")
        jobs.append(JobSpec(**fields, where=f"{where} ({fields['name']})"))
    return tuple(jobs)
