"""MkDocs hook: marks in the pages where a table generated from the code goes.

- ``<!-- maxtp:metrics -->``: ``lightning_maxtp.callbacks.metrics.METRICS``, rendered by
  ``metrics_table``.
- ``<!-- maxtp:callback-arguments -->``: every argument of ``MaxThroughputCallback`` with the
  default its signature holds, rendered by ``callback_arguments_table``.
- ``<!-- maxtp:knobs -->``: every knob of ``lightning_maxtp.knobs.registry.KNOBS`` from its
  class's attributes, rendered by ``knobs_table``.

The documentation never holds a copy of these tables, so none can drift from the code.

The README is read raw on GitHub, where no hook runs, so its short knob table
(``readme_knobs_table``) is committed text in a generated region
(``<!-- maxtp:knobs-readme -->`` ... ``<!-- /maxtp:knobs-readme -->``) that this file, run as
a script, rewrites in place::

    python docs/hooks.py           # rewrite the README's region if it is stale
    python docs/hooks.py --check   # exit 1 if it is stale, write nothing (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_maxtp.knobs.base import Knob
    from lightning_maxtp.knobs.setting import SettingKnob

MARK = "<!-- maxtp:metrics -->"
ARGUMENTS_MARK = "<!-- maxtp:callback-arguments -->"
KNOBS_MARK = "<!-- maxtp:knobs -->"
README_REGION = re.compile(
    r"(<!-- maxtp:knobs-readme -->)(.*?)(<!-- /maxtp:knobs-readme -->)", re.S
)
ROOT = Path(__file__).resolve().parents[1]
HOLDERS = {
    # The fit's own settings (``knobs.registry.SETTINGS``), one README row per holder.
    "loader": "the train loader, switched mid-epoch without skipping or repeating a sample",
    "process": "the main process, sized to the cores the workers leave; put back at the end",
}
SETTINGS_MARK = "<!-- maxtp:setting-knobs -->"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace each mark with its table."""
    if MARK in markdown:
        from lightning_maxtp.callbacks.metrics import metrics_table

        markdown = markdown.replace(MARK, metrics_table())
    if ARGUMENTS_MARK in markdown:
        markdown = markdown.replace(ARGUMENTS_MARK, callback_arguments_table())
    if KNOBS_MARK in markdown:
        markdown = markdown.replace(KNOBS_MARK, knobs_table())
    if SETTINGS_MARK in markdown:
        markdown = markdown.replace(SETTINGS_MARK, settings_table())
    return markdown


def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each annotated field of a dataclass, read from its source."""
    (node,) = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls))).body
    assert isinstance(node, ast.ClassDef)
    docs: dict[str, str] = {}
    for field, after in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[field.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _docstring_args(obj: Any) -> dict[str, str]:
    """The ``Args:`` entries of a Google-style docstring (griffe parses it as mkdocstrings does)."""
    import griffe

    parsed = griffe.Docstring(
        inspect.cleandoc(obj.__doc__ or ""),
        parser="google",
        parser_options={"warn_missing_types": False, "warn_unknown_params": False},
    ).parsed
    return {
        p.name: p.description
        for section in parsed
        if section.kind is griffe.DocstringSectionKind.parameters
        for p in section.value
    }


def callback_arguments() -> list[tuple[str, str, str, str]]:
    """``(name, type, default, text)`` of each argument of ``MaxThroughputCallback``.

    The default is the value the signature holds, as ``repr`` writes it. The text of a loop
    setting is its ``TuningConfig`` field's docstring (the callback's own docstring only points
    there); the others' is the callback's ``Args:`` entry.
    """
    from lightning_maxtp.callbacks.max_throughput import MaxThroughputCallback
    from lightning_maxtp.tuning.config import TuningConfig

    fields = field_docstrings(TuningConfig)
    args = _docstring_args(MaxThroughputCallback)
    rows = []
    for name, param in inspect.signature(MaxThroughputCallback).parameters.items():
        text = fields.get(name) if name != "config" else None
        rows.append(
            (
                name,
                str(param.annotation),
                repr(param.default),
                text if text is not None else args.get(name, ""),
            )
        )
    return rows


def _cell(text: str) -> str:
    """One table cell of Markdown: one line, a ``|`` outside code escaped."""
    parts = re.split(r"(`+[^`]*`+)", " ".join(text.split()))
    return "".join(p if p.startswith("`") else p.replace("|", r"\|") for p in parts)


def callback_arguments_table() -> str:
    """The arguments of ``MaxThroughputCallback`` as a Markdown table (``callback_arguments``)."""
    lines = ["| Argument | Type | Default | What it does |", "|---|---|---|---|"]
    for name, annotation, default, text in callback_arguments():
        lines.append(f"| `{name}` | `{annotation}` | `{default}` | {_cell(text)} |")
    return "\n".join(lines)


def _markdown(text: str) -> str:
    """A phrase written for a docstring (``literal``) as Markdown (`literal`)."""
    return text.replace("``", "`")


def knob_allow(knob: type[Knob]) -> str:
    """Which ``allow`` lets ``knob`` be tried, as ``resolve_allow`` decides it."""
    from lightning_maxtp.tuning.allow import resolve_allow

    text = '`"safe"` (the default)' if knob.name in resolve_allow("safe") else '`"all"` or by name'
    if knob.name not in resolve_allow((knob.name,), deterministic=True):
        text += "; off under `deterministic=True`"
    return text


def knob_tried_for(knob: type[Knob]) -> str:
    """The bottleneck kinds ``knob`` is tried for; ``healthy`` only where ``compute`` is not."""
    if knob.before_fit:
        return "before training"
    # A healthy job (no bottleneck found) tries the knobs a compute-bound one does: one word
    # fewer in most rows, and the page says so.
    shown = [k for k in knob.tried_for if k != "healthy" or "compute" not in knob.tried_for]
    kinds = ", ".join(shown) or "-"
    return f"{kinds}, when the diagnosis names it" if knob.named_only else kinds


def knob_trial(knob: type[Knob], *, short: bool = False) -> str:
    """Why ``knob`` may pay and how its trial runs, from its class's attributes.

    ``short`` leaves out what the README has no room for (settling, the watch after a keep).
    """
    parts = [knob.reason]
    if knob.devices is not None:  # torch's device types, as the pages name them: CUDA, CPU
        parts.append(f"{', '.join(sorted(d.upper() for d in knob.devices))} only")
    if knob.before_fit:
        parts.append("chosen before training")
    if knob.named_only and short:  # the full table says so in its "tried for" column
        parts.append("tried when the diagnosis names it")
    if knob.guarded:
        parts.append("under the numerics guard")
    if knob.watched and not short:
        parts.append("watched once kept: a later non-finite loss undoes it")
    if knob.settle_steps and not short:
        longer = ", longer while a step runs far slower," if knob.settles_until_steady else ""
        parts.append(
            f"the {knob.settle_steps} steps after a switch{longer} settle outside the trial's "
            "windows, counted in the tuning cost"
        )
    if knob.min_budget_s:
        parts.append(f"not tried with under {knob.min_budget_s:g} s of tuning budget left")
    return "; ".join(parts)


def knobs_table() -> str:
    """Every registry knob as a Markdown table: ``allow``, what changes, when and how tried."""
    from lightning_maxtp.knobs.registry import KNOBS

    lines = [
        "| knob | `allow` | what changes | tried for | why it may pay, and the trial |",
        "|---|---|---|---|---|",
    ]
    for knob in KNOBS:
        cells = (knob_allow(knob), _markdown(knob.changes), knob_tried_for(knob), knob_trial(knob))
        lines.append(f"| `{knob.name}` | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def setting_rows() -> list[tuple[str, str]]:
    """One README row per holder of the fit's own settings: their names, what holds them."""
    from lightning_maxtp.knobs.registry import SETTINGS

    rows = []
    for holder, held in HOLDERS.items():
        knobs = [k for k in SETTINGS if k.holder == holder]
        devices = {k.devices for k in knobs}
        only = devices.pop() if len(devices) == 1 else None
        text = held
        if only is not None:  # every setting it holds acts on these devices only
            text += f"; {', '.join(sorted(d.upper() for d in only))} only"
        rows.append((", ".join(f"`{k.name}`" for k in knobs), text))
    return rows


def setting_conditions(knob: type[SettingKnob]) -> str:
    """When a setting knob is tried beyond the diagnosis recommending it, in a phrase."""
    parts = []
    if knob.needs_workers:
        parts.append("with workers only")
    if knob.counts_workers:
        parts.append("grows up to `max_workers`")
    if knob.epoch_start_only:
        parts.append("not in the fit's last epoch")
    if knob.devices is not None:
        parts.append(f"{', '.join(sorted(d.upper() for d in knob.devices))} only")
    return "; ".join(parts) or "-"


def settings_table() -> str:
    """The fit's own settings as knobs, a Markdown table rendered from their classes."""
    from lightning_maxtp.knobs.registry import SETTINGS

    held = {"loader": "train loader", "process": "main process"}
    lines = [
        "| knob | held by | what changes | also | why it may pay |",
        "|---|---|---|---|---|",
    ]
    for knob in SETTINGS:
        cells = (held[knob.holder], _markdown(knob.changes), setting_conditions(knob), knob.reason)
        lines.append(f"| `{knob.name}` | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def readme_knobs_table() -> str:
    """The README's short knob table: the fit's own settings, then every registry knob."""
    from lightning_maxtp.knobs.registry import KNOBS

    lines = ["| knob | `allow` | what it does |", "|---|---|---|"]
    lines += [f"| {what} | always | {text} |" for what, text in setting_rows()]
    for knob in KNOBS:
        cells = (knob_allow(knob), knob_trial(knob, short=True))
        lines.append(f"| `{knob.name}` | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def render_readme(text: str) -> str:
    """``text`` (the README) with its knob region rendered again.

    Raises:
        ValueError: When ``text`` has no knob region.
    """
    if not README_REGION.search(text):
        raise ValueError("no <!-- maxtp:knobs-readme --> region in the README")
    # Blank lines inside the markers: the table must be a block of its own in Markdown.
    body = "\n\n" + readme_knobs_table() + "\n\n"
    return README_REGION.sub(lambda m: m.group(1) + body + m.group(3), text)


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the README's knob region, or with ``--check`` exit 1 when it is stale."""
    parser = argparse.ArgumentParser(description="Render the README's knob table.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: here)")
    args = parser.parse_args(argv)
    readme = args.root / "README.md"
    text = readme.read_text()
    try:
        new = render_readme(text)
    except ValueError as err:
        print(f"hooks: {readme}: {err}", file=sys.stderr)
        return 2
    if new == text:
        return 0
    if args.check:
        print("stale: README.md: the knob table; run `python docs/hooks.py`", file=sys.stderr)
        return 1
    readme.write_text(new)
    print("rewrote: README.md: the knob table")
    return 0


if __name__ == "__main__":
    # Run as a script, ``docs/`` is on the path, not the checkout: render this checkout's knobs,
    # not those of whichever copy of the package is installed.
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
