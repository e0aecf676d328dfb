"""Griffe extension for the API reference: the callback's real defaults and arguments' text.

``MaxThroughputCallback``'s keyword defaults are read from ``TuningConfig`` in the code
(``warmup_steps: int = DEFAULTS.warmup_steps``; the monitoring ones from ``MONITOR``) and its
docstring points each loop setting to its field (``TuningConfig.warmup_steps`` (same
default)), so that the values and their
documentation live once. Read statically, the reference would show the expression and the
pointer; this extension puts in the value (``5``) and the field's own docstring, taken from the
code when the site is built. mkdocs.yml loads it (``extensions:`` of the python handler).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

CALLBACK = "callbacks.max_throughput.MaxThroughputCallback"
CONFIG = "tuning.config.TuningConfig"
POINTER = re.compile(r"``TuningConfig\.(\w+)`` \(same default\)\.")


class RealDefaults(griffe.Extension):
    """Replace ``DEFAULTS.<field>`` / ``MONITOR.<field>`` defaults and "same default" pointers."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite the callback's ``__init__`` defaults and docstring once the package is loaded."""
        if pkg.name != "lightning_maxtp":
            return
        from lightning_maxtp.callbacks.monitor_defaults import MONITOR
        from lightning_maxtp.tuning.config import DEFAULTS

        callback = pkg[CALLBACK]
        for param in callback["__init__"].parameters:
            text = str(param.default) if param.default is not None else ""
            for prefix, source in (("DEFAULTS.", DEFAULTS), ("MONITOR.", MONITOR)):
                if text.startswith(prefix):
                    param.default = repr(getattr(source, text.removeprefix(prefix)))
        docstring = callback.docstring
        if docstring is None:
            return
        fields = pkg[CONFIG].members

        def field_text(match: re.Match[str]) -> str:
            field = fields[match.group(1)].docstring
            # One line: a Google "Args:" entry continues only on lines indented deeper.
            return " ".join(field.value.split()) if field is not None else match.group(0)

        docstring.value = POINTER.sub(field_text, docstring.value)
        # The parsed sections are cached on first use: drop a copy parsed before the rewrite.
        docstring.__dict__.pop("parsed", None)
