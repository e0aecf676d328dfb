"""Tuned settings that outlive a fit: in the callback's checkpoint state and across ``fit`` calls.

A resumed run (``trainer.fit(..., ckpt_path=...)``) or a second ``fit`` with the same callback
should not pay for tuning again when nothing it was tuned for changed. The state records the
settings in force (the loader's, and the math knobs kept) and what they were tuned on: the
machine (usable CPUs, GPU names, world size) and the loader (dataset type and length, batch
size). A later fit applies them at once when both match (math knobs only where its ``allow``
permits them), and re-tunes, saying which differs, when one does not. Pure: the Tuner applies
what ``carried_settings`` returns.
"""

from __future__ import annotations

from typing import Any

from lightning_maxtp.knobs.registry import WORKERS

__all__ = [
    "STATE_VERSION",
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
    return {
        "dataset": type(dataset).__name__,
        "length": length,
        "batch_size": getattr(loader, "batch_size", None),
    }


def state(
    settings: dict[str, Any], machine: dict[str, Any], loader: dict[str, Any]
) -> dict[str, Any]:
    """The callback's checkpoint state (plain, JSON-safe data)."""
    return {
        "version": STATE_VERSION,
        "settings": dict(settings),
        "machine": machine,
        "loader": loader,
    }


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
    workers = carried["settings"].get(WORKERS)
    if max_workers is not None and isinstance(workers, int) and workers > max_workers:
        return None, f"tuned settings not reused: num_workers={workers} > max_workers={max_workers}"
    shown = ", ".join(f"{k}={v}" for k, v in carried["settings"].items())
    return dict(carried["settings"]), f"settings tuned earlier on this machine and loader: {shown}"
