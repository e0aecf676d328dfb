"""The knobs, one line each, and every set the loop derives from them.

Adding a knob: its module (a ``BaseKnob`` subclass), one line in ``KNOBS`` and its name in
``MathKnob``, a test, and a changelog line. The knob tables of ``docs/knobs.md`` and the README
are rendered from these classes (``docs/hooks.py``), and ``tests/knobs/test_registry.py``
checks the derived sets by their properties, not by their members. Pure: importing it imports
neither torch nor lightning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from lightning_maxtp.knobs.base import Knob
from lightning_maxtp.knobs.batch_size import BatchSize
from lightning_maxtp.knobs.channels_last import ChannelsLast
from lightning_maxtp.knobs.compile import Compile
from lightning_maxtp.knobs.cudnn_benchmark import CudnnBenchmark
from lightning_maxtp.knobs.fused_optimizer import FusedOptimizer
from lightning_maxtp.knobs.gc_freeze import GcFreeze
from lightning_maxtp.knobs.loader_settings import (
    NumWorkers,
    PersistentWorkers,
    PinMemory,
    PrefetchFactor,
)
from lightning_maxtp.knobs.precision import Precision
from lightning_maxtp.knobs.setting import SettingKnob
from lightning_maxtp.knobs.tf32 import Tf32
from lightning_maxtp.knobs.threads import IntraOpThreads
from lightning_maxtp.loader.candidate import LOADER_KNOBS

__all__ = [
    "BEFORE_FIT",
    "DEVICE_LIMITED",
    "GUARDED",
    "KNOBS",
    "LOADER_SETTINGS",
    "MATH_KNOBS",
    "MATH_ORDER",
    "NOT_DETERMINISTIC",
    "PERSISTENT",
    "PREFETCH",
    "SAFE",
    "SETTINGS",
    "WORKERS",
    "MathKnob",
    "knob_class",
    "math_order",
    "setting_class",
]

KNOBS: tuple[type[Knob], ...] = (
    Precision,
    ChannelsLast,
    Tf32,
    CudnnBenchmark,
    Compile,
    FusedOptimizer,
    GcFreeze,
    BatchSize,
)
"""Every knob ``allow`` names (beyond the fit's own settings), in the order ties are tried."""

SETTINGS: tuple[type[SettingKnob], ...] = (
    NumWorkers,
    PrefetchFactor,
    PinMemory,
    PersistentWorkers,
    IntraOpThreads,
)
"""The fit's own settings as knobs: the train loader's and the main threads', tried when the
diagnosis recommends a value (``allow="safe"`` and ``"all"`` both permit them)."""

LOADER_SETTINGS: tuple[str, ...] = tuple(k.name for k in SETTINGS if k.holder == "loader")
"""The settings a switch of the train loader changes (a new loader iterator)."""
assert LOADER_SETTINGS == LOADER_KNOBS, "the loader's knobs must be its settings, in order"

(WORKERS,) = (k.name for k in SETTINGS if k.counts_workers)
"""The setting that counts the loader's workers."""
(PREFETCH,) = (k.name for k in SETTINGS if k.queue_depth)
"""The setting that says how many batches each worker keeps ready."""
(PERSISTENT,) = (k.name for k in SETTINGS if k.epoch_start_only)
"""The setting that keeps the workers alive between epochs."""

(BEFORE_FIT,) = (k.name for k in KNOBS if k.before_fit)
"""The knob chosen before training (the batch size): ``allow_batch_size_change=True`` allows
it, and the loop never tries it per bottleneck."""

# Spelled out, not derived from KNOBS: type checkers and LightningCLI read a Literal's names
# statically. The assert below and tests/knobs/test_registry.py keep the two in agreement.
MathKnob = Literal[
    "precision",
    "channels_last",
    "tf32",
    "cudnn_benchmark",
    "compile",
    "fused_optimizer",
    "gc",
    "batch_size",
]
"""A knob ``allow`` may name: ``KNOBS``' names spelled out, for type checkers and LightningCLI."""

MATH_KNOBS: tuple[str, ...] = tuple(k.name for k in KNOBS)
assert get_args(MathKnob) == MATH_KNOBS, "MathKnob must list KNOBS' names, in order"

SAFE: tuple[str, ...] = tuple(k.name for k in KNOBS if k.preset == "safe")
"""The knobs ``allow="safe"`` permits beyond the loader's (same math)."""

GUARDED = frozenset(k.name for k in KNOBS if k.guarded)
"""Trials that run under the numerics guard: their kernels round differently."""

NOT_DETERMINISTIC = frozenset(k.name for k in KNOBS if not k.deterministic)
"""Knobs whose effect differs run to run; a deterministic Trainer never tries them."""

DEVICE_LIMITED: dict[str, frozenset[str]] = {
    k.name: k.devices for k in KNOBS if k.devices is not None
}
"""The knobs with an effect on some device types only, and those types."""


def math_order(knobs: Sequence[type[Knob]]) -> dict[str, tuple[str, ...]]:
    """Per bottleneck kind the ``knobs`` declare in ``tried_for``, their names in trial order.

    Lower rank first; equal ranks in the order of ``knobs``.
    """
    kinds = sorted({kind for k in knobs for kind in k.tried_for})
    ranked = {
        kind: sorted(
            (k.tried_for[kind], i, k.name) for i, k in enumerate(knobs) if kind in k.tried_for
        )
        for kind in kinds
    }
    return {kind: tuple(name for _, _, name in ranked[kind]) for kind in kinds}


MATH_ORDER: dict[str, tuple[str, ...]] = math_order(KNOBS)
"""Per bottleneck kind, the knobs that can pay, in the order they are tried (data-bound kinds:
none; the device waits on the loader, so faster math cannot show)."""


def setting_class(name: str) -> type[SettingKnob] | None:
    """The setting knob called ``name`` (``None``: ``name`` is no setting's)."""
    for knob in SETTINGS:
        if knob.name == name:
            return knob
    return None


def knob_class(name: str) -> type[Knob]:
    """The knob called ``name``.

    Raises:
        ValueError: For a name that is not a knob's.
    """
    for knob in KNOBS:
        if knob.name == name:
            return knob
    raise ValueError(f"unknown knob {name!r}; the knobs are {MATH_KNOBS}")
