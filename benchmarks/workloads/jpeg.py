"""JPEG image classification: a generated on-disk data set, a PIL + torchvision Dataset, a model.

This is the workload where the input pipeline matters: every sample is a file read, a JPEG decode
and a RandomResizedCrop, as in ImageNet-style training. The data set is generated locally (no
download), deterministically from a seed, with smooth patterns plus noise so that JPEG files and
their decode cost resemble photographs more than flat colours would.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms

from benchmarks.checks import DATA_DIR_ENV
from benchmarks.workloads.common import ClassifierModule, LoaderSettings, make_loader
from lightning_maxtp.data import ToUint8

__all__ = [
    "MANIFEST_NAME",
    "ImageClassifier",
    "JpegFolderDataset",
    "JpegSpec",
    "LoaderSettings",
    "default_data_dir",
    "generate_jpeg_dataset",
    "make_loader",
]

log = logging.getLogger(__name__)

MANIFEST_NAME = "maxtp-jpeg-manifest.json"
"""Written last by ``generate_jpeg_dataset``; a matching one means the files are complete."""
_CLASS_DIR = re.compile(r"class_\d{3,}")
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class JpegSpec:
    """Parameters of a generated JPEG data set (all of them are in the manifest).

    Attributes:
        images: Number of images, spread round-robin over the classes.
        image_size: Side of the square images, in pixels.
        classes: Number of classes (one directory each).
        quality: JPEG quality (1-95).
        seed: Seed; the same spec always yields the same files.
    """

    images: int = 1024
    image_size: int = 160
    classes: int = 10
    quality: int = 90
    seed: int = 0

    def __post_init__(self) -> None:
        if self.images < 1 or self.image_size < 8 or self.classes < 1:
            raise ValueError(f"need images >= 1, image_size >= 8 and classes >= 1: {self}")
        if not 1 <= self.quality <= 95:
            raise ValueError(f"quality must be in 1..95, got {self.quality}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)

    def slug(self) -> str:
        """A directory name that identifies the spec."""
        return (
            f"jpeg-n{self.images}-px{self.image_size}-c{self.classes}-q{self.quality}-s{self.seed}"
        )


def default_data_dir(spec: JpegSpec) -> Path:
    """Where a spec's images go by default.

    ``$MAXTP_DATA_DIR/<slug>``, else ``$XDG_CACHE_HOME/lightning_maxtp/<slug>``.
    """
    base = os.environ.get(DATA_DIR_ENV)
    if base:
        return Path(base) / spec.slug()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "lightning_maxtp" / spec.slug()


def _image(spec: JpegSpec, index: int, grid: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """One ``image_size x image_size x 3`` uint8 image: class-specific waves, blobs and noise."""
    label = index % spec.classes
    rng = np.random.default_rng([spec.seed, index])
    yy, xx = grid
    # The class fixes the wave direction and colour balance; the image varies phase and scale.
    angle = np.pi * label / spec.classes + rng.normal(0.0, 0.1)
    freq = rng.uniform(3.0, 9.0)
    along = np.cos(angle) * xx + np.sin(angle) * yy
    phases = rng.uniform(0.0, 2 * np.pi, size=3)
    tint = 0.5 + 0.5 * np.cos(2 * np.pi * label / spec.classes + np.arange(3) * 2.1)
    waves = np.sin(2 * np.pi * freq * along[..., None] + phases) * (50.0 + 40.0 * tint)
    cx, cy, radius = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8), rng.uniform(0.1, 0.3)
    blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * radius**2))[..., None]
    noise = rng.normal(0.0, 18.0, size=waves.shape)
    pixels = 110.0 + 60.0 * tint + waves + 70.0 * blob * (1.0 - tint) + noise
    image: np.ndarray = np.clip(pixels, 0, 255).astype(np.uint8)
    return image


def _read_manifest(root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((root / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _image_path(root: Path, spec: JpegSpec, index: int) -> Path:
    return root / f"class_{index % spec.classes:03d}" / f"{index:06d}.jpg"


def generate_jpeg_dataset(root: Path | str, spec: JpegSpec, processes: int = 1) -> Path:
    """Write an ImageFolder-style JPEG data set under ``root``, unless it is already there.

    Layout: ``root/class_000/000000.jpg``, ... with image ``i`` in class ``i % classes``. The
    manifest is written last; when it matches ``spec`` and every file exists, nothing is written.
    Otherwise the ``class_*`` directories and the manifest are removed and everything is
    regenerated (nothing else in ``root`` is touched).

    Args:
        root: Target directory (created if needed).
        spec: What to generate.
        processes: Processes that write the images (forked; each writes every n-th one).

    Returns:
        ``root`` as a Path.
    """
    root = Path(root)
    wanted = {"format": 1, **spec.to_dict()}
    if _read_manifest(root) == wanted and all(
        _image_path(root, spec, i).is_file() for i in range(spec.images)
    ):
        log.info("JPEG data set in %s is up to date (%d images)", root, spec.images)
        return root
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST_NAME).unlink(missing_ok=True)
    for child in root.iterdir():
        if child.is_dir() and _CLASS_DIR.fullmatch(child.name):
            shutil.rmtree(child)
    log.info("generating %d JPEG images (%d px) in %s", spec.images, spec.image_size, root)
    for label in range(spec.classes):
        (root / f"class_{label:03d}").mkdir()
    shares = [(root, spec, first, max(1, processes)) for first in range(max(1, processes))]
    if len(shares) == 1:
        _write_images(*shares[0])
    else:
        with multiprocessing.get_context("fork").Pool(len(shares)) as pool:
            pool.starmap(_write_images, shares)
    tmp = root / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(wanted, indent=1) + "\n")
    tmp.replace(root / MANIFEST_NAME)
    return root


def _write_images(root: Path, spec: JpegSpec, first: int, every: int) -> None:
    """Write images ``first``, ``first + every``, ... of the set."""
    axis = (np.arange(spec.image_size, dtype=np.float32) + 0.5) / spec.image_size
    grid = np.meshgrid(axis, axis, indexing="ij")
    for index in range(first, spec.images, every):
        image = Image.fromarray(_image(spec, index, (grid[0], grid[1])))
        image.save(_image_path(root, spec, index), format="JPEG", quality=spec.quality)


class JpegFolderDataset(Dataset[tuple[torch.Tensor, int]]):
    """Images under ``root/<class>/*.jpg``, decoded with PIL and augmented for training.

    Transform: ``RandomResizedCrop(crop)``, ``RandomHorizontalFlip``, ``ToTensor``, ``Normalize``
    (ImageNet statistics), or ``ToUint8`` in place of the last two. Classes are the sorted
    subdirectory names; labels their indices.

    Args:
        root: Directory with one subdirectory of ``.jpg`` files per class.
        crop: Output side in pixels.
        read_latency_s: Seconds each file read waits before it starts, as a read from network
            storage (NFS, an object store) does; 0 reads the local disk as it is.
        uint8: End in ``lightning_maxtp.data.ToUint8()`` instead of ``ToTensor``/``Normalize``
            (normalizing is left to ``DeviceTransform`` on the device).
    """

    def __init__(
        self,
        root: Path | str,
        crop: int = 128,
        read_latency_s: float = 0.0,
        *,
        uint8: bool = False,
    ) -> None:
        if read_latency_s < 0:
            raise ValueError(f"read_latency_s must be >= 0 seconds, got {read_latency_s!r}")
        self.read_latency_s = read_latency_s
        self.root = Path(root)
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        self.samples = [
            (path, label)
            for label, name in enumerate(self.classes)
            for path in sorted((self.root / name).glob("*.jpg"))
        ]
        if not self.samples:
            raise FileNotFoundError(f"no class_*/*.jpg files under {self.root}")
        tail = [ToUint8()] if uint8 else [transforms.ToTensor(), transforms.Normalize(_MEAN, _STD)]
        self.transform = transforms.Compose(
            [
                transforms.RandomResizedCrop(crop, antialias=True),
                transforms.RandomHorizontalFlip(),
                *tail,
            ]
        )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        if self.read_latency_s:
            time.sleep(self.read_latency_s)
        with Image.open(path) as image:
            tensor = self.transform(image.convert("RGB"))
        return tensor, label


class ImageClassifier(ClassifierModule):
    """A torchvision classification model (random init) trained with cross-entropy.

    Args:
        model_name: A torchvision model name (``resnet18``, ``resnet50``, ``mobilenet_v3_small``,
            ...), built with ``weights=None``.
        num_classes: Size of the output layer.
        optimizer: ``"sgd"``, ``"adamw"`` or ``"adam"``.
        lr: Learning rate.
        channels_last: Put weights and inputs in NHWC memory format (faster convolutions on
            tensor-core GPUs).
    """

    def __init__(
        self,
        model_name: str = "resnet18",
        num_classes: int = 10,
        *,
        optimizer: str = "sgd",
        lr: float = 0.1,
        channels_last: bool = False,
    ) -> None:
        super().__init__(optimizer=optimizer, lr=lr)
        self.channels_last = channels_last
        model = torchvision.models.get_model(model_name, weights=None, num_classes=num_classes)
        self.model = model.to(memory_format=torch.channels_last) if channels_last else model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x)  # type: ignore[no-any-return]
