"""Tensor operations of the faster data paths: pure torch (and torchvision for decode and crops).

The CPU half ends a pipeline in a ``uint8`` CHW tensor (``to_uint8_chw``); the device half turns
a batch of them into normalized floats (``normalize_uint8``), flips at random (``random_flip``),
decodes packed JPEG bytes (``pack_encoded``, ``decode_packed``) and crops them
(``random_resized_crops``, ``center_crops``). Nothing here knows about Lightning.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "HEADER_BYTES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "center_crops",
    "channel_stats",
    "decode_packed",
    "normalize_uint8",
    "pack_encoded",
    "random_flip",
    "random_resized_crops",
    "to_uint8_chw",
    "unpack_encoded",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HEADER_BYTES = 4
"""Each packed row starts with its payload's length, a little-endian ``int32``."""
_JPEG_MAGIC = (0xFF, 0xD8)


def to_uint8_chw(image: Any) -> torch.Tensor:
    """A PIL image, an HWC/HW ``numpy`` array or a uint8 tensor as a ``uint8`` CHW tensor.

    No float conversion and no copy beyond the one PIL or numpy needs: the batch crosses from
    the worker at one byte a pixel, a quarter of ``float32``.

    Raises:
        ValueError: For another type or a tensor that is not ``uint8``.
    """
    import numpy as np
    import torch

    if isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8:
            raise ValueError(
                f"`image` must be uint8 to ship as uint8, got a {image.dtype} tensor; end the CPU "
                "pipeline before ToTensor()/Normalize()"
            )
        return image if image.dim() == 3 else image.unsqueeze(0)
    if hasattr(image, "getbands"):  # PIL, without importing it for tensors and arrays
        image = np.asarray(image)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise ValueError(f"`image` must be a uint8 array, got {image.dtype}")
        array = image[:, :, None] if image.ndim == 2 else image
        return torch.from_numpy(np.array(array.transpose(2, 0, 1), order="C"))
    raise ValueError(
        f"`image` must be a PIL image, a numpy array or a uint8 tensor, got {type(image).__name__}"
    )


def channel_stats(
    mean: Sequence[float], std: Sequence[float], device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mean`` and ``std`` as ``[1, C, 1, 1]`` float32 tensors on ``device``.

    Made once per device by the caller: building them per batch would copy host memory to the
    GPU, a synchronous copy, on every step.
    """
    import torch

    shape = (1, len(mean), 1, 1)
    m = torch.tensor(mean, dtype=torch.float32).view(shape).to(device)
    s = torch.tensor(std, dtype=torch.float32).view(shape).to(device)
    return m, s


def normalize_uint8(
    images: torch.Tensor,
    mean: Sequence[float] | torch.Tensor = IMAGENET_MEAN,
    std: Sequence[float] | torch.Tensor = IMAGENET_STD,
) -> torch.Tensor:
    """``(images / 255 - mean) / std`` in ``float32`` for a ``uint8`` NCHW batch, on its device.

    The same arithmetic as ``ToTensor()`` then ``Normalize(mean, std)``, one fused expression on
    the whole batch; the memory format (e.g. ``channels_last``) of ``images`` is kept. ``mean``
    and ``std`` may be ``channel_stats`` tensors already on the device.
    """
    import torch

    channels = images.shape[1]
    sizes = [v.numel() if isinstance(v, torch.Tensor) else len(v) for v in (mean, std)]
    if sizes != [channels, channels]:
        raise ValueError(
            f"`mean` and `std` need one value per channel ({channels}), got {sizes[0]} and "
            f"{sizes[1]}"
        )
    if not isinstance(mean, torch.Tensor) or not isinstance(std, torch.Tensor):
        mean, std = channel_stats(list(mean), list(std), images.device)
    return images.float().div_(255).sub_(mean).div_(std)


def random_flip(images: torch.Tensor, p: float = 0.5) -> torch.Tensor:
    """Each image of an NCHW batch mirrored left-right with probability ``p`` (device RNG)."""
    import torch

    flip = torch.rand(images.shape[0], device=images.device) < p
    return torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)


def pack_encoded(payloads: Sequence[torch.Tensor]) -> torch.Tensor:
    """Encoded files (1-D ``uint8`` tensors) as one ``uint8`` tensor of shape ``[N, 4 + longest]``.

    Row ``i`` is the length of payload ``i`` (4 bytes, little-endian) then its bytes, zero
    padded. One plain tensor whose first dimension is the batch: it collates, pins, crosses
    from workers in shared memory and counts samples like any other batch.
    """
    import torch

    longest = max((int(p.numel()) for p in payloads), default=0)
    packed = torch.zeros((len(payloads), HEADER_BYTES + longest), dtype=torch.uint8)
    sizes = torch.tensor([int(p.numel()) for p in payloads], dtype=torch.int64)
    shifts = torch.arange(HEADER_BYTES, dtype=torch.int64) * 8
    packed[:, :HEADER_BYTES] = ((sizes[:, None] >> shifts) & 0xFF).to(torch.uint8)
    for row, payload in zip(packed, payloads, strict=True):
        row[HEADER_BYTES : HEADER_BYTES + payload.numel()] = payload
    return packed


def unpack_encoded(packed: torch.Tensor) -> list[torch.Tensor]:
    """The payloads of ``pack_encoded``'s tensor (views on the CPU, no copy).

    Raises:
        ValueError: When ``packed`` is not a 2-D uint8 CPU tensor or a length does not fit.
    """
    import torch

    if packed.dim() != 2 or packed.dtype != torch.uint8 or packed.device.type != "cpu":
        raise ValueError(
            "packed encoded images must be a 2-D uint8 CPU tensor from `pack_encoded` "
            f"(collate_encoded), got {packed.dim()}-D {packed.dtype} on {packed.device}"
        )
    shifts = torch.arange(HEADER_BYTES, dtype=torch.int64) * 8
    sizes = (packed[:, :HEADER_BYTES].to(torch.int64) << shifts).sum(1).tolist()
    room = packed.shape[1] - HEADER_BYTES
    out = []
    for i, n in enumerate(sizes):
        if not 0 < n <= room:
            raise ValueError(
                f"row {i} of the packed images says {n} bytes but holds {room}: the batch was "
                "not made by `collate_encoded`"
            )
        out.append(packed[i, HEADER_BYTES : HEADER_BYTES + n])
    return out


def decode_packed(packed: torch.Tensor, device: torch.device | str) -> list[torch.Tensor]:
    """Decode a packed batch to RGB ``uint8`` CHW images on ``device``.

    JPEGs go to ``torchvision.io.decode_jpeg(..., device=device)`` in one call (nvJPEG on a CUDA
    device, libjpeg on the CPU); other formats (PNG...) are decoded on the CPU and moved.
    """
    import torch
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    payloads = unpack_encoded(packed)
    device = torch.device(device)
    jpeg = [i for i, p in enumerate(payloads) if tuple(p[:2].tolist()) == _JPEG_MAGIC]
    images: list[torch.Tensor | None] = [None] * len(payloads)
    if jpeg:
        batch = [payloads[i] for i in jpeg]
        if device.type == "cuda":
            decoded = _decode_on_own_stream(batch, device)
        else:
            decoded = decode_jpeg(batch, mode=ImageReadMode.RGB, device=device)
        for i, done in zip(jpeg, decoded, strict=True):
            images[i] = done
    for i, image in enumerate(images):
        if image is None:
            images[i] = decode_image(payloads[i], mode=ImageReadMode.RGB).to(device)
    return [image for image in images if image is not None]


_DECODE_STREAMS: dict[int, Any] = {}
"""One side stream per CUDA device for nvJPEG (created on first use)."""


def _decode_on_own_stream(payloads: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Decode with nvJPEG on a stream of its own; hand its images over to the current stream.

    nvJPEG's hardware decoder writes its outputs without waiting for the work already queued on
    the stream it is given, and those outputs come from the caching allocator, which hands out
    a block as soon as it is freed on that stream: a block the previous step's queued kernels
    may still read, so the step computes on overwritten memory (wrong numbers, NaNs). On a
    stream of its own the decoder's blocks come from that stream's pool, which no step kernel
    reads; the current stream then waits for the decode, and each image is recorded on it so
    that its block is not reused before the step is done with it.
    """
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    index = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    side = _DECODE_STREAMS.get(index)
    if side is None:
        side = _DECODE_STREAMS[index] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    current = torch.cuda.current_stream(device)
    with torch.cuda.stream(side):
        decoded = decode_jpeg(payloads, mode=ImageReadMode.RGB, device=device)
    current.wait_stream(side)
    for image in decoded:
        image.record_stream(current)
    return list(decoded)


def _crop_box(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """``RandomResizedCrop``'s box (top, left, height, width), drawn with Python's RNG."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    # Fallback to a central crop, as torchvision does.
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_resized_crops(
    images: Sequence[torch.Tensor],
    size: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> torch.Tensor:
    """``RandomResizedCrop(size)`` of each CHW image, stacked as one NCHW batch on their device.

    Each image gets its own box (the rule of ``torchvision.transforms.v2.RandomResizedCrop``)
    and is resized with antialiasing by ``torchvision.transforms.v2.functional.resized_crop``.
    """
    import torch
    from torchvision.transforms.v2 import functional as F

    crops = []
    for image in images:
        top, left, h, w = _crop_box(int(image.shape[-2]), int(image.shape[-1]), scale, ratio)
        crops.append(F.resized_crop(image, top, left, h, w, [size, size], antialias=True))
    return torch.stack(crops)


def center_crops(
    images: Sequence[torch.Tensor], size: int, resize: int | None = None
) -> torch.Tensor:
    """Each CHW image resized (shorter side ``resize``, default ``size``), center-cropped."""
    import torch
    from torchvision.transforms.v2 import functional as F

    side = [resize or size]
    return torch.stack(
        [F.center_crop(F.resize(image, side, antialias=True), [size, size]) for image in images]
    )
