"""``DeviceTransform``: the device half of a data pipeline, added to a fit as a callback.

A callback, not a mixin: the user adds it to ``Trainer(callbacks=[...])`` and changes neither
the LightningModule's class nor its ``training_step``. At ``setup`` it adds steps to the batch
hooks Lightning calls (the DataModule's when it overrides them, else the module's; see
``hooks``), and takes them away at ``teardown`` or on an exception:

- ``on_before_batch_transfer`` (``decode=True``): each packed batch of encoded files from
  ``collate_encoded`` is decoded straight onto the device (nvJPEG on CUDA, libjpeg on the CPU)
  and cropped there: ``RandomResizedCrop`` while training, resize and center crop otherwise.
- ``on_after_batch_transfer``: each ``uint8`` NCHW tensor becomes ``float32``, scaled by 1/255
  and normalized by ``mean``/``std``; with ``flip=True`` it is also mirrored at random while
  training. Other tensors (labels, masks that are not uint8 4-D) pass unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Callback

from lightning_maxtp.data.hooks import add_batch_step, hook_owner, remove_batch_step
from lightning_maxtp.data.ops import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    center_crops,
    channel_stats,
    decode_packed,
    normalize_uint8,
    random_flip,
    random_resized_crops,
)

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

__all__ = ["DeviceTransform"]

log = logging.getLogger(__name__)

_DECODE = "lightning_maxtp.decode"
_NORMALIZE = "lightning_maxtp.normalize"
STEP_ORDER = 0
"""Before other steps on the same hook (the channels_last knob converts the floats made here)."""


def _check(
    mean: Sequence[float], std: Sequence[float], decode: bool, crop: int | None, eval_resize: int
) -> None:
    if len(mean) != len(std) or not mean:
        raise ValueError(
            f"`mean` and `std` need the same number of channels, got {len(mean)} and {len(std)}"
        )
    if any(s <= 0 for s in std):
        raise ValueError(f"`std` must be > 0 for every channel, got {tuple(std)}")
    if decode and (crop is None or crop < 1):
        raise ValueError(
            f"`crop` must be the output side in pixels (e.g. 224) when `decode=True`, got {crop!r}"
        )
    if crop is not None and eval_resize < crop:
        raise ValueError(f"`eval_resize` must be >= `crop` ({crop}), got {eval_resize}")


class DeviceTransform(Callback):
    """Normalize (and optionally decode, crop and flip) image batches on the training device.

    Pair it with ``ToUint8()`` at the end of the dataset's CPU transforms (workers ship uint8)
    or with ``EncodedImages`` and ``collate_encoded`` and ``decode=True`` (workers only read
    files). The tensors ``training_step`` receives match the CPU pipeline's ``ToTensor()`` then
    ``Normalize(mean, std)`` within float rounding.

    Args:
        mean: Per-channel mean of ``Normalize`` (ImageNet's by default).
        std: Per-channel standard deviation of ``Normalize``.
        flip: Mirror each training image left-right with probability 0.5 on the device.
        decode: Decode packed encoded batches (``collate_encoded``) on the device.
        crop: Output side after decoding (``RandomResizedCrop(crop)`` while training).
        scale: ``RandomResizedCrop``'s area range.
        ratio: ``RandomResizedCrop``'s aspect-ratio range.
        eval_resize: Shorter side before the center crop outside training (default
            ``crop * 8 / 7``, ImageNet's 256 for 224).

    Raises:
        ValueError: For mismatched ``mean``/``std``, or ``decode=True`` without a ``crop``.
    """

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        *,
        flip: bool = False,
        decode: bool = False,
        crop: int | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        eval_resize: int | None = None,
    ) -> None:
        resize = eval_resize if eval_resize is not None else round((crop or 0) * 8 / 7)
        _check(mean, std, decode, crop, resize)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.flip, self.decode, self.crop = flip, decode, crop
        self.scale, self.ratio, self.eval_resize = scale, ratio, resize
        self.batches = {"decoded": 0, "normalized": 0}
        """Batches each step has handled, for reports and tests."""
        self._owners: list[tuple[Any, str, str]] = []

    def _training(self, trainer: pl.Trainer) -> bool:
        return bool(trainer.training)

    def _decode(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Any:
        import torch
        from lightning_utilities.core.apply_func import apply_to_collection

        assert self.crop is not None

        def one(packed: torch.Tensor) -> torch.Tensor:
            if packed.dim() != 2 or packed.dtype != torch.uint8:
                return packed
            images = decode_packed(packed, pl_module.device)
            self.batches["decoded"] += 1
            if self._training(trainer):
                return random_resized_crops(images, self.crop or 0, self.scale, self.ratio)
            return center_crops(images, self.crop or 0, self.eval_resize)

        return lambda batch: apply_to_collection(batch, torch.Tensor, one)

    def _normalize(self, trainer: pl.Trainer) -> Any:
        import torch
        from lightning_utilities.core.apply_func import apply_to_collection

        stats: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

        def one(images: torch.Tensor) -> torch.Tensor:
            if images.dim() != 4 or images.dtype != torch.uint8:
                return images
            if self.flip and self._training(trainer):
                images = random_flip(images)
            self.batches["normalized"] += 1
            if images.device not in stats:  # once per device: no host-to-device copy per step
                stats[images.device] = channel_stats(self.mean, self.std, images.device)
            mean, std = stats[images.device]
            return normalize_uint8(images, mean, std)

        return lambda batch: apply_to_collection(batch, torch.Tensor, one)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Add the steps to the batch hooks Lightning will call."""
        self._remove()
        if self.decode:
            owner = hook_owner(trainer, "on_before_batch_transfer")
            add_batch_step(
                owner,
                "on_before_batch_transfer",
                _DECODE,
                self._decode(trainer, pl_module),
                STEP_ORDER,
            )
            self._owners.append((owner, "on_before_batch_transfer", _DECODE))
        owner = hook_owner(trainer, "on_after_batch_transfer")
        add_batch_step(
            owner, "on_after_batch_transfer", _NORMALIZE, self._normalize(trainer), STEP_ORDER
        )
        self._owners.append((owner, "on_after_batch_transfer", _NORMALIZE))

    def _remove(self) -> None:
        for owner, hook, name in self._owners:
            remove_batch_step(owner, hook, name)
        self._owners.clear()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Take the steps away: the module's hooks are its own again."""
        self._remove()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Lightning does not call ``teardown`` after an exception: take the steps away here."""
        self._remove()
