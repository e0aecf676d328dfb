"""Small JPEG data sets on disk for the data-path tests: (path, label) pairs of photo-like files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def write_jpegs(
    root: Path, count: int = 12, size: tuple[int, int] = (40, 48), quality: int = 90
) -> list[tuple[Path, int]]:
    """``count`` JPEG files of ``size`` (width, height) under ``root``; label ``i`` for file ``i``.

    Smooth gradients plus noise, so that decoders and resizers have detail to disagree on.
    """
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    pairs = []
    for i in range(count):
        base = np.stack([xx * (3 + i), yy * 5, (xx + yy) * 2], axis=-1) % 256
        noise = rng.normal(0, 12, size=base.shape)
        pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
        path = root / f"{i:04d}.jpg"
        Image.fromarray(pixels).save(path, format="JPEG", quality=quality)
        pairs.append((path, i))
    return pairs


def decoded(path: Path) -> np.ndarray:
    """The file's RGB pixels as PIL decodes them, HWC uint8."""
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))
