"""The bool check every count, share and seconds argument of a public entry point makes first.

``bool`` is a subclass of ``int``: ``isinstance(True, int | float)`` holds and ``True > 0``, so
without this ``MaxThroughputCallback(time_budget_s=True)`` would run with a 1 s budget and
``max_workers=False`` would mean no worker. Such a value is almost always a slip (a flag put
in the wrong place, a YAML ``yes``); the error names the argument, the value and a valid one.
"""

from __future__ import annotations

__all__ = ["COUNT", "SECONDS", "SHARE", "refuse_bool"]

SECONDS = "seconds (a number > 0)"
SHARE = "a share (a number between 0 and 1)"
COUNT = "a whole number"


def refuse_bool(name: str, value: object, expected: str, example: object) -> None:
    """Raise when ``value`` is ``True`` or ``False`` where a number is expected.

    Args:
        name: The argument, as the caller spells it.
        value: What was passed.
        expected: What the argument takes, e.g. ``SECONDS``.
        example: A valid value, shown as ``name=example`` in the message.

    Raises:
        ValueError: ``"time_budget_s=True: expected seconds (a number > 0), e.g.
            time_budget_s=30"``.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: expected {expected}, e.g. {name}={example!r}")
