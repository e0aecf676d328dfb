"""Which Lightning releases the private accesses in ``_compat`` are checked on, and the warning.

Checked by release range, not by exact version: a newer 2.6 patch release gets no warning, any
release outside the range one warning per process and version.
"""

from __future__ import annotations

from functools import cache

__all__ = ["CHECKED_LIGHTNING", "lightning_checked", "warn_if_lightning_unchecked"]

CHECKED_LIGHTNING = ((2, 6, 6), (2, 7))
"""The Lightning releases ``_compat`` is checked on: at least the first, below the second."""


def lightning_checked(version: str) -> bool:
    """Whether Lightning ``version`` is in ``CHECKED_LIGHTNING`` (by release: ``2.6.7.dev1`` is)."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release
    except InvalidVersion:
        return False
    low, high = CHECKED_LIGHTNING
    return low <= release < high


def warn_if_lightning_unchecked() -> None:
    """Warn once per process when the installed Lightning is outside ``CHECKED_LIGHTNING``.

    Called where a private Lightning helper is first needed: the loader hook, the batch-size
    search and ``strategy="auto_maxtp"``.
    """
    import lightning

    if not lightning_checked(lightning.__version__):
        _warn_unchecked(lightning.__version__)


@cache
def _warn_unchecked(version: str) -> None:
    from lightning_maxtp._log import rank_zero_warn

    low, high = (".".join(map(str, v)) for v in CHECKED_LIGHTNING)
    rank_zero_warn(
        f"lightning_maxtp rebuilds DataLoaders, resizes batches and swaps strategies with private "
        f"Lightning helpers checked on Lightning >={low},<{high}; found {version}. If one of "
        f"these fails, install lightning>={low},<{high}."
    )
