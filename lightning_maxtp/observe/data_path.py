"""Which data path fits when even the best loader cannot feed the device: the rule, with numbers.

Three changes to the user's pipeline (``lightning_maxtp.data``), never made by the library itself
because they change what the dataset returns:

- ``uint8_to_device``: workers ship uint8 pixels (a quarter of float32's bytes) and skip the
  float conversion and normalize, which run on the device. Fits when batches cross as float
  images and decoding is not most of a sample's time.
- ``gpu_decode``: workers only read files; decode and crop run on the GPU (nvJPEG). Fits when
  decoding is most of a sample's time, the files are JPEGs and the device is a CUDA GPU.
- ``pre_encode``: decode and resize once (LitData); each epoch reads pixels. Fits when decoding
  dominates without a GPU to move it to, or when batches already cross as uint8.

Pure: plain numbers in, a ``DataPathAdvice`` out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lightning_maxtp._units import format_bytes

__all__ = ["DECODE_DOMINATES", "DataFacts", "DataPathAdvice", "advise_data_path"]

DECODE_DOMINATES = 0.5
"""Decode's share of a sample's loader time from which only moving the decode helps enough."""

HOW = {
    "uint8_to_device": (
        "end the CPU transforms with lightning_maxtp.data.ToUint8() instead of ToTensor() and "
        "Normalize(), and add DeviceTransform(mean, std) to the Trainer's callbacks"
    ),
    "gpu_decode": (
        "wrap the files in lightning_maxtp.data.EncodedImages with collate_fn=collate_encoded, "
        "and add DeviceTransform(decode=True, crop=...) to the Trainer's callbacks"
    ),
    "pre_encode": (
        "run lightning_maxtp.data.pre_encode(dataset, dir) once (LitData) and train on "
        "open_pre_encoded(dir, transform=<random crop and flip>)"
    ),
}
"""What each path asks of the user, in one sentence."""
NAMES = {
    "uint8_to_device": "uint8 to the device",
    "gpu_decode": "GPU decode",
    "pre_encode": "pre-encode",
}


@dataclass(frozen=True)
class DataFacts:
    """What the loader ships and what a sample costs it (``None``: not measured).

    Attributes:
        sample_bytes: Tensor bytes per sample in a batch as the loader delivers it.
        pixel_dtype: Dtype of the batch's largest 4-D tensor (``"float32"``, ``"uint8"``...).
        per_sample_s: Seconds of one ``dataset[i]`` in one process.
        decode_s: Seconds to read and decode one sample's file.
        files: The files' format (``"jpeg"``, ``"png"``...) when the dataset lists them.
        unmeasured: Why a sample's cost was not measured, when it failed (a note).
    """

    sample_bytes: int | None = None
    pixel_dtype: str | None = None
    per_sample_s: float | None = None
    decode_s: float | None = None
    files: str | None = None
    unmeasured: str | None = None

    @property
    def decode_share(self) -> float | None:
        """Decode's share of a sample's time, when both were measured."""
        if self.decode_s is None or not self.per_sample_s:
            return None
        return min(1.0, self.decode_s / self.per_sample_s)

    @property
    def float_images(self) -> bool:
        """Whether batches cross as floating-point images."""
        return self.pixel_dtype is not None and self.pixel_dtype.startswith(("float", "bfloat"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {**asdict(self), "decode_share": self.decode_share}


@dataclass(frozen=True)
class DataPathAdvice:
    """The data path that fits, why (with the measured numbers) and the others.

    Attributes:
        path: ``"uint8_to_device"``, ``"gpu_decode"`` or ``"pre_encode"``.
        reason: The numbers behind the choice.
        alternatives: The other paths that apply, each with when it would fit.
        shortfall: Share of the device's rate the best loader misses.
        facts: What was measured.
    """

    path: str
    reason: str
    alternatives: tuple[str, ...]
    shortfall: float
    facts: DataFacts

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "path": self.path,
            "reason": self.reason,
            "alternatives": list(self.alternatives),
            "shortfall": self.shortfall,
            "facts": self.facts.to_dict(),
        }

    def lines(self) -> tuple[str, ...]:
        """The advice as recommendation sentences: the choice first, then the alternatives."""
        first = f"data path: {NAMES[self.path]} ({self.reason}): {HOW[self.path]}"
        return (first, *self.alternatives)

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _kib(nbytes: int) -> str:
    return format_bytes(nbytes, unit="KiB", digits=0)


def _cost_text(facts: DataFacts) -> str:
    share = facts.decode_share
    if share is None or facts.per_sample_s is None or facts.decode_s is None:
        return "decode share not measurable (the dataset lists no files)"
    return (
        f"decoding is {share:.0%} of a sample's {facts.per_sample_s * 1e3:.2f} ms "
        f"({facts.decode_s * 1e3:.2f} ms)"
    )


def advise_data_path(
    facts: DataFacts, *, device_rate: float, loader_rate: float, device_type: str
) -> DataPathAdvice | None:
    """The path that fits a loader short of the device's rate (``None``: not short).

    Args:
        facts: What the loader ships and what a sample costs.
        device_rate: Samples/s the device consumes with data ready.
        loader_rate: Samples/s the best loader setting delivers.
        device_type: ``"cuda"``, ``"cpu"``...: GPU decode needs ``"cuda"``.
    """
    if not (device_rate > 0 and 0 <= loader_rate < device_rate):
        return None
    shortfall = 1.0 - loader_rate / device_rate
    short = (
        f"the best loader gives {loader_rate:.0f} samples/s, {shortfall:.0%} short of the "
        f"device's {device_rate:.0f}"
    )
    share = facts.decode_share
    jpeg_gpu = device_type == "cuda" and facts.files == "jpeg"
    shipped = ""
    if facts.sample_bytes is not None and facts.pixel_dtype is not None:
        shipped = f"workers ship {_kib(facts.sample_bytes)} a sample as {facts.pixel_dtype}"
    if share is not None and share >= DECODE_DOMINATES:
        path = "gpu_decode" if jpeg_gpu else "pre_encode"
        why = "only decoding elsewhere helps" if jpeg_gpu else "only decoding once helps"
        if not jpeg_gpu and device_type == "cuda":
            why += f" (GPU decode needs JPEG files, these are {facts.files})"
        reason = f"{short}; {_cost_text(facts)}: {why}"
    elif facts.float_images:
        path = "uint8_to_device"
        quarter = _kib(max(1, (facts.sample_bytes or 0) // 4))
        reason = f"{short}; {shipped}, uint8 would be {quarter}; {_cost_text(facts)}"
        if share is not None:
            reason += ", so most of it is cropping, converting, normalizing and shipping"
        reason += "; the float conversion and normalize move to the device"
    else:
        path = "pre_encode"
        reason = f"{short}; {shipped or 'batches are not float images'}; {_cost_text(facts)}"
        reason += ": resizing and decoding once leaves workers only the random crop"
    alternatives = []
    if path != "uint8_to_device" and facts.float_images:
        alternatives.append(f"also: uint8 to the device ({shipped}): {HOW['uint8_to_device']}")
    if path != "gpu_decode" and jpeg_gpu:
        alternatives.append(
            f"or: GPU decode, which takes the decode off the CPUs ({_cost_text(facts)}): "
            f"{HOW['gpu_decode']}"
        )
    if path != "pre_encode":
        alternatives.append(
            f"or: pre-encode once, when the data set is read for several epochs: "
            f"{HOW['pre_encode']}"
        )
    return DataPathAdvice(path, reason, tuple(alternatives), shortfall, facts)
