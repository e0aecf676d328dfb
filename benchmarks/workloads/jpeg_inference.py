"""JPEG inference without lightning: decode to uint8 on the CPU, normalise on the device.

Spawned inference workers import this module, so it imports torch, torchvision and PIL only
(``benchmarks.workloads.jpeg`` pulls in lightning through its training module). Sending uint8
images and normalising on the device is what an expert loop does: a quarter of the bytes
through pinned memory and PCIe, and the float math where it is cheap.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torchvision
from PIL import Image
from torchvision.transforms import functional as TF

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def image_paths(root: Path | str) -> list[str]:
    """Every ``class_*/*.jpg`` under ``root`` (``generate_jpeg_dataset``'s layout), sorted."""
    return sorted(str(p) for p in Path(root).glob("class_*/*.jpg"))


def decode(path: str, size: int = 224) -> torch.Tensor:
    """One JPEG as a ``(3, size, size)`` uint8 tensor: shorter side resized, centre crop."""
    with Image.open(path) as file:
        image = TF.center_crop(TF.resize(file.convert("RGB"), size, antialias=True), size)
    return TF.pil_to_tensor(image)


class Classifier(torch.nn.Module):
    """A torchvision model (random init) that takes uint8 images and normalises them itself."""

    def __init__(self, model_name: str, num_classes: int, channels_last: bool = False) -> None:
        super().__init__()
        self.model = torchvision.models.get_model(model_name, weights=None, num_classes=num_classes)
        self.channels_last = channels_last
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1) * 255)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float() - self.mean) / self.std
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x)  # type: ignore[no-any-return]


def build_classifier(
    model_name: str = "resnet18", num_classes: int = 10, channels_last: bool = False
) -> Classifier:
    """The factory to pass (through ``functools.partial``) to ``BatchInferencePool``."""
    torch.manual_seed(0)
    return Classifier(model_name, num_classes, channels_last).eval()
