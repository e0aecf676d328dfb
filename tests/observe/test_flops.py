"""FLOPs counted once, and MFU against the measured peak (never above 100 %)."""

from __future__ import annotations

import itertools
import statistics
import time

import pytest
import torch

from lightning_maxtp.observe.flops import count_flops, dtype_in_force, utilization
from lightning_maxtp.resources.peak import measure_peak


def test_the_flops_of_a_linear_stack_match_the_formula() -> None:
    batch, sizes = 16, (32, 64, 8)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(batch, sizes[0])

    counted = count_flops(lambda: net(x).sum().backward())

    matmul = [2 * batch * a * b for a, b in itertools.pairwise(sizes)]  # forward, per layer
    # Backward: each layer's weight gradient, and the input gradient of all but the first (its
    # input, the batch, needs none).
    assert counted == sum(matmul) + sum(matmul) + sum(matmul[1:])


@pytest.mark.parametrize(
    ("precision", "tf32", "dtype"),
    [("bf16-mixed", False, "bf16"), ("16-mixed", False, "fp16"), ("32-true", True, "tf32"),
     (None, False, "fp32"), ("bf16-true", True, "bf16")],
)  # fmt: skip
def test_the_peak_is_read_for_the_dtype_in_force(
    precision: str | None, tf32: bool, dtype: str
) -> None:
    assert dtype_in_force(precision, tf32=tf32) == dtype


def test_more_flops_than_the_peak_is_flagged_never_printed_above_100_percent() -> None:
    fine = utilization(1e9, 50.0, 100e9, "fp32")
    assert fine.mfu == pytest.approx(0.5) and fine.error is None
    assert str(fine) == "at 50% of this device's measured fp32 peak"
    wrong = utilization(1e9, 120.0, 100e9, "bf16")  # 120 GFLOP/s against a 100 GFLOP/s peak
    assert wrong.mfu is None
    assert (
        wrong.error is not None
        and "0.120 TFLOP/s counted is more than the measured bf16 peak" in wrong.error
    )
    assert "%" not in str(wrong) and wrong.to_dict()["mfu"] is None
    assert utilization(1e9, 1.0, 0.0, "fp16").error == "no measured fp16 peak"
    with pytest.raises(ValueError, match=r"`flops_per_sample` and `samples_per_s` must be >= 0"):
        utilization(-1.0, 1.0, 1.0, "fp32")


@pytest.mark.serial  # a rate against a measured peak: the machine to itself
def test_a_matmul_heavy_cpu_job_runs_between_5_and_100_percent_of_the_measured_peak() -> None:
    net = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(3)))
    x = torch.randn(256, 1024)

    def step() -> None:
        net(x).sum().backward()

    def peak() -> float:
        rate = measure_peak("cpu", cache=False, seconds_per_size=0.05).rate("fp32")
        assert rate is not None
        return rate

    flops = count_flops(step)
    step()  # warm-up
    # The peak before and after the job, the best kept, and the job's median step: a moment of
    # noise on a shared runner slows one or the other, and the peak is the device's best.
    best, times = peak(), []
    for _ in range(6):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    best = max(best, peak())
    util = utilization(flops / 256, 256 / statistics.median(times), best, "fp32")
    assert util.mfu is not None and 0.05 < util.mfu <= 1.0, util


def test_fp32_convolutions_on_cuda_are_measured_against_cudnns_tf32_peak() -> None:
    # cuDNN runs fp32 convolutions as TF32 by default while the matmuls stay fp32: a conv net
    # divided by the fp32 peak alone reads above 100 %. Each share takes its own peak's time.
    from lightning_maxtp.observe import JobContext

    peaks = (("fp32", 67e12), ("tf32", 494e12))
    ctx = JobContext(
        device_type="cuda", precision="32-true", tf32=False, tf32_conv=True, peaks=peaks,
        flops_per_sample=1e9, conv_flop_share=0.9,
    )  # fmt: skip
    got = ctx.utilization_at(100_000)  # 100 TFLOP/s counted: above the fp32 peak
    assert got is not None and got.mfu is not None
    mixed = 1 / (0.9 / 494e12 + 0.1 / 67e12)
    assert got.peak_flops_per_s == pytest.approx(mixed)
    assert got.dtype == "tf32 convolutions (90% of the FLOPs), fp32 matmuls"
    # Both switches alike, or no FLOP split: the one peak, as before.
    same = JobContext(device_type="cuda", precision="32-true", tf32=True, tf32_conv=True,
                      peaks=peaks, flops_per_sample=1e9, conv_flop_share=0.9)  # fmt: skip
    assert same.utilization_at(1.0).dtype == "tf32"  # type: ignore[union-attr]
    blind = JobContext(device_type="cuda", precision="32-true", tf32=False, tf32_conv=True,
                       peaks=peaks, flops_per_sample=1e9)  # fmt: skip
    assert blind.utilization_at(1.0).dtype == "fp32"  # type: ignore[union-attr]


def test_the_convolutions_share_of_a_counted_step() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from lightning_maxtp.observe.flops import counted_conv_flops

    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.Flatten(), torch.nn.Linear(16 * 14 * 14, 10)
    )
    counter = FlopCounterMode(display=False)
    with counter:
        net(torch.randn(2, 3, 16, 16)).sum().backward()
    total, conv = counter.get_total_flops(), counted_conv_flops(counter)
    # forward 2 x (16 x 27 x 196) x 2 FLOPs for the convolution, 2 x 3136 x 10 x 2 for the
    # linear; their backwards (the conv's input needs no gradient: weight only) likewise.
    assert 0 < conv < total
    assert conv == 2 * (2 * 16 * 27 * 196 * 2)


@pytest.mark.parametrize("groups", [1, 4, 64])
def test_a_grouped_convolutions_backward_is_twice_its_forward(groups: int) -> None:
    # torch's own formula counts the weight gradient of a grouped (depthwise) convolution as if
    # it were dense: 65x the forward for 64 channels. By hand: 2 FLOPs per multiply-add, one
    # per output position, weight element and sample, in the forward and in each gradient.
    conv = torch.nn.Conv2d(64, 64, 3, padding=1, groups=groups)
    x = torch.randn(2, 64, 56, 56, requires_grad=True)
    by_hand = 2 * 2 * 64 * (64 // groups) * 9 * 56 * 56
    forward = count_flops(lambda: conv(x))
    assert forward == by_hand
    both = count_flops(lambda: conv(x).sum().backward())
    assert both == 3 * by_hand  # forward, input gradient, weight gradient
    x.requires_grad_(False)
    assert count_flops(lambda: conv(x).sum().backward()) == 2 * by_hand  # weight gradient only


def test_mobilenet_reads_about_three_forwards_not_thirty() -> None:
    # The case the false MFU was found on: torch's own count made mobilenet_v3_small's forward
    # and backward ~35x its forward (3.90 GFLOP a sample at 224 px against 0.11).
    from torch.utils.flop_counter import FlopCounterMode

    torchvision = pytest.importorskip("torchvision")
    net = torchvision.models.mobilenet_v3_small()
    x = torch.randn(1, 3, 224, 224)
    forward = count_flops(lambda: net(x))
    ours = count_flops(lambda: net(x).sum().backward())
    with FlopCounterMode(display=False) as dense:
        net(x).sum().backward()
    assert 2.5 * forward < ours < 3.0 * forward  # the first conv's input needs no gradient
    assert dense.get_total_flops() > 30 * forward
