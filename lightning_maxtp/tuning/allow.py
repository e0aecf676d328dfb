"""The knobs beyond the loader's the closed loop may change: ``"safe"``, ``"all"``, or names.

Pure (no torch). The names, the presets and the order per bottleneck come from
``knobs.registry`` (the knobs page of the docs has their table). ``"safe"`` keeps the math:
the loader's knobs and the main process's threads, plus the registry's knobs whose ``preset``
is ``"safe"`` (``SAFE``). ``"all"`` adds the others, which change the numbers a little or the
optimization: each is a trial undone when it does not pay, the guarded ones (``GUARDED``)
under a numerics guard and a rollback. A deterministic Trainer never tries the guarded knobs
nor those that pick their kernels by timing (``NOT_DETERMINISTIC``), even when named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from lightning_maxtp.knobs.registry import (
    BEFORE_FIT,
    GUARDED,
    MATH_KNOBS,
    MATH_ORDER,
    NOT_DETERMINISTIC,
    SAFE,
    MathKnob,
)

__all__ = ["Allow", "math_knobs_for", "resolve_allow"]

Allow = Literal["safe", "all"] | tuple[MathKnob, ...]
"""``MaxThroughputCallback(allow=...)``: a preset, or the knobs by name."""


def resolve_allow(
    allow: object, *, batch_size: bool = False, deterministic: bool = False
) -> tuple[str, ...]:
    """The knob names ``allow`` permits, in ``MATH_KNOBS`` order.

    Args:
        allow: ``"safe"``, ``"all"``, or a tuple (or list) of names from ``MATH_KNOBS``.
        batch_size: ``allow_batch_size_change=True``: the knob chosen before the fit
            (``BEFORE_FIT``, the batch size) is added.
        deterministic: The Trainer is deterministic: ``cudnn.benchmark`` and the guarded knobs
            stay off even when named (they are kept or not by timing, so two runs could
            differ; ``cudnn.benchmark`` also picks its kernels by timing).

    Raises:
        ValueError: ``allow`` is neither preset nor a sequence of known names.
    """
    if isinstance(allow, str):
        if allow not in ("safe", "all"):
            raise ValueError(
                f"`allow` must be 'safe', 'all' or a tuple of knob names from {MATH_KNOBS}, got "
                f"{allow!r}; e.g. allow='all' or allow=('precision', 'channels_last')"
            )
        names = set(SAFE if allow == "safe" else MATH_KNOBS)
    elif isinstance(allow, Sequence):
        unknown = [n for n in allow if n not in MATH_KNOBS]
        if unknown:
            raise ValueError(
                f"`allow` names unknown knob(s) {unknown}; the valid names are {MATH_KNOBS} "
                "(or the presets 'safe' and 'all')"
            )
        names = set(allow)
    else:
        raise ValueError(
            f"`allow` must be 'safe', 'all' or a tuple of knob names from {MATH_KNOBS}, got "
            f"{allow!r}"
        )
    if batch_size:
        names.add(BEFORE_FIT)
    if deterministic:  # knobs kept or not by timing: two runs could differ
        names -= GUARDED | NOT_DETERMINISTIC
    return tuple(n for n in MATH_KNOBS if n in names)


def math_knobs_for(kind: str, allowed: Sequence[str]) -> tuple[str, ...]:
    """The allowed knobs a bottleneck of ``kind`` points to, in the order to try them."""
    return tuple(k for k in MATH_ORDER.get(kind, ()) if k in allowed)
