"""Byte units and the one formatter for byte counts (GiB means 2**30, as ``torch`` and NVML do)."""

from __future__ import annotations

from typing import Literal

__all__ = ["GIB", "KIB", "MIB", "format_bytes"]

KIB = 2**10
MIB = 2**20
GIB = 2**30

Unit = Literal["auto", "GiB", "MiB", "KiB"]
_SCALES = {"GiB": GIB, "MiB": MIB, "KiB": KIB}


def format_bytes(
    nbytes: float | None,
    *,
    unit: Unit = "auto",
    digits: int = 1,
    missing: str = "?",
    suffix: bool = True,
) -> str:
    """``nbytes`` as text: ``"1.5 GiB"``, ``"38.1 MiB"``.

    Args:
        nbytes: The byte count; ``None`` when unknown.
        unit: ``"auto"``: the largest of GiB, MiB and KiB that keeps the number at least 1
            (tiny models included); or a fixed unit, for a column of numbers.
        digits: Decimals shown.
        missing: The text for an unknown count.
        suffix: Append the unit (leave it out in a table column that names the unit).
    """
    if nbytes is None:
        return missing
    if unit == "auto":
        unit = next((u for u in ("GiB", "MiB") if nbytes >= _SCALES[u]), "KiB")
    text = f"{nbytes / _SCALES[unit]:,.{digits}f}"
    return f"{text} {unit}" if suffix else text
