"""How the library speaks: one prefix, and rank-zero messages through Lightning's console logger.

Every line the library prints or logs starts with ``maxtp:``. Inside a Lightning run, messages
go through Lightning's rank-zero utilities, so they appear once (on global rank zero) and where
Lightning's own messages appear; outside one (the CLI, ``maxtp pack``, inference workers) modules
log through ``logging.getLogger(__name__)`` with the same prefix. Lightning is imported only when
a message is sent, never by importing this module.
"""

from __future__ import annotations

__all__ = ["PREFIX", "prefixed", "rank_zero_info", "rank_zero_warn"]

PREFIX = "maxtp:"


def prefixed(text: str) -> str:
    """``text`` with the library's prefix (added once)."""
    return text if text.startswith(PREFIX) else f"{PREFIX} {text}"


def rank_zero_info(text: str) -> None:
    """Log ``maxtp: text`` at INFO level, on global rank zero only."""
    from lightning.pytorch.utilities import rank_zero_info as info

    info(prefixed(text))


def rank_zero_warn(text: str) -> None:
    """Warn ``maxtp: text`` on global rank zero only (Python shows a warning once per place)."""
    from lightning.pytorch.utilities import rank_zero_warn as warn

    warn(prefixed(text))
