"""How the library speaks: one prefix, one logger, rank-zero console lines.

Every line the library prints or logs starts with ``maxtp:``. Console lines (the callback's
plan, trials and result; a strategy's plan) go to the ``lightning_maxtp`` logger on global rank
zero only, so ``logging.getLogger("lightning_maxtp").setLevel(logging.WARNING)`` silences them
all and a handler of the user's own can redirect them. Modules log through
``logging.getLogger(__name__)``, children of that logger. As Lightning does for its own
logger, a stream handler is added at the first console line only when neither the root logger
nor ``lightning_maxtp`` has one (a script that never configured logging still sees the lines;
one that did keeps its own format, and records still propagate to the root, where pytest's
``caplog`` reads them). Lightning is imported only when a line is sent, never by importing this
module.
"""

from __future__ import annotations

import logging

__all__ = ["LOGGER", "PREFIX", "console_logger", "prefixed", "rank_zero_info", "rank_zero_warn"]

PREFIX = "maxtp:"
LOGGER = "lightning_maxtp"


def prefixed(text: str) -> str:
    """``text`` with the library's prefix (added once)."""
    return text if text.startswith(PREFIX) else f"{PREFIX} {text}"


def console_logger() -> logging.Logger:
    """The ``lightning_maxtp`` logger, at INFO and with a handler unless the user set them."""
    logger = logging.getLogger(LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().hasHandlers():
        logger.addHandler(logging.StreamHandler())
    return logger


def _rank_zero() -> bool:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return int(getattr(rank_zero_only, "rank", 0)) == 0


def rank_zero_info(text: str) -> None:
    """Log ``maxtp: text`` at INFO on the ``lightning_maxtp`` logger, on global rank zero only."""
    if _rank_zero():
        console_logger().info(prefixed(text))


def rank_zero_warn(text: str) -> None:
    """Warn ``maxtp: text`` on global rank zero only (Python shows a warning once per place)."""
    from lightning.pytorch.utilities import rank_zero_warn as warn

    warn(prefixed(text))
