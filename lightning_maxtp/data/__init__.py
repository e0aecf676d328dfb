"""Data paths for when the CPUs cannot feed the device: uint8 batches, GPU decode, pre-encoding.

Three changes to the user's pipeline that the diagnosis recommends with numbers and the tuning
loop never makes by itself (they change what the dataset returns):

- uint8 to the device: ``ToUint8`` ends the CPU transforms; ``DeviceTransform`` converts,
  normalizes (and flips) on the device.
- GPU decode: ``EncodedImages`` returns file bytes, ``collate_encoded`` packs them and
  ``DeviceTransform(decode=True, crop=...)`` decodes and crops on the device.
- pre-encode once: ``pre_encode`` writes decoded, resized samples with LitData;
  ``open_pre_encoded`` reads them back with the random transforms applied after reading.

``ops`` holds the tensor operations; ``hooks`` the batch-hook steps shared with the math knobs.
Names are imported lazily: ``DeviceTransform`` needs lightning, ``pre_encode`` needs litdata.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "DeviceTransform": "lightning_maxtp.data.device",
    "EncodedImages": "lightning_maxtp.data.transforms",
    "PreEncodeResult": "lightning_maxtp.data.pre_encoded",
    "ToUint8": "lightning_maxtp.data.transforms",
    "collate_encoded": "lightning_maxtp.data.transforms",
    "open_pre_encoded": "lightning_maxtp.data.pre_encoded",
    "pre_encode": "lightning_maxtp.data.pre_encoded",
}

__all__ = [
    "DeviceTransform",
    "EncodedImages",
    "PreEncodeResult",
    "ToUint8",
    "collate_encoded",
    "open_pre_encoded",
    "pre_encode",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
