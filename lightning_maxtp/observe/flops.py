"""How far a step is from the device's limit: FLOPs counted once, utilization against a peak.

``count_flops`` runs one step (forward and backward) under torch's ``FlopCounterMode``, which
counts the matmuls, convolutions and attention that dominate a model's work, the way
Lightning's ``measure_flops`` does. ``utilization`` divides the FLOP/s a window achieved by
the peak measured on this device for the dtype in force (``resources.peak``): model FLOPs
utilization (MFU). A value above 1.0 is not a utilization but a counting or peak error, and is
reported as such with both numbers, never printed as "104 %".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Utilization",
    "conv_backward_flops",
    "conv_flops",
    "count_flops",
    "counted_conv_flops",
    "dtype_in_force",
    "flop_counter",
    "share_text",
    "utilization",
]


def count_flops(step: Callable[[], Any]) -> int:
    """FLOPs of one call of ``step`` (a forward and a backward), by ``flop_counter``."""
    counter = flop_counter()
    with counter:
        step()
    return int(counter.get_total_flops())


def flop_counter() -> Any:
    """Make torch's ``FlopCounterMode`` (no display), its convolution backward counted per group.

    Torch's own formula counts a grouped convolution's weight gradient as if the convolution
    were dense: ``groups`` times too many (65x the forward for a 64-channel depthwise 3x3 where
    a dense backward is 2x), so MobileNet, EfficientNet and ConvNeXt read more FLOP/s than
    the device's peak. Each gradient of a convolution makes the forward's multiply-adds again,
    one per (output position, weight element, sample): the backward is the forward's count
    once for the input's gradient and once for the weight's, each when asked for.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    backward = torch.ops.aten.convolution_backward
    return FlopCounterMode(display=False, custom_mapping={backward: conv_backward_flops})


def counted_conv_flops(counter: Any) -> int:
    """FLOPs a ``flop_counter`` counted in convolutions (forward and backward).

    They run in cuDNN, whose TF32 switch (``torch.backends.cudnn.allow_tf32``, on by default)
    is not the matmuls' (``set_float32_matmul_precision``): the peak they are measured against
    differs from the matmuls' in fp32.
    """
    counts = counter.get_flop_counts().get("Global", {})
    return int(sum(n for op, n in counts.items() if "convolution" in str(op)))


def conv_flops(x_shape: Any, w_shape: Any, out_shape: Any, transposed: bool) -> int:
    """A convolution's FLOPs (2 per multiply-add), groups included.

    ``w_shape[1]`` is the input channels per group; a transposed convolution runs over the
    input's positions.
    """
    batch, spatial = int(x_shape[0]), (x_shape if transposed else out_shape)[2:]
    c_out, c_in, *kernel = w_shape
    per_position = int(c_out) * int(c_in) * int(math.prod(kernel))
    return 2 * batch * per_position * int(math.prod(spatial))


def conv_backward_flops(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """``aten.convolution_backward``'s FLOPs, from the shapes ``FlopCounterMode`` passes.

    Its arguments: grad_output, input, weight, bias sizes, stride, padding, dilation,
    transposed, output padding, groups, output mask.
    """
    grad_out_shape, x_shape, w_shape = args[:3]
    transposed, output_mask = bool(args[7]), args[10]
    forward = conv_flops(x_shape, w_shape, grad_out_shape, transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def dtype_in_force(precision: str | None, *, tf32: bool = False) -> str:
    """The peak's dtype for Lightning's ``precision`` (``tf32``: fp32 matmuls may use TF32)."""
    text = str(precision or "32-true")
    if text.startswith("bf16"):
        return "bf16"
    if text.startswith("16"):
        return "fp16"
    return "tf32" if tf32 else "fp32"


@dataclass(frozen=True)
class Utilization:
    """A window's achieved FLOP/s against the measured peak of the dtype in force."""

    flops_per_s: float
    peak_flops_per_s: float
    dtype: str

    @property
    def mfu(self) -> float | None:
        """Achieved over peak (0..1); ``None`` when it would exceed 1 (``error``)."""
        value = self.flops_per_s / self.peak_flops_per_s if self.peak_flops_per_s > 0 else None
        return None if value is None or value > 1.0 else value

    @property
    def error(self) -> str | None:
        """Why no MFU can be given: more FLOP/s than the peak, or no peak."""
        if self.peak_flops_per_s <= 0:
            return f"no measured {self.dtype} peak"
        if self.flops_per_s > self.peak_flops_per_s:
            return (
                f"{self.flops_per_s / 1e12:,.3f} TFLOP/s counted is more than the measured "
                f"{self.dtype} peak of {self.peak_flops_per_s / 1e12:,.3f}: the FLOP count or "
                "the peak is wrong"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "flops_per_s": self.flops_per_s,
            "peak_flops_per_s": self.peak_flops_per_s,
            "dtype": self.dtype,
            "mfu": self.mfu,
            "error": self.error,
        }

    def __str__(self) -> str:
        mfu = self.mfu
        if mfu is None:
            return f"MFU unknown: {self.error}"
        return f"at {share_text(mfu)} of this device's measured {self.dtype} peak"

    def short(self) -> str:
        """``MFU 38 % (bf16)``, or why there is none in a few words."""
        mfu = self.mfu
        if mfu is not None:
            return f"MFU {share_text(mfu)} ({self.dtype})"
        if self.peak_flops_per_s <= 0:
            return f"MFU ? (no {self.dtype} peak)"
        return f"MFU ? (FLOP count above the {self.dtype} peak)"


def share_text(share: float) -> str:
    """A share as a percentage, with a decimal below 10 % (``0.4%``, not ``0%``)."""
    return f"{share:.0%}" if share >= 0.095 else f"{share:.1%}"


def utilization(
    flops_per_sample: float, samples_per_s: float, peak_flops_per_s: float, dtype: str
) -> Utilization:
    """The utilization of a window that ran ``samples_per_s`` at ``flops_per_sample`` each.

    Raises:
        ValueError: For a negative FLOP count or rate.
    """
    if flops_per_sample < 0 or samples_per_s < 0:
        raise ValueError(
            f"`flops_per_sample` and `samples_per_s` must be >= 0, got {flops_per_sample} and "
            f"{samples_per_s}"
        )
    return Utilization(flops_per_sample * samples_per_s, peak_flops_per_s, dtype)
