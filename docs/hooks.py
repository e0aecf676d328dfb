"""MkDocs hook: pages say ``<!-- maxtp:metrics -->`` where the one metrics table goes.

The table is ``lightning_maxtp.callbacks.metrics.METRICS``, rendered by ``metrics_table``: the
documentation never holds a copy of it.
"""

from __future__ import annotations

from typing import Any

MARK = "<!-- maxtp:metrics -->"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace the mark with the metrics table."""
    if MARK not in markdown:
        return markdown
    from lightning_maxtp.callbacks.metrics import metrics_table

    return markdown.replace(MARK, metrics_table())
