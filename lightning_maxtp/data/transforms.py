"""The CPU halves of the faster data paths: a pipeline's last step and a bytes-only dataset.

- ``ToUint8``: the last step of a CPU transform pipeline in place of ``ToTensor()`` and
  ``Normalize``: a ``uint8`` CHW tensor, a quarter of the bytes a worker ships as ``float32``.
- ``EncodedImages``: a dataset that returns each file's encoded bytes and its label, so that
  workers only read; ``collate_encoded`` packs a batch of them into one tensor for the device
  side to decode (``DeviceTransform(decode=True)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_maxtp.data.ops import pack_encoded, to_uint8_chw
from lightning_maxtp.loader.sample_cost import file_samples

if TYPE_CHECKING:
    import torch

__all__ = ["EncodedImages", "ToUint8", "collate_encoded"]


class ToUint8:
    """Transform: a PIL image, an HWC array or a uint8 tensor to a ``uint8`` CHW tensor.

    Put it last in a CPU pipeline, after the geometric transforms (crop, flip), instead of
    ``ToTensor()`` and ``Normalize(...)``; ``DeviceTransform`` does the float conversion and the
    normalization on the device after the batch arrives.

    Example:
        >>> from torchvision import transforms
        >>> pipeline = transforms.Compose([transforms.RandomResizedCrop(224), ToUint8()])
    """

    def __call__(self, image: Any) -> torch.Tensor:
        """``image`` as a uint8 CHW tensor."""
        return to_uint8_chw(image)

    def __repr__(self) -> str:
        return "ToUint8()"


class EncodedImages:
    """A map-style dataset of encoded image files: ``(uint8 bytes tensor, label)`` per sample.

    Workers only read files; decoding and augmenting happen on the device
    (``DeviceTransform(decode=True, crop=...)``). Use ``collate_encoded`` as the DataLoader's
    ``collate_fn``.

    Args:
        source: ``(path, label)`` pairs, or a dataset that lists them in ``samples``
            (torchvision's ``ImageFolder``, for example); its own transforms are not used.

    Raises:
        ValueError: When ``source`` lists no files.
    """

    def __init__(self, source: Any) -> None:
        samples = file_samples(source)
        if samples is None:
            raise ValueError(
                f"`source` must be (path, label) pairs or a dataset with a `samples` list of "
                f"them (ImageFolder), got {type(source).__name__}"
            )
        self.samples: list[tuple[Path, int]] = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import read_file

        path, label = self.samples[index]
        return read_file(str(path)), label


def collate_encoded(batch: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
    """``collate_fn`` for ``EncodedImages``: ``(packed bytes [N, 4 + longest], labels, ...)``.

    The first field of each sample is its encoded file; it is packed with ``pack_encoded``
    (one tensor whose first dimension is the batch); the other fields collate as usual.
    """
    from torch.utils.data import default_collate

    if not batch:
        raise ValueError("`batch` is empty: collate_encoded needs at least one sample")
    packed = pack_encoded([sample[0] for sample in batch])
    rest = default_collate([tuple(sample[1:]) for sample in batch])
    return (packed, *rest)
