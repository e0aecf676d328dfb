"""Tuned settings that outlive a fit: in the callback's checkpoint state and across ``fit`` calls.

A resumed run (``trainer.fit(..., ckpt_path=...)``) or a second ``fit`` with the same callback
should not pay for tuning again when nothing it was tuned for changed. The state records the
settings in force (the loader's, and the math knobs kept) and what they were tuned on: the
machine (usable CPUs, GPU names, world size) and the loader (dataset type and length, batch
size). A later fit applies them at once when both match (math knobs only where its ``allow``
permits them), and re-tunes, saying which differs, when one does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_maxtp.knobs.base import Offer
from lightning_maxtp.loader.candidate import LOADER_KNOBS

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_maxtp.callbacks.tuner import Tuner

__all__ = [
    "STATE_VERSION",
    "adopt_carried",
    "carried_settings",
    "loader_key",
    "machine_key",
    "state",
]

STATE_VERSION = 1


def machine_key(resources: Any, world_size: int) -> dict[str, Any]:
    """What the settings were tuned on: usable CPUs, GPU names, ranks."""
    if resources is None:
        return {"cpus": None, "gpus": [], "world_size": world_size}
    gpus = [g.name for g in resources.gpus]
    return {"cpus": resources.cpu.effective, "gpus": gpus, "world_size": world_size}


def loader_key(loader: Any) -> dict[str, Any]:
    """What the settings were tuned for: the dataset's type and length, the batch size."""
    dataset = getattr(loader, "dataset", None)
    try:
        length: int | None = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        length = None
    return {"dataset": type(dataset).__name__, "length": length,
            "batch_size": getattr(loader, "batch_size", None)}  # fmt: skip


def state(
    settings: dict[str, Any], machine: dict[str, Any], loader: dict[str, Any]
) -> dict[str, Any]:
    """The callback's checkpoint state (plain, JSON-safe data)."""
    return {"version": STATE_VERSION, "settings": dict(settings), "machine": machine,
            "loader": loader}  # fmt: skip


def carried_settings(
    carried: dict[str, Any] | None,
    machine: dict[str, Any],
    loader: dict[str, Any],
    max_workers: int | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """The carried settings to apply now, or ``None`` and why they are not.

    Returns:
        ``(settings, why)``: settings when the state matches this machine and loader (the reason
        says where they come from), else ``None`` with what differs (``""``: nothing carried).
    """
    if not carried or not carried.get("settings"):
        return None, ""
    if carried.get("version") != STATE_VERSION:
        return None, f"tuned settings of state version {carried.get('version')!r} not used"
    for what, now in (("machine", machine), ("loader", loader)):
        before = carried.get(what) or {}
        changed = [f"{k} {before.get(k)!r} -> {v!r}" for k, v in now.items() if before.get(k) != v]
        if changed:
            return None, f"tuned settings not reused: the {what} differs ({', '.join(changed)})"
    workers = carried["settings"].get("num_workers")
    if max_workers is not None and isinstance(workers, int) and workers > max_workers:
        return None, f"tuned settings not reused: num_workers={workers} > max_workers={max_workers}"
    shown = ", ".join(f"{k}={v}" for k, v in carried["settings"].items())
    return dict(carried["settings"]), f"settings tuned earlier on this machine and loader: {shown}"


def adopt_carried(tuner: Tuner, trainer: pl.Trainer) -> None:
    """Apply the tuner's carried settings when they match (rank zero decides under DDP)."""
    loader = tuner.loader
    if loader is None or tuner.loop.finished:
        return
    decision = None
    if trainer.is_global_zero:
        machine = machine_key(tuner.resources, tuner.world_size)
        decision = carried_settings(tuner.carried, machine, loader_key(tuner.source_loader),
                                    tuner.config.max_workers)  # fmt: skip
    if trainer.world_size > 1:  # ranks may see different CPUs: one decision for all
        decision = trainer.strategy.broadcast(decision, src=0)
    settings, why = decision if decision is not None else (None, "")
    if settings is None:
        if why:
            tuner.note(why)
        return
    # Math knobs come back only where this fit allows them and could try them (its Trainer's
    # precision or strategy may differ from the fit that kept them).
    math = tuner.math
    settings = {
        k: v
        for k, v in settings.items()
        if k in LOADER_KNOBS or (k in math.allowed and isinstance(math.offer(k), Offer))
    }
    now = tuner.knobs.current(settings)
    changed = {k: v for k, v in settings.items() if now.get(k) != v}
    if changed:
        tuner.knobs.request(**changed)
    tuner.stop(why, converged=True)
