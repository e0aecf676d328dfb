"""MkDocs hook: marks in the pages where a table generated from the code goes.

- ``<!-- maxtp:metrics -->``: ``lightning_maxtp.callbacks.metrics.METRICS``, rendered by
  ``metrics_table``.
- ``<!-- maxtp:callback-arguments -->``: every argument of ``MaxThroughputCallback`` with the
  default its signature holds, rendered by ``callback_arguments_table``.

The documentation never holds a copy of either table, so neither can drift from the code.
"""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

MARK = "<!-- maxtp:metrics -->"
ARGUMENTS_MARK = "<!-- maxtp:callback-arguments -->"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace each mark with its table."""
    if MARK in markdown:
        from lightning_maxtp.callbacks.metrics import metrics_table

        markdown = markdown.replace(MARK, metrics_table())
    if ARGUMENTS_MARK in markdown:
        markdown = markdown.replace(ARGUMENTS_MARK, callback_arguments_table())
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
